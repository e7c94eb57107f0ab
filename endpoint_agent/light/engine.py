"""One light agent's tasks: from the poller's packs to the outbox's result packs.

The interchange's own parts do the bookkeeping, on an IxState of this agent's with no
sockets: its Intake takes the packs (allowlist refusals, a function body missing, early
cancels, task keys and records), its ResultBatcher turns outcomes into ResultPack bodies
with the acks of the packs done, by group commit through the outbox, and extends leases
-- so what reaches the service is what an interchange sends. What an interchange hands a
manager is handed here to the shared pool (pool.py); its outcome comes back as a
manager's result would. Every method runs under the engine's lock: the poller, the
control poller, the outbox and the pool's threads all call in.

What the inline engine does not do fails the task with the reason: a container, more than
one core or a GPU (no managers to place it on), GlobusFile staging (the Intake's own
refusal), a dependent sent ahead of its inputs (the agent does not report the park
feature, so the service sends none). A task cancelled while it runs cannot be stopped: it
counts as done for its pack at once, and its result is dropped when it ends. A walltime is
not enforced (a thread cannot be killed).
"""
from __future__ import annotations

import logging
import threading
import time

from endpoint_agent.config import EndpointConfig
from endpoint_agent.interchange.intake import EARLY_CANCEL_TTL_S, Intake
from endpoint_agent.interchange.results import ResultBatcher
from endpoint_agent.interchange.state import PLAIN, IxState, ManagerHandle
from endpoint_agent.light.pool import Outcome, SharedPool
from endpoint_agent.service.outbox import Outbox
from endpoint_agent.service.poller import Delivery
from endpoint_agent.task_record import T_FN, T_ID, T_MGR, T_PACK, T_PAYLOAD, T_RECV

log = logging.getLogger("skyfn.agent.light")

INLINE = b"inline"  # the "manager" every task of the engine is on
UNFIT = ("the inline engine (engine: inline) runs tasks in the agent's own process: no container, at most one "
         "core and no GPU")


def _fail(out: ResultBatcher, st: IxState, t: list, reason: str) -> None:
    out.add(st, {"task_id": t[T_ID], "state": "FAILED", "reason": reason, "events": [["DISPATCHED", t[T_RECV]]]},
            t[T_PACK])


class _NoParking:
    """The IxState's `parked` part: nothing is ever parked here (the intake asks it only for a
    task sent ahead of its inputs, which the service sends only to agents reporting the park
    feature)."""

    active = False
    held = expected = 0

    def __init__(self, out: ResultBatcher):
        self.out = out

    def admit(self, st: IxState, key: int, t: list, after) -> None:
        _fail(self.out, st, t, "this agent keeps no dependents sent ahead of their inputs (engine: inline)")

    def cancel(self, st: IxState, task_id: str) -> bool:
        return False

    def forget(self, task_id: str) -> None:
        pass


class InlineEngine:
    def __init__(self, config: EndpointConfig, endpoint_id: str, outbox: Outbox, pool: SharedPool):
        self.config = config
        self.pool = pool
        self.lock = threading.RLock()
        self._emptied = threading.Condition(self.lock)  # notified when the last task held is done
        self.st = IxState(config, endpoint_id, outbox)
        self.out = ResultBatcher(config)
        self.st.parked = _NoParking(self.out)
        self.intake = Intake(config, endpoint_id, self.out)
        self.worker = ManagerHandle(INLINE)  # whose results on_results takes
        self.worker.registered = True
        self.running = 0

    # --- from the poller, the control poller and the outbox -------------------------
    def deliver(self, batch: list[Delivery], n_tasks: int) -> None:
        with self.lock:
            st = self.st
            st.handoff.extend(batch)
            st.given += n_tasks
            self.intake.ingest(st)
            self._dispatch()
            self.out.maybe_flush(st)

    def load(self) -> int:
        return self.st.load()

    def capacity(self) -> int:
        return self.config.capacity

    def on_idle(self) -> None:
        """The outbox ran dry: what was held for company leaves now (group commit). With
        nothing held the lock is not taken: what is buffered after this check is flushed by
        its own caller, which finds the outbox idle."""
        out = self.out
        if out.results or out.updates or out.acks:
            with self.lock:
                out.maybe_flush(self.st)

    def cancel(self, task_ids: list[str]) -> None:
        """Cancel tasks: a pending one is dropped; a running one counts as done now and its
        result is dropped; one not here yet is dropped when it comes."""
        with self.lock:
            st = self.st
            want = set(task_ids)
            found = {t[T_ID]: key for key, t in st.tasks.items() if t[T_ID] in want}
            mono = time.monotonic()
            for tid in want:
                key = found.get(tid)
                if key is None:
                    self.intake.early_cancel[tid] = mono + EARLY_CANCEL_TTL_S
                    continue
                t = st.tasks.pop(key)
                st.cancelled += 1
                if t[T_MGR] is None:
                    st.n_pending -= 1  # its key stays in the deque; dispatch skips it
                else:
                    self.worker.assigned.discard(key)
                self.out.task_gone(st, t[T_PACK])
            early = self.intake.early_cancel
            for tid, until in list(early.items()):
                if until < mono:
                    del early[tid]
            st._room()
            self.out.maybe_flush(st)
            if not st.load():
                self._emptied.notify_all()

    def wait_empty(self, timeout: float) -> bool:
        """Wait (blocked, no polling) until no task is held; False after `timeout`."""
        with self.lock:
            return self._emptied.wait_for(lambda: not self.st.load(), timeout)

    def extend_leases(self) -> None:
        with self.lock:
            self.out.extend_leases(self.st)

    def flush(self) -> None:
        with self.lock:
            self.out.flush(self.st)

    # --- to the pool and back ---------------------------------------------------------
    def _dispatch(self) -> None:
        st = self.st
        for route, dq in st.pending.items():
            while dq:
                key = dq.popleft()
                t = st.tasks.get(key)
                if t is None:
                    continue  # cancelled while pending
                st.n_pending -= 1
                if route != PLAIN:
                    del st.tasks[key]
                    _fail(self.out, st, t, UNFIT)
                    continue
                t[T_MGR] = INLINE
                self.worker.assigned.add(key)
                self.running += 1
                pack = st.packs.get(t[T_PACK])
                self.pool.submit(lambda outcome, key=key: self._done(key, outcome), st.functions, t[T_FN],
                                 t[T_PAYLOAD], pack[2] if pack else None, t[T_ID], self.config.max_output_bytes)

    def _done(self, key: int, outcome: Outcome) -> None:
        """On the pool's thread: the outcome becomes a result as a manager's would."""
        state, result, error, t0, t1, out, err, refs = outcome
        with self.lock:
            self.running -= 1
            self.out.on_results(self.st, self.worker, [(key, state, result, error, t0, t1, out, err)])
            self.out.maybe_flush(self.st)
            if not self.st.load():
                self._emptied.notify_all()
        if refs:  # the task's argument refs, evicted once its result is on its way (as a worker does)
            from skyfn.data.autoref import evict_task_arguments

            try:
                evict_task_arguments(refs)
            except Exception as exc:  # noqa: BLE001 - their TTL ends them
                log.debug("evicting argument refs failed: %s", exc)

    def stats(self) -> dict:
        st = self.st
        return {"in_flight": st.load(), "running": self.running, "completed": st.completed, "failed": st.failed,
                "cancelled": st.cancelled, "received_tasks": st.received_tasks}
