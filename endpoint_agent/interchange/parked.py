"""Parked dependents: tasks the service sent ahead of their inputs, released here as soon as
those inputs' results exist on this endpoint, with no trip through the service.

A dependent whose unfinished inputs all run on its own endpoint arrives with
``TaskSpec.after`` naming them and, in its envelope, a ``local`` entry in each one's place
(skyfn.protocol.dataflow). It is held here, off the pending queues and outside the load
(so a graph never fills the agent with tasks that wait for tasks still in the queue),
until the result of every input in `after` is here: then its envelope is filled
(`fill_local`) and it becomes a pending task like any other, with a QUEUED event at that
moment. Results of this agent's tasks are kept for a while (`LocalResults`, bounded by
bytes, most recent first) because a dependent may arrive after its input finished.

A dependent is handed back -- an UNPARK update to the service, and its message counts as
done -- whenever it cannot be released here: an input ended otherwise than SUCCEEDED here
(the service decides: a retry, or DependencyFailed; its own dependents here go back with
it), its payload is in S3, or GRACE_S after it arrived an input it still misses is held
nowhere in this agent (it ran before this agent started, went to another agent, or its
result was evicted). A task handed back counts as held here for EXPECT_S more: the service
sends it back to this endpoint, so the dependents waiting for it here keep waiting. The service then
sends it again, with its inputs' results, once they are all done. So the local path is only
ever a shortcut: a dependent released here or there runs once, after its inputs.
"""
from __future__ import annotations

import collections
import logging
import time
from typing import Any

from endpoint_agent.task_record import T_ID, T_PACK, T_PAYLOAD, T_RECV
from skyfn.protocol import blobs
from skyfn.protocol.dataflow import fill_local, is_envelope
from skyfn.protocol.messages import UNPARK
from skyfn.protocol.states import now

log = logging.getLogger("skyfn.agent.parked")

GRACE_S = 2.0          # how long a dependent waits for an input held nowhere here
CHECK_S = 0.5          # how often the held dependents are looked over
EXPECT_S = 30.0        # a task handed back is expected here again for this long (the service resends it here)
MAX_KEPT = 200_000     # results kept at most, whatever their size


class LocalResults:
    """The latest SUCCEEDED results of this agent's tasks, task id -> result buffer, within
    `max_bytes` (a result larger than an eighth of that is not kept)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.items: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.bytes = 0

    def get(self, task_id: str) -> str | None:
        return self.items.get(task_id)

    def put(self, task_id: str, result: str) -> None:
        size = len(result) + 100
        if size * 8 > self.max_bytes:
            return
        old = self.items.pop(task_id, None)
        if old is not None:
            self.bytes -= len(old) + 100
        self.items[task_id] = result
        self.bytes += size
        items = self.items
        while self.bytes > self.max_bytes or len(items) > MAX_KEPT:
            _, gone = items.popitem(last=False)
            self.bytes -= len(gone) + 100


class ParkedTasks:
    """The dependents held here and the results they may need. `active` turns on with the
    first parked arrival: an agent that never gets one keeps no results."""

    def __init__(self, results_mb: float, out):
        self.out = out  # the interchange's ResultBatcher: hand-backs leave with its next flush
        self.results = LocalResults(int(results_mb * 1024 * 1024))
        self.enabled = results_mb > 0
        self.active = False
        self.held: dict[int, list] = {}         # key -> [task record, {missing input ids}, {id: result}, since]
        self.by_id: dict[str, int] = {}         # task id -> key
        self.waiters: dict[str, list[int]] = {}  # input task id -> keys of the held dependents missing it
        self.released_at: dict[str, float] = {}  # task id -> when it was released here (its QUEUED event)
        self.expected: dict[str, float] = {}     # task id handed back -> until when its dependents here wait for it
        self.next_check = 0.0
        self.released = 0
        self.unparked = 0

    # --- arrivals -------------------------------------------------------------------
    def admit(self, st, key: int, t: list, after: list[str]) -> None:
        """A parked dependent arrived (its record made by the intake, not pending yet)."""
        self.active = True
        if t[T_ID] in self.by_id:  # sent ahead twice (a release the service offered again): one copy waits
            self.out.task_gone(st, t[T_PACK])
            return
        if not self.enabled or not isinstance(t[T_PAYLOAD], str) or not is_envelope(t[T_PAYLOAD]):
            self._unpark(st, t, "its envelope is not here to fill" if self.enabled else "local release is off")
            return
        values: dict[str, str] = {}
        missing: set[str] = set()
        for tid in after:
            r = self.results.get(tid)
            if r is None:
                missing.add(tid)
            else:
                values[tid] = r
        if not missing:
            self._release(st, key, t, values)
            return
        self.held[key] = [t, missing, values, time.monotonic()]
        self.by_id[t[T_ID]] = key
        for tid in missing:
            self.waiters.setdefault(tid, []).append(key)

    # --- outcomes of this agent's tasks --------------------------------------------
    def ended(self, st, rec: dict, raw: str | None) -> None:
        """A task of this agent ended with the final record `rec` (`raw`: its result before a
        large one went to S3). One released here gets its QUEUED event."""
        if self.released_at:
            queued = self.released_at.pop(rec["task_id"], None)
            if queued is not None:
                rec["events"].insert(0, ["QUEUED", queued])
        self.on_outcome(st, rec["task_id"], rec["state"], rec.get("result") if raw is None else raw)

    def forget(self, task_id: str) -> None:
        """A task released here ended without a result (cancelled)."""
        self.released_at.pop(task_id, None)

    def on_outcome(self, st, task_id: str, state: str, result: str | None) -> None:
        """A task of this agent ended: its dependents here get its result, or go back."""
        ok = state == "SUCCEEDED" and isinstance(result, str) and not blobs.is_ref(result)
        if ok:
            self.results.put(task_id, result)
        keys = self.waiters.pop(task_id, None)
        if not keys:
            return
        for key in keys:
            h = self.held.get(key)
            if h is None:
                continue
            if not ok:  # the service decides (a retry, or DependencyFailed); so for its own dependents here
                self._drop(key)
                self._unpark(st, h[0], f"its input {task_id} ended {state} here")
                self.on_outcome(st, h[0][T_ID], "HANDED_BACK", None)
                continue
            h[1].discard(task_id)
            h[2][task_id] = result
            if not h[1]:
                self._drop(key)
                self._release(st, key, h[0], h[2])

    def cancel(self, st, task_id: str) -> bool:
        """Drop a held dependent the service cancelled; False if it is not held here."""
        key = self.by_id.get(task_id)
        if key is None:
            return False
        t = self.held[key][0]
        self._drop(key)
        st.cancelled += 1
        self.out.task_gone(st, t[T_PACK])
        return True

    # --- the interchange's periodic look -------------------------------------------
    def check(self, st, mono: float) -> None:
        """Hand back the dependents that waited GRACE_S for an input held nowhere here (and
        forget the tasks handed back long enough ago)."""
        self.next_check = mono + CHECK_S
        for tid, until in list(self.expected.items()):
            if until <= mono:
                del self.expected[tid]
        due = [key for key, h in self.held.items() if mono - h[3] >= GRACE_S]
        if not due:
            return
        here = {t[T_ID] for t in st.tasks.values()}
        here.update(self.by_id)
        here.update(self.expected)
        for key in due:
            h = self.held.get(key)
            if h is None:
                continue
            lost = next((tid for tid in h[1] if tid not in here), None)
            if lost is not None:
                self._drop(key)
                self._unpark(st, h[0], f"its input {lost} is not held by this agent")

    def snapshot(self) -> dict[str, Any]:
        return {"parked": len(self.held), "released_here": self.released, "handed_back": self.unparked,
                "results_kept": len(self.results.items)}

    # --- helpers --------------------------------------------------------------------
    def _drop(self, key: int) -> None:
        h = self.held.pop(key)
        self.by_id.pop(h[0][T_ID], None)
        for tid in h[1]:
            keys = self.waiters.get(tid)
            if keys is not None:
                try:
                    keys.remove(key)
                except ValueError:
                    pass
                if not keys:
                    del self.waiters[tid]

    def _release(self, st, key: int, t: list, values: dict[str, str]) -> None:
        try:
            t[T_PAYLOAD] = fill_local(t[T_PAYLOAD], values.__getitem__)
        except Exception as exc:  # noqa: BLE001 - a broken envelope or an entry not in `after`
            self._unpark(st, t, f"its envelope could not be filled ({type(exc).__name__}: {exc})")
            return
        ts = now()
        t[T_RECV] = ts
        self.released_at[t[T_ID]] = ts
        self.released += 1
        st.tasks[key] = t
        st.pend(key, t)

    def _unpark(self, st, t: list, why: str) -> None:
        self.unparked += 1
        self.expected[t[T_ID]] = time.monotonic() + EXPECT_S
        log.debug("parked task %s handed back to the service: %s", t[T_ID], why)
        self.out.update({"task_id": t[T_ID], "state": UNPARK, "ts": now(), "lease_seconds": 0})
        self.out.task_gone(st, t[T_PACK])
