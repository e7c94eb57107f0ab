"""The SDK's Client: register functions, submit tasks singly or in batches, read their
state and results, cancel them, and look up endpoints, groups and shares.

What a submission sends (call bodies, options, Batch, request splitting) is
skyfn/submission.py; what a final status means (value or exception) skyfn/outcomes.py.
Request bodies are plain dicts shaped like the models of ``skyfn.protocol.api`` (no model
is built per task on the hot path); answers are read as plain dicts too.
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union
from urllib.parse import quote

from skyfn.config import load_config
from skyfn.dataflow import rebase_local_inputs
from skyfn.http import HttpClient, SkyfnAPIError, SkyfnConnectionError, TaskNotFound
# FINAL, task_outcome and what a submission sends are importable from here, as they were
# before they had modules of their own
from skyfn.outcomes import FINAL, task_outcome
from skyfn.protocol import blobs
from skyfn.protocol.errors import SkyfnError
from skyfn.protocol.ids import uuid7_hex
from skyfn.protocol.limits import MAX_STATUS_IDS, MAX_WAIT_SECONDS  # not .api: no pydantic models to build
from skyfn.protocol.serialize import serialize_function
from skyfn.protocol.states import STAGES, stage_latencies
from skyfn.submission import (
    REQUEST_MAX_BYTES,
    REQUEST_MAX_TASKS,
    Batch,
    FunctionRef,
    call_body,
    check_user_config,
    no_memo,
    split_requests,
    task_options,
)

__all__ = ["Batch", "Client", "EndpointNotFound", "FINAL", "FunctionRef", "REQUEST_MAX_BYTES", "REQUEST_MAX_TASKS",
           "check_user_config", "split_requests", "task_options", "task_outcome"]

# Extra read time beyond the long-poll wait before the SDK gives up on an answer.
_POLL_MARGIN = 30.0


class EndpointNotFound(SkyfnError, LookupError):
    """No endpoint with this name is visible to you."""


class Client:
    """A connection to the skyfn service.

    ``Client()`` reads ``$SKYFN_HOME/config.json`` (written by ``skyfn local up``); the
    environment variables ``SKYFN_SERVICE_URL`` / ``SKYFN_TOKEN`` and the arguments
    override it.
    """

    def __init__(
        self,
        service_url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        timeout: float = 60.0,
        retries: Optional[int] = None,
        backoff: float = 0.05,
        retry_seconds: float = 60.0,
    ):
        self.config = load_config(service_url, token)
        self.service_url = self.config.service_url
        # Transient failures (service or Redis restarting) are retried for retry_seconds,
        # or `retries` times if given; submissions are safe to retry (idempotency keys).
        self._http = HttpClient(self.service_url, self.config.token, timeout=timeout, retries=retries, backoff=backoff,
                                retry_seconds=retry_seconds)
        self._function_ids: dict[Any, str] = {}
        self._endpoint_ids: dict[str, str] = {}

    # -- lifecycle ------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<skyfn.Client {self.service_url}>"

    # -- functions ------------------------------------------------------------------
    def register_function(
        self, fn: Callable[..., Any], tag: Optional[str] = None, container: Optional[str] = None, name: Optional[str] = None,
        memoize: bool = False,
    ) -> str:
        """Register a function (serialized by value) and return its function id. With
        ``memoize``, a call on arguments it already ran on (same code and container) is
        answered from the service's cache without running (a submission can override it)."""
        body: dict[str, Any] = {"function": serialize_function(fn)}
        if memoize:
            body["memoize"] = True
        body["name"] = name or getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
        if tag is not None:
            body["tag"] = tag
        if container is not None:
            body["container"] = container
        # Safe to retry: a lost answer at worst leaves an unused duplicate registration.
        return self._http.post("/functions", body)["function_id"]

    def get_function(self, function_id: str) -> dict:
        return self._http.get(f"/functions/{quote(function_id, safe='')}")

    def open_session(self, endpoint_id: str, function_ids: list[str]) -> dict:
        """A direct session with the endpoint's agent for these functions
        (skyfn.protocol.direct): its address, server key, token and expiry. 409
        ``no_direct_channel`` when the agent offers none."""
        return self._http.post(f"/endpoints/{quote(endpoint_id, safe='')}/sessions",
                               {"function_ids": sorted(set(function_ids))})

    def _function_id_for(self, fn: Callable[..., Any]) -> str:
        """Function id of a callable, registering it on first use (cached per object)."""
        fid = self._function_ids.get(fn)
        if fid is None:
            fid = self._function_ids[fn] = self.register_function(fn)
        return fid

    # -- submitting -----------------------------------------------------------------
    def run(self, function_id: FunctionRef, *args: Any, endpoint_id: Optional[str] = None,
            group_id: Optional[str] = None, memoize: Optional[bool] = None, user_config: Optional[dict] = None,
            **kwargs: Any) -> str:
        """Run one task and return its task id. ``function_id`` may also be a callable,
        registered on first use. Give ``endpoint_id``, or ``group_id`` (an endpoint group:
        its placement policy picks the endpoint). ``memoize``: answer from the cache when
        this function already ran on these arguments (default: the function's setting).
        ``user_config``: your variables for a multi-user endpoint's user config template (a
        JSON object of at most 16 KiB, nested at most 8 deep), sent with the task; ordinary
        endpoints ignore it. (So neither ``memoize`` nor ``user_config`` can be a keyword
        argument of the function itself: pack those with ``submit_tasks``.)

        Dataflow: an Executor's future or a ``TaskRef(task_id)`` among the arguments (also
        inside lists, tuples, dicts and sets) is an input: the task waits at the service
        until that task SUCCEEDED and runs with its result in that place (DependencyFailed
        when it did not). A future still being submitted is waited for (its task id); one of
        a direct session (``Executor(direct=True)``) has no id the service knows: its value
        is waited for here and passed inline. A task with inputs is never memoized."""
        if not endpoint_id and not group_id:
            raise ValueError("endpoint_id (or group_id) is required (look one up with client.endpoint_id('local'))")
        user_config = check_user_config(user_config)
        if not isinstance(function_id, str):
            function_id = self._function_id_for(function_id)
        task: dict[str, Any] = {"function_id": function_id, **call_body(args, kwargs)}
        if memoize is not None:
            task["memoize"] = bool(memoize)
        return self.submit_tasks([task], endpoint_id, group_id=group_id, user_config=user_config)[0]

    def create_batch(self, endpoint_id: Optional[str] = None, resource_specification: Optional[dict] = None,
                     walltime: Optional[float] = None, user_config: Optional[dict] = None) -> Batch:
        """A batch; resource_specification ({"cores": n, "gpus": n}) and walltime (s)
        apply to each task added; ``user_config`` (a multi-user endpoint's template
        variables, see :meth:`run`) is sent with the batch."""
        return Batch(self, endpoint_id, resource_specification, walltime, user_config)

    def batch_run(self, batch: Batch) -> list[str]:
        """Submit a batch; returns task ids in the order the tasks were added."""
        if not batch.tasks:
            return []
        return self.submit_tasks(batch.tasks, batch.endpoint_id, user_config=getattr(batch, "user_config", None))

    def submit_tasks(self, tasks: list[dict], endpoint_id: Optional[str] = None, *, max_retries: Optional[int] = None,
                     group_id: Optional[str] = None, memoize: Optional[bool] = None,
                     user_config: Optional[dict] = None) -> list[str]:
        """POST /tasks for ready-made task dicts (``{"function_id", "payload"[, "endpoint_id"]}``),
        split into requests of at most ~5,000 tasks / ~8 MB, each with its own idempotency
        key that is reused by every retry of that request. ``user_config`` (see :meth:`run`)
        is sent with every one of those requests. A task's ``inputs`` may name an earlier
        task of `tasks` as ``"#k"`` (its index in `tasks`), whichever request it lands in;
        a task with inputs is never memoized (its buffer holds placeholders, not values)."""
        user_config = check_user_config(user_config)
        ids: list[str] = []
        tasks = [self._offload(no_memo(t) if t.get("inputs") else t) for t in tasks]  # large arguments: S3
        for chunk in split_requests(tasks):
            chunk = rebase_local_inputs(chunk, len(ids), ids)
            body: dict[str, Any] = {"tasks": chunk, "idempotency_key": uuid7_hex()}
            if endpoint_id:
                body["endpoint_id"] = endpoint_id
            if group_id:
                body["group_id"] = group_id
            if max_retries is not None:
                body["max_retries"] = max_retries
            if memoize is not None:
                body["memoize"] = bool(memoize)
            if user_config is not None:
                body["user_config"] = user_config
            try:
                answer = self._http.post("/tasks", body)
            except (SkyfnAPIError, SkyfnConnectionError) as exc:
                exc.submitted_task_ids = list(ids)  # type: ignore[attr-defined]
                raise
            got = answer["task_ids"]
            if len(got) != len(chunk):
                raise SkyfnError(f"the service returned {len(got)} task ids for {len(chunk)} tasks")
            ids.extend(got)
        return ids

    def _offload(self, task: dict) -> dict:
        """A task whose payload is too large to travel inline, with the payload uploaded to
        S3 (an upload form from POST /blobs) and referenced instead (skyfn.protocol.blobs)."""
        payload = task.get("payload")
        staging = getattr(payload, "staging", None)
        if staging:  # GlobusFile arguments (pack_args noted them): the agent stages these
            task = {**task, "payload": str.__str__(payload), **staging}
            payload = task["payload"]
        if not isinstance(payload, str) or len(payload) <= blobs.INLINE_BYTES or blobs.is_ref(payload):
            return task
        data = payload.encode("utf-8")
        form = self._http.post("/blobs", {"size": len(data)})
        return {**task, "payload": blobs.make_ref(blobs.upload(form, data))}

    # -- reading --------------------------------------------------------------------
    def get_task(self, task_id: str, *, peek: bool = False) -> dict:
        """GET /tasks/{id}: state, events, retries, function, endpoint, and result/error
        buffers when final. Raises TaskNotFound for an unknown id.

        Reading a finished task counts as retrieving its result: the service drops it
        SKYFN_RESULT_TTL (600 s) later. ``peek=True`` only observes (the result stays
        until it is read for real)."""
        if not isinstance(peek, bool):
            raise TypeError(f"get_task: peek must be True or False, not {peek!r}")
        try:
            return self._http.get(f"/tasks/{quote(task_id, safe='')}" + ("?peek=true" if peek else ""))
        except SkyfnAPIError as exc:
            if exc.status == 404:
                raise TaskNotFound(task_id, exc.message) from None
            raise

    def status(
        self, task_ids: list[str], wait: float = 0.0, include_events: bool = False, cursor: Optional[str] = None,
        *, peek: bool = False, results: bool = True,
    ) -> dict:
        """One POST /tasks/status call (at most MAX_STATUS_IDS ids): the raw answer,
        ``{"tasks": {id: TaskStatus}, "unknown": [...], "later": [...], "cursor": ...}``.
        ``unknown``: ids the service has no task for; ``later``: tasks it has in its durable
        history but did not read in this call (it reads a bounded part each): ask again.
        With the ``cursor`` of a previous answer, only tasks finished since then are returned.

        A read counts as retrieving the finished tasks' results: the service drops them
        SKYFN_RESULT_TTL (600 s) later. ``peek=True`` only observes (the results stay
        until they are read for real); ``results=False`` leaves result, stdout and stderr
        out of the answer (states, errors and reasons only)."""
        body: dict[str, Any] = {"task_ids": task_ids, "wait": float(wait)}
        if include_events:
            body["include_events"] = True
        if cursor:
            body["cursor"] = cursor
        if peek:
            body["peek"] = True
        if not results:
            body["results"] = False
        return self._http.post("/tasks/status", body, timeout=wait + _POLL_MARGIN)

    def get_result(self, task_id: str, timeout: Optional[float] = None) -> Any:
        """Wait for a task and return its result, or raise its exception.

        Long-polls POST /tasks/status. Raises the function's own exception (with the
        remote traceback attached), TaskCancelled / TaskTimedOut / TaskFailed, TaskNotFound,
        ResultExpired (it succeeded, but its result is no longer kept), or TimeoutError if it is not final within ``timeout`` seconds (None: wait forever).
        """
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            wait = MAX_WAIT_SECONDS if deadline is None else min(MAX_WAIT_SECONDS, max(0.0, deadline - time.monotonic()))
            t0 = time.monotonic()
            answer = self.status([task_id], wait=wait)
            st = answer.get("tasks", {}).get(task_id)
            if st is None:
                raise TaskNotFound(task_id)
            if st.get("state") in FINAL:
                ok, value = task_outcome(task_id, st)
                if ok:
                    return value
                raise value
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"task {task_id} is still {st.get('state')} after {timeout} s")
            _guard_short_poll(t0, wait)

    def stage_latencies(self, task_ids: Iterable[str]) -> dict[str, list[float]]:
        """Seconds each task spent per stage (service, queue_wait, dispatch, run, return),
        read back from the tasks' timestamped events; one list per stage."""
        ids = list(dict.fromkeys(task_ids))
        out: dict[str, list[float]] = {name: [] for name, _, _ in STAGES}
        for i in range(0, len(ids), MAX_STATUS_IDS):
            answer = self.status(ids[i : i + MAX_STATUS_IDS], include_events=True)
            for st in answer.get("tasks", {}).values():
                for name, seconds in stage_latencies([tuple(e) for e in st.get("events") or []]).items():
                    out[name].append(seconds)
        return out

    def get_batch_result(self, task_ids: Iterable[str], wait: float = 0.0) -> dict[str, dict]:
        """Status of many tasks at once, like Globus Compute's: for each id a dict with
        ``pending`` (bool), ``state`` (also as ``status``) and, when final, ``result`` or
        ``exception`` (ResultExpired for a success whose result is no longer kept). ``wait`` long-polls until at least one of them is final."""
        ids = list(dict.fromkeys(task_ids))
        out: dict[str, dict] = {}
        ask, first = ids, True
        while ask:
            chunk, ask = ask[:MAX_STATUS_IDS], ask[MAX_STATUS_IDS:]
            answer = self.status(chunk, wait=min(wait, MAX_WAIT_SECONDS) if first else 0.0)
            first = False
            later = answer.get("later") or []
            ask = later + ask  # read from the service's history in parts: asked again
            tasks = answer.get("tasks", {})
            left = set(later)
            for tid in (t for t in chunk if t not in left):
                st = tasks.get(tid)
                if st is None:
                    out[tid] = {"pending": False, "state": "UNKNOWN", "status": "UNKNOWN", "exception": TaskNotFound(tid)}
                    continue
                state = st.get("state")
                entry: dict[str, Any] = {"pending": state not in FINAL, "state": state, "status": state}
                if state in FINAL:
                    ok, value = task_outcome(tid, st)
                    entry["result" if ok else "exception"] = value
                out[tid] = entry
        return out

    def cancel(self, task_id: str) -> bool:
        """Cancel a task. True if it is now CANCELLED, False if it had already finished."""
        try:
            answer = self._http.delete(f"/tasks/{quote(task_id, safe='')}")
        except SkyfnAPIError as exc:
            if exc.status == 409:
                return False
            if exc.status == 404:
                raise TaskNotFound(task_id, exc.message) from None
            raise
        return (answer or {}).get("state", "CANCELLED") == "CANCELLED"

    # -- endpoints ------------------------------------------------------------------
    # -- seeing the work (DESIGN.md 11) --------------------------------------------------
    def tasks(self, since: Union[float, str, None] = None, endpoint_id: Optional[str] = None, limit: int = 10_000,
              history: bool = True) -> list[dict]:
        """Your tasks created since ``since`` (epoch seconds, or "30m", "2h", "1d"; default
        the last hour), newest first, with their events as [state, timestamp] pairs."""
        from urllib.parse import urlencode

        from skyfn.report.since import parse_since

        query = {"since": f"{parse_since(since):.6f}", "limit": int(limit), "history": str(bool(history)).lower()}
        if endpoint_id:
            query["endpoint_id"] = endpoint_id
        return self._http.get(f"/tasks?{urlencode(query)}")["tasks"]

    def report(self, since: Union[float, str, None] = None, endpoint: Optional[str] = None,
               html: Union[str, "os.PathLike[str]", None] = None, png_dir: Union[str, "os.PathLike[str]", None] = None,
               limit: int = 20_000) -> Any:
        """A report of your tasks built from their events (skyfn.report.Report: throughput,
        tasks in flight and worker utilization with a Little's-law check, latency per stage,
        backlog per endpoint). With ``html`` / ``png_dir`` it is also written there
        (matplotlib). In a notebook the returned report displays itself."""
        from skyfn.report import build

        return build(self, since=since, endpoint=endpoint, html=html, png_dir=png_dir, limit=limit)

    def list_endpoints(self) -> list[dict]:
        return self._http.get("/endpoints")["endpoints"]

    def get_endpoint(self, endpoint_id: str) -> dict:
        return self._http.get(f"/endpoints/{quote(endpoint_id, safe='')}")

    def endpoint_id(self, name: str) -> str:
        """Resolve an endpoint name (or id) to its id via GET /endpoints."""
        cached = self._endpoint_ids.get(name)
        if cached:
            return cached
        endpoints = self.list_endpoints()
        matches = [e for e in endpoints if e.get("name") == name or e.get("endpoint_id") == name]
        if not matches:
            names = ", ".join(sorted({str(e.get("name")) for e in endpoints})) or "none"
            raise EndpointNotFound(
                f"no endpoint named {name!r} (yours: {names}). Start one with `skyfn local up` "
                f"(endpoint 'local') or `skyfn-endpoint start {name}`."
            )
        matches.sort(key=lambda e: (e.get("status") != "online", -(e.get("last_heartbeat") or 0)))
        eid = matches[0]["endpoint_id"]
        self._endpoint_ids[name] = eid
        return eid

    # -- endpoint groups ------------------------------------------------------------
    def create_group(self, name: str, members: Iterable[Union[str, dict]],
                     policy: Union[str, "os.PathLike[str]", None] = None) -> dict:
        """Create an endpoint group and return it (``group_id``, members, policy, warnings).

        ``members``: endpoint names or ids (a name is also the member's worker name in the
        policy), or ``{"endpoint_id": ..., "name": ...}`` dicts. ``policy``: aAPP YAML text or
        a path (``pathlib.Path``) to a file; None = shortest backlog over every member. A
        policy the service rejects raises SkyfnAPIError (422) naming line, key and reason.
        Submit with ``run(..., group_id=...)``, ``submit_tasks(..., group_id=...)`` or
        ``Executor(group=...)``."""
        listed = []
        for m in members:
            if isinstance(m, dict):
                listed.append(m)
            else:
                listed.append({"endpoint_id": self.endpoint_id(m), "name": m} if not _looks_like_id(m)
                              else {"endpoint_id": m})
        body: dict[str, Any] = {"name": name, "members": listed}
        if policy is not None:
            body["policy"] = Path(policy).read_text() if isinstance(policy, os.PathLike) else policy
        return self._http.post("/endpoint-groups", body)

    def get_group(self, group_id: str) -> dict:
        """An endpoint group with its members' live figures (status, capacity, backlog, tags)."""
        return self._http.get(f"/endpoint-groups/{quote(group_id, safe='')}")

    # -- security: identity, shares, rendezvous tokens, audit (docs/security.md) -----------
    def whoami(self) -> str:
        """Your user id: what others share with, as ``user:<id>``."""
        return self._http.get("/whoami")["user"]

    def share(self, kind: str, object_id: str, principal: str, role: str = "run") -> dict:
        """Share a function, endpoint or endpoint group (kind: "functions", "endpoints",
        "endpoint-groups") with ``user:<id>`` or ``team:<id>``, role "run" or "manage".

        The principal ``"all-users"`` means every signed-in user: ``share("endpoints", ep,
        "all-users", "run")`` opens an endpoint (a site's multi-user endpoint, say) to anyone
        authenticated; ``unshare`` closes it again. ``all-users`` takes role "run" only, on
        functions and endpoints only (the service answers 400 otherwise)."""
        return self._http.post(f"/shares/{kind}/{quote(object_id, safe='')}", {"principal": principal, "role": role})

    def unshare(self, kind: str, object_id: str, principal: str) -> dict:
        return self._http.delete(f"/shares/{kind}/{quote(object_id, safe='')}/{quote(principal, safe=':')}")

    def rendezvous_token(self, name: str, ttl_seconds: int = 3600) -> dict:
        """A token for your rendezvous group `name`: {group, token, expires, address}."""
        return self._http.post("/rendezvous/tokens", {"name": name, "ttl_seconds": ttl_seconds})

    def task_audit(self, task_id: str) -> dict:
        """Who submitted the task, where it ran, and every state change with its time."""
        return self._http.get(f"/tasks/{quote(task_id, safe='')}/audit")


def _looks_like_id(text: str) -> bool:
    try:
        uuid.UUID(text)
        return True
    except ValueError:
        return False


def _guard_short_poll(t0: float, wait: float) -> None:
    """The service long-polls; if it answered "nothing final" far sooner than asked (it
    does not honour ``wait``), pause briefly instead of spinning on it."""
    if wait > 0.05 and time.monotonic() - t0 < wait / 2:
        time.sleep(0.01)
