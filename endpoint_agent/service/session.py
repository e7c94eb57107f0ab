"""The endpoint's session with the service: what an agent and a multi-user endpoint share.

`ServiceSession(name, config, paths, stop)` learns the endpoint's id and queues -- from the
arguments or config.yaml (task_queue/results_queue: the service is never contacted), by
connecting with the endpoint credential kept from an earlier registration, or by
registering with the owner's token (POST /endpoints) -- then opens the queues (retried
while they are unreachable, logging in again with a credential the owner rotated
meanwhile), seals results with the endpoint's results key, and sends heartbeats. The
credential, the results key and every queue opened stay here, so a credential rotated
while the process runs reaches all of them.

What the process does with the queues (an interchange with managers, or a router with
user agents) is its own: endpoint_agent/agent.py, endpoint_agent/multiuser/endpoint.py.
"""
from __future__ import annotations

import logging
import os
import platform
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from endpoint_agent import __version__
from endpoint_agent.config import EndpointConfig, resolve_service
from endpoint_agent.paths import EndpointPaths
from endpoint_agent.service import credential
from endpoint_agent.service.sealed_results import SealedResults
from skyfn.protocol.api import QueueDescriptor
from skyfn.protocol.result_seal import key_of_credential

if TYPE_CHECKING:  # the link (and `requests`) is imported only by an agent that has one: a user
    from endpoint_agent.service.link import Heartbeater, ServiceLink  # agent of a multi-user endpoint never does

log = logging.getLogger("skyfn.agent")


def agent_metadata(config: EndpointConfig) -> dict[str, Any]:
    """What an agent tells the service about itself when it registers."""
    return {"hostname": socket.gethostname(), "pid": os.getpid(), "workers": config.workers,
            "provider": config.provider, "python": platform.python_version(),
            "platform": sys.platform, "agent_version": __version__}


class ServiceSession:
    def __init__(self, name: str, config: EndpointConfig, paths: EndpointPaths, stop: threading.Event, *,
                 endpoint_id: str | None = None, task_queue: QueueDescriptor | None = None,
                 results_queue: QueueDescriptor | None = None,
                 queue_wrapper: Callable[[str, Any], Any] | None = None):
        self.name = name
        self.config = config
        self.paths = paths
        self._stop = stop  # set: registering, connecting and waiting for the queues give up
        # (kind, queue) -> queue: what a user agent of a multi-user endpoint puts around its
        # "tasks", "results" and "control" queues, and the "acks" handle on the task queue the
        # outbox deletes with (endpoint_agent/multiuser/lane.py)
        self.queue_wrapper = queue_wrapper
        self.endpoint_id = endpoint_id or config.endpoint_id
        self.task_queue_desc = task_queue or config.task_queue
        self.results_queue_desc = results_queue or config.results_queue
        self.control_queue_desc = config.control_queue
        if (self.task_queue_desc is None) != (self.results_queue_desc is None):
            raise ValueError("give both task_queue and results_queue, or neither (to register with the service)")
        self.consumer = f"{name}@{socket.gethostname()}"
        self.link: ServiceLink | None = None
        self.heartbeater: Heartbeater | None = None
        self._queues: list = []  # every queue opened, to hand a rotated credential to (Redis)
        # the key the results queue seals packs with (skyfn.protocol.result_seal): set once the
        # agent registers or connects; an agent given its queues directly sends them unsealed
        self.results_key: str | None = None

    # --- the endpoint's id and queues ----------------------------------------------
    def connect(self, metadata: Callable[[], dict[str, Any]], stats: Callable[[], dict[str, Any]]) -> None:
        """Learn the endpoint id and queues. `metadata` is registered with; `stats` goes with
        the allowlist when it is reported at once (connected with a kept credential).
        Raises InterruptedError when stopped meanwhile."""
        if self.task_queue_desc is not None:
            self.endpoint_id = self.endpoint_id or self.name
            return
        reg = self._connect_with_credential()
        if reg is None:
            from endpoint_agent.service.link import ServiceLink

            url, token = resolve_service(self.config)
            self.link = ServiceLink(url, token)
            log.info("registering endpoint %r with %s", self.name, url)
            reg = self.link.register(self.name, metadata(), stop=self._stop, allowed=self.allowed_report())
            self.results_key = reg.results_key
            if reg.agent_credential:  # from now on the agent speaks as its endpoint (credential.py)
                credential.save(self.paths.credential, reg.agent_credential)
                self.results_key = key_of_credential(reg.agent_credential)
                self.link.use_token(reg.agent_credential)
                self.link.token_source = self._fresh_credential
        self.endpoint_id = reg.endpoint_id
        if self.link is not None and reg.agent_credential is None:
            self._report_allowlist(stats)
        if reg.aws_credentials:  # SQS: the endpoint's own session, refreshed through connect
            endpoint_id, link = reg.endpoint_id, self.link

            def refresh():  # the answer also brings the results key of a credential rotated since
                answer = link.connect(endpoint_id, stop=self._stop)
                self.results_key = answer.results_key or self.results_key
                return answer.aws_credentials

            credential.use_aws_session(reg.aws_credentials, refresh)
        self.task_queue_desc = reg.task_queue
        self.results_queue_desc = reg.results_queue
        self.control_queue_desc = getattr(reg, "control_queue", None)
        log.info("registered as endpoint %s (task queue %s %s)", reg.endpoint_id, reg.task_queue.kind,
                 reg.task_queue.name)

    def allowed_report(self) -> list[dict[str, str]] | None:
        """The allowlist the service is told about (None: any function may run here)."""
        entries = self.config.allowed_functions
        return None if entries is None else [e.model_dump(exclude_none=True) for e in entries]

    def _report_allowlist(self, stats: Callable[[], dict[str, Any]]) -> None:
        """Connected with a kept credential (no registration): tell the service the allowlist
        now, before any task is received, rather than at the first heartbeat."""
        from endpoint_agent.service.link import ServiceError

        assert self.link is not None and self.endpoint_id is not None
        try:
            self.link.heartbeat(self.endpoint_id, stats(), self.allowed_report())
        except (ServiceError, OSError, ValueError) as exc:  # the heartbeats report it again
            log.warning("could not report the allowlist yet (%s); the heartbeats will", exc)

    def _connect_with_credential(self):
        """Connect as the endpoint with a credential kept from an earlier registration (or
        SKYFN_ENDPOINT_CREDENTIAL); None when there is none or the service refuses it (it
        was rotated or revoked: the owner's token registers again)."""
        from endpoint_agent.config import ConfigError, resolve_url
        from endpoint_agent.service.link import ServiceError, ServiceLink

        cred = credential.load(self.paths.credential)
        if cred is None:
            return None
        try:
            url = resolve_url(self.config)
        except ConfigError:
            return None
        self.link = ServiceLink(url, cred)
        try:
            reg = self.link.connect(credential.endpoint_of(cred), stop=self._stop)
        except ServiceError as exc:
            log.warning("the endpoint credential was refused (%s); registering with the owner's token", exc)
            credential.forget(self.paths.credential)
            self.link.close()
            self.link = None
            return None
        self.link.token_source = self._fresh_credential
        self.results_key = key_of_credential(cred)
        log.info("connected as endpoint %s with its credential", reg.endpoint_id)
        return reg.model_copy(update={q: credential.complete(getattr(reg, q), cred)
                                      for q in ("task_queue", "results_queue", "control_queue")})

    # --- the endpoint's credential -------------------------------------------------
    def _fresh_credential(self):
        """The credential kept for the endpoint now (its owner may have put a rotated one
        there): the service link uses it, and the Redis queues log in with it from now on."""
        cred = credential.load(self.paths.credential)
        if cred is not None:
            self._rekey(cred)
            secret = cred.rsplit(".", 1)[1]
            for queue in self._queues:
                if hasattr(queue, "set_password"):
                    queue.set_password(secret)
        return cred

    def _rekey(self, cred: str) -> None:
        """Seal with the key of a credential the owner rotated -- once the agent seals at all
        (it registered or connected: an agent given its queues directly sends plain packs)."""
        if self.results_key is not None:
            self.results_key = key_of_credential(cred) or self.results_key

    # --- the queues ------------------------------------------------------------------
    def open(self, desc: QueueDescriptor):
        """A queue of `desc`. The service's results queue (whoever opens it: the outbox, a
        multi-user endpoint's router) seals every pack with the endpoint's results key once
        the agent has one (endpoint_agent/service/sealed_results.py)."""
        from skyfn.protocol.queues import open_queue

        queue = open_queue(desc, consumer=self.consumer, visibility_timeout=self.config.lease_seconds)
        if desc is self.results_queue_desc and self.results_key is not None:
            queue = SealedResults(queue, lambda: self.endpoint_id, lambda: self.results_key)
        self._queues.append(queue)
        return queue

    def wrap(self, kind: str, queue):
        return self.queue_wrapper(kind, queue) if self.queue_wrapper is not None else queue

    def open_queues(self):
        """(poll, results, ack) queue handles, each with its own connection; retried with
        backoff while the queue service is unreachable."""
        assert self.task_queue_desc is not None and self.results_queue_desc is not None
        delay = 0.5
        while True:
            opened = len(self._queues)
            try:
                poll_queue = self.wrap("tasks", self.open(self.task_queue_desc))
                results_queue = self.wrap("results", self.open(self.results_queue_desc))
                # the task stream needs its consumer group; SQS queues are the service's to create
                # (at registration, and the results queue by the stack): the agent role may not.
                # The results stream is the service's too: the agent's login may only add to it.
                if getattr(self.task_queue_desc, "kind", None) != "sqs":
                    poll_queue.ensure()
                return poll_queue, results_queue, self.wrap("acks", self.open(self.task_queue_desc))
            except (ImportError, ValueError):
                raise
            except Exception as exc:  # noqa: BLE001 - e.g. redis not up yet
                log.warning("cannot reach the queues (%s); retrying in %.1f s", exc, delay)
            for queue in self._queues[opened:]:
                queue.close()
            del self._queues[opened:]
            if self._wait_or_new_credential(delay):
                delay = 0.5
                continue
            delay = min(30.0, delay * 2)

    def _wait_or_new_credential(self, delay: float) -> bool:
        """Wait `delay` before the next try, cut short (True) when the owner puts another
        credential in the endpoint's file: a credential rotated while the agent started
        is taken up at once, with no restart. Raises InterruptedError on stop."""
        in_use = credential.load(self.paths.credential)
        deadline = time.monotonic() + delay
        while True:
            if self._stop.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
                raise InterruptedError("stopped while connecting to the queues")
            cred = credential.load(self.paths.credential)
            if in_use is not None and cred is not None and cred != in_use:
                log.info("the endpoint credential changed: logging in to the queues with it")
                self._rekey(cred)
                for attr in ("task_queue_desc", "results_queue_desc", "control_queue_desc"):
                    desc = getattr(self, attr)
                    if desc is not None:
                        setattr(self, attr, credential.complete(desc, cred, replace=True))
                return True
            if time.monotonic() >= deadline:
                return False

    def task_queue_summary(self) -> dict[str, str] | None:
        """Kind and name of the task queue, for the status file: a queue URL may carry credentials."""
        desc = self.task_queue_desc
        return {"kind": desc.kind, "name": desc.name} if desc else None

    # --- heartbeats ------------------------------------------------------------------
    def start_heartbeats(self, stats: Callable[[], dict[str, Any]], **fields: Any) -> None:
        """Heartbeat every heartbeat_period with `stats()` and `fields` (Heartbeater's allowed,
        direct, features), when the endpoint has a service link (not with static queues)."""
        if self.link is None:
            return
        assert self.endpoint_id is not None
        from endpoint_agent.service.link import Heartbeater

        self.heartbeater = Heartbeater(self.link, self.endpoint_id, self.config.heartbeat_period, stats, **fields)
        self.heartbeater.start()

    def stop_heartbeats(self) -> None:
        if self.heartbeater is not None:
            self.heartbeater.stop()

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
