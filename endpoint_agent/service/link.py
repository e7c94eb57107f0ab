"""The service link: register the endpoint, then heartbeat from a background thread.

POST /endpoints {name, metadata} -> EndpointRegistered (endpoint_id and the task and
results QueueDescriptors). POST /endpoints/{id}/heartbeat {"stats": {...}} every
heartbeat_period. Both carry the endpoint's allowlist (`allowed_functions`, None: any
function), so the service refuses other functions at submission. With direct sessions on,
every heartbeat also carries the direct socket's DirectInfo (skyfn.protocol.api): the
service signs session tokens with its session key, and forgets it when heartbeats stop.
A service that is down is retried with exponential backoff; the agent
keeps running tasks meanwhile (the queues do not need the service). A 4xx answer to
registration is not retried: the token or the name is wrong, and the message says so.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import requests

from skyfn.protocol.api import EndpointRegistered, Heartbeat, ListenTicket, RegisterEndpoint
from skyfn.protocol.lanes import BindLane, LaneGranted
from skyfn.protocol.task_states import TaskStates, TaskStatesRequest

log = logging.getLogger("skyfn.agent.link")

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
REQUEST_TIMEOUT_S = 10.0
# A registration issues a new endpoint credential and revokes the one before: a retry after a
# read timeout whose first try still completes later leaves the agent with a revoked
# credential. So its answer is waited for longer than other calls' (a busy service, a fleet
# of agents registering at once; issue 39).
REGISTER_TIMEOUT_S = 60.0


class ServiceError(Exception):
    """The service refused a request (4xx); retrying will not help."""

    def __init__(self, message: str, status: int = 0, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


class ServiceLink:
    def __init__(self, service_url: str, token: str, timeout: float = REQUEST_TIMEOUT_S):
        self.url = service_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.token_source: Callable[[], str | None] | None = None  # re-read after a 401 (rotated credential)
        self.session.headers.update({"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                                     "User-Agent": "skyfn-endpoint"})

    def _post(self, path: str, body: str, timeout: float | None = None) -> dict[str, Any]:
        return self._call("POST", path, body, timeout)

    def _call(self, method: str, path: str, body: str | None, timeout: float | None = None) -> dict[str, Any]:
        timeout = timeout or self.timeout
        resp = self.session.request(method, self.url + path, data=body, timeout=timeout)
        if resp.status_code == 401 and self.token_source is not None:
            # the credential was rotated: its owner may have handed the agent the new one
            fresh = self.token_source()
            if fresh and f"Bearer {fresh}" != self.session.headers.get("Authorization"):
                log.info("the service refused the endpoint credential; using the one now kept for it")
                self.use_token(fresh)
                resp = self.session.request(method, self.url + path, data=body, timeout=timeout)
        if 400 <= resp.status_code < 500:
            try:
                err = resp.json()
                code, detail = err.get("error"), f"{err.get('error')}: {err.get('message')}"
            except ValueError:
                code, detail = None, resp.text[:300]
            raise ServiceError(f"{method} {path} refused with {resp.status_code}: {detail}", resp.status_code, code)
        if resp.status_code >= 500:  # keep the service's reason (e.g. a refused AWS call) for the log
            try:
                err = resp.json()
                reason = f"{err.get('error')}: {err.get('message')}"
            except ValueError:
                reason = resp.text[:300]
            raise requests.HTTPError(f"{method} {path} failed with {resp.status_code}: {reason}", response=resp)
        resp.raise_for_status()
        return resp.json()

    def register(self, name: str, metadata: dict[str, Any], stop: threading.Event | None = None,
                 allowed: list[dict[str, str]] | None = None) -> EndpointRegistered:
        """Register (idempotent on the service side: same name, same endpoint), retrying
        while the service is unreachable or answers 5xx, until `stop` is set."""
        body = RegisterEndpoint(name=name, metadata=metadata, allowed_functions=allowed).model_dump_json()
        return self._post_until_answered("/endpoints", body, stop, "registration with", "registering",
                                         timeout=max(self.timeout, REGISTER_TIMEOUT_S))

    def use_token(self, token: str) -> None:
        """Speak with another credential from now on (the endpoint's own, once issued)."""
        self.session.headers["Authorization"] = f"Bearer {token}"

    def connect(self, endpoint_id: str, stop: threading.Event | None = None) -> EndpointRegistered:
        """With the endpoint's credential: learn the queues (POST /endpoints/{id}/connect),
        retrying while the service is unreachable; a refusal raises ServiceError."""
        return self._post_until_answered(f"/endpoints/{endpoint_id}/connect", "{}", stop, "connecting to", "connecting")

    def _post_until_answered(self, path: str, body: str, stop: threading.Event | None, failed: str,
                             doing: str, timeout: float | None = None) -> EndpointRegistered:
        """POST until the service answers, backing off while it is unreachable or answers 5xx;
        a refusal (ServiceError) raises at once, and so does `stop` being set (InterruptedError)."""
        delay = BACKOFF_START_S
        while True:
            try:
                return EndpointRegistered.model_validate(self._post(path, body, timeout))
            except ServiceError:
                raise
            except (requests.RequestException, ValueError) as exc:
                log.warning("%s %s failed (%s); retrying in %.1f s", failed, self.url, exc, delay)
            if stop is not None and stop.wait(delay):
                raise InterruptedError(f"stopped while {doing}")
            if stop is None:
                time.sleep(delay)
            delay = min(BACKOFF_MAX_S, delay * 2)

    def heartbeat(self, endpoint_id: str, stats: dict[str, Any], allowed: Any = ...,
                  direct: dict[str, str] | None = None, features: list[str] | None = None) -> dict[str, Any]:
        """`allowed`: the allowlist to report (None: any function); not given: not reported.
        `direct`: the agent's DirectInfo (skyfn.protocol.api), with every heartbeat while it takes sessions.
        `features`: what this agent understands beyond the base protocol (Heartbeat.features)."""
        fields: dict[str, Any] = {"stats": stats}
        if features:
            fields["features"] = features
        if allowed is not ...:
            fields["allowed_functions"] = allowed
        if direct is not None:
            fields["direct"] = direct
        body = Heartbeat(**fields)
        return self._post(f"/endpoints/{endpoint_id}/heartbeat", body.model_dump_json(exclude_unset=True))

    def bind_lane(self, endpoint_id: str, lane: str, identity_id: str, config_key: str) -> LaneGranted:
        """Open the lane (if new) and bind (identity, config key) to it (skyfn.protocol.lanes).
        ServiceError with code `lanes_unavailable` where the service's queues cannot have lanes."""
        body = BindLane(lane=lane, identity_id=identity_id, config_key=config_key).model_dump_json()
        return LaneGranted.model_validate(self._post(f"/endpoints/{endpoint_id}/lanes", body))

    def close_lane(self, endpoint_id: str, lane: str) -> None:
        """Unbind everything from the lane and end its queue login (404: it was gone already)."""
        try:
            self._call("DELETE", f"/endpoints/{endpoint_id}/lanes/{lane}", None)
        except ServiceError as exc:
            if exc.status != 404:
                raise

    def direct_listen(self, endpoint_id: str) -> ListenTicket:
        """Where and under which name to LISTEN for direct sessions at the rendezvous server
        (skyfn.protocol.direct_path); ServiceError 404 where the deployment runs none."""
        return ListenTicket.model_validate(self._post(f"/endpoints/{endpoint_id}/direct/listen", "{}"))

    def task_states(self, endpoint_id: str, task_ids: list[str]) -> TaskStates:
        """The service's states of these tasks of the endpoint (skyfn.protocol.task_states): at
        most MAX_TASK_STATES ids; a task not dispatched to this endpoint is UNKNOWN."""
        body = TaskStatesRequest(task_ids=task_ids).model_dump_json()
        return TaskStates.model_validate(self._post(f"/endpoints/{endpoint_id}/task-states", body))

    def close(self) -> None:
        self.session.close()


class Heartbeater(threading.Thread):
    """Sends a heartbeat every `period` seconds; on failure retries sooner, with
    backoff capped at the period, and logs once per outage rather than per attempt."""

    def __init__(self, link: ServiceLink, endpoint_id: str, period: float, stats: Callable[[], dict[str, Any]],
                 allowed: Any = ..., direct: dict[str, str] | None = None, features: list[str] | None = None):
        super().__init__(name="skyfn-heartbeat", daemon=True)
        self.features = features  # Heartbeat.features
        self.allowed = allowed  # the allowlist reported with each heartbeat (... : none reported)
        self.direct = direct    # DirectInfo of the direct socket, with each heartbeat (holds a secret: not logged)
        self.link = link
        self.endpoint_id = endpoint_id
        self.period = period
        self.stats = stats
        self._halt = threading.Event()
        self.sent = 0
        self.failures = 0

    def run(self) -> None:
        wait = 0.0
        delay = BACKOFF_START_S
        down_since: float | None = None
        while not self._halt.wait(wait):
            try:
                self.link.heartbeat(self.endpoint_id, self.stats(), self.allowed, self.direct, self.features)
                self.sent += 1
                if down_since is not None:
                    log.info("service reachable again after %.0f s", time.monotonic() - down_since)
                    down_since = None
                delay = BACKOFF_START_S
                wait = self.period
            except Exception as exc:  # noqa: BLE001 - never let the heartbeat thread die
                self.failures += 1
                if down_since is None:
                    down_since = time.monotonic()
                    log.warning("heartbeat failed (%s); tasks keep running, retrying with backoff", exc)
                wait = min(self.period, delay)
                delay = min(BACKOFF_MAX_S, delay * 2)

    def stop(self) -> None:
        self._halt.set()
