"""A user agent's side of its lane (skyfn.protocol.lanes): the queue wrappers that seal its
results for the service and copy what the audit log needs to the privileged process.

A user agent with a lane takes its tasks from the service's lane queue and sends its results
to the service's results queue itself, so the privileged process no longer sees them. The
wrappers, put around the agent's queues (Agent(queue_wrapper=...)), keep the audit trail:

- the task queue's wrapper notes, for every task received, its function (id and name) and
  its submitter's identity id (the ledger), and deletes a message of the lane only once the
  privileged process has read it (its *seen mark*, multiuser/lane_routes.py: the routing
  record of a lane's task comes from the service's message, never from this agent);
- the results queue's wrapper sends the ResultPack sealed with the lane's MAC key, then adds
  one audit copy per final result -- task, function, identity, state, events, reason; never
  the result itself -- to the agent's audit stream in the router's Redis. Both before the
  send returns, and the outbox acknowledges the task's message only after it: a kill in
  between makes the task run again and be copied (the router writes one line per task), so
  no result goes without an audit line. A copy only tells the router the task ended: identity,
  function and account come from its routing record, the outcome, times and reason from the
  service's final state, and a copy that disagrees with either is logged as a disagreement
  (multiuser/audit_copies.py, audit_confirm.py);
- the control queue's wrapper copies a CANCELLED line for each cancelled task it has noted
  (a cancelled task sends no result).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from typing import Optional

import orjson
import redis

from skyfn.protocol.lanes import seal
from skyfn.protocol.queues.base import Message, TaskQueue, WrappedQueue

FINAL = ("SUCCEEDED", "FAILED", "TIMED_OUT")
LEDGER_MAX = 200_000  # tasks noted and not yet final; beyond it the oldest notes go
SEEN_WAIT_S = 15.0    # how long a delete waits for the privileged process to have read the message
SEEN_POLL_S = 0.02

log = logging.getLogger("skyfn.multiuser.lane")


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class SeenMark:
    """The privileged process's seen mark of this agent's lane, in the router's Redis."""

    def __init__(self, url: str, key: str):
        self.key = key
        self.client = redis.Redis.from_url(url, socket_timeout=10)
        self._past = (0, 0)

    def wait_past(self, entry_ids: list[str], timeout: float = SEEN_WAIT_S) -> bool:
        """Wait until the mark is at or past every id; False (logged) when it did not come in time."""
        try:
            want = max(_id(i) for i in entry_ids)
        except ValueError:
            return True  # not stream ids: nothing to wait for
        deadline = time.monotonic() + timeout
        while self._past < want:
            try:
                raw = self.client.get(self.key)
                self._past = max(self._past, _id(raw.decode()) if raw else (0, 0))
            except (redis.RedisError, ValueError) as exc:
                log.debug("cannot read the seen mark %s: %s", self.key, exc)
            if self._past >= want:
                break
            if time.monotonic() > deadline:
                log.warning("the endpoint has not read lane messages up to %s-%s after %.0f s: deleting them anyway "
                            "(their audit lines may be missing)", *want, timeout)
                return False
            time.sleep(SEEN_POLL_S)
        return True

    def close(self) -> None:
        self.client.close()


class Ledger:
    """task id -> (function id, function name, identity id) of the tasks received."""

    def __init__(self) -> None:
        self._tasks: OrderedDict[str, tuple[str, Optional[str], Optional[str]]] = OrderedDict()
        self._lock = threading.Lock()

    def note_packs(self, bodies: list[bytes]) -> None:
        noted = []
        for body in bodies:
            try:
                pack = orjson.loads(body)
                meta = pack.get("function_meta") or {}
                identity = (pack.get("identity") or {}).get("id") or pack.get("owner")
                noted.extend((t["task_id"], (t["function_id"], (meta.get(t["function_id"]) or {}).get("name"),
                                             identity)) for t in pack["tasks"])
            except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
                continue  # the agent's poller reports a body that is not a TaskPack
        with self._lock:
            self._tasks.update(noted)
            while len(self._tasks) > LEDGER_MAX:
                self._tasks.popitem(last=False)

    def take(self, task_id: str) -> Optional[tuple[str, Optional[str], Optional[str]]]:
        with self._lock:
            return self._tasks.pop(task_id, None)


def audit_copy(task_id: str, noted: Optional[tuple], state: str, events: list, reason: Optional[str]) -> dict:
    function_id, name, identity = noted or (None, None, None)
    return {"task_id": task_id, "function_id": function_id, "function_name": name, "identity_id": identity,
            "state": state, "events": events, "reason": reason}


class LaneAcks(WrappedQueue):
    """The lane's task queue as the outbox acknowledges on it: a message is deleted only once
    the privileged process has read it (SeenMark)."""

    def __init__(self, inner: TaskQueue, seen: Optional[SeenMark] = None):
        super().__init__(inner)
        self.seen = seen

    def delete(self, receipts: list[str]) -> None:
        if receipts and self.seen is not None:
            self.seen.wait_past(receipts)
        self.inner.delete(receipts)

    def close(self) -> None:
        if self.seen is not None:
            self.seen.close()
        self.inner.close()


class LaneTasks(LaneAcks):
    def __init__(self, inner: TaskQueue, ledger: Ledger, seen: Optional[SeenMark] = None):
        super().__init__(inner, seen)
        self.ledger = ledger

    def receive(self, max_messages: int = 10, wait_seconds: float = 0.0,
                visibility_timeout: float | None = None) -> list[Message]:
        messages = self.inner.receive(max_messages, wait_seconds, visibility_timeout)
        if messages:
            self.ledger.note_packs([m.body for m in messages])
        return messages


class LaneResults(WrappedQueue):
    def __init__(self, inner: TaskQueue, *, lane: str, mac_key: str, endpoint_id: str, ledger: Ledger,
                 audit: TaskQueue):
        super().__init__(inner)
        self.lane, self.mac_key, self.endpoint_id, self.ledger, self.audit = lane, mac_key, endpoint_id, ledger, audit

    def send(self, bodies: list[bytes]) -> list[str]:
        copies, sealed = [], []
        for body in bodies:
            try:
                pack = orjson.loads(body)
            except orjson.JSONDecodeError:
                continue
            # the agent's own endpoint id names it among its account's data; the service knows the endpoint's
            pack["endpoint_id"] = self.endpoint_id
            sealed.append(seal(self.lane, self.mac_key, orjson.dumps(pack)))
            for r in pack.get("results") or ():
                if r.get("state") in FINAL and not r.get("session"):
                    copies.append(audit_copy(r["task_id"], self.ledger.take(r["task_id"]), r["state"],
                                             r.get("events") or [], r.get("reason")))
        ids = self.inner.send(sealed)
        if copies:
            self.audit.send([json.dumps({"audit": copies}).encode()])
        return ids

    def close(self) -> None:
        self.audit.close()
        self.inner.close()


class LaneControl(WrappedQueue):
    def __init__(self, inner: TaskQueue, *, ledger: Ledger, audit: TaskQueue):
        super().__init__(inner)
        self.ledger, self.audit = ledger, audit

    def receive(self, max_messages: int = 10, wait_seconds: float = 0.0,
                visibility_timeout: float | None = None) -> list[Message]:
        messages = self.inner.receive(max_messages, wait_seconds, visibility_timeout)
        copies = []
        for m in messages:
            try:
                ids = orjson.loads(m.body).get("cancel") or []
            except (orjson.JSONDecodeError, AttributeError):
                continue
            for tid in ids:
                noted = self.ledger.take(tid) if isinstance(tid, str) else None
                if noted is not None:
                    copies.append(audit_copy(tid, noted, "CANCELLED", [], None))
        if copies:
            self.audit.send([json.dumps({"audit": copies}).encode()])
        return messages
