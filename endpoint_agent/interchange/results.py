"""The interchange's result batching: task outcomes in, ResultPack bodies to the outbox.

Results come back from managers in batches and become TaskResult records with the
agent-side events (DISPATCHED when the pack was received, RUNNING and DONE from the
worker) and captured stdout/stderr; RUNNING reports and lease extensions become
TaskUpdates. They leave as ResultPack bodies through the outbox: at most `result_batch`
results (and PACK_MAX_BYTES) per body, UPDATES_PER_BODY updates, by group commit with no
timer: what is buffered goes to the outbox at once when nothing is in flight there (a lone
result never waits); what comes while a send is in flight waits for that send to complete
(the outbox wakes the interchange when it runs dry) and then leaves together, or earlier
when `result_batch` results are buffered (a size bound, never a delay). A task chain
released here one result after another (parked.py) so still leaves in packs of several,
because its results arrive while the previous pack is in flight. A task message
is acknowledged in the same outbox operation as, and after, the last result of its pack;
a task that ends without a result (cancelled) still counts as done for its pack.
A task of a direct session (endpoint_agent.direct) has no message: its result also goes back to
the SDK (st.direct_replies, sent at the end of the interchange's step, before the service's
pack is handed on) and carries its session and function id; it gets no RUNNING or LEASE update.

Every outcome -- a manager's result, a task refused, failed or out of retries -- goes
through `add`. One ResultBatcher per interchange, on the interchange's thread; its
methods take the interchange's state (state.py), the buffers are its own.
"""
from __future__ import annotations

import time

from endpoint_agent import wire
from endpoint_agent.config import EndpointConfig
from endpoint_agent.interchange.state import IxState, ManagerHandle
from endpoint_agent.service import blob_results
from endpoint_agent.task_record import T_ID, T_PACK, T_RECV
from skyfn.protocol.messages import PACK_MAX_BYTES
from skyfn.protocol.states import now

UPDATES_PER_BODY = 2000  # ~200 KB of TaskUpdates per result message at most
RUNNING_UPDATE = "RUNNING"
SDK_RESULT = "_sdk_result"  # a direct task's result as the SDK gets it, when the service gets a reference


class ResultBatcher:
    def __init__(self, config: EndpointConfig):
        self.results: list[dict] = []
        self.results_bytes = 0
        self.updates: list[dict] = []
        self.acks: list[str] = []
        self.first_buffered = 0.0  # monotonic time the oldest buffered item came (stats, tests)
        self.last_flush = 0.0  # monotonic time of the last hand-over to the outbox

    # --- from managers ------------------------------------------------------------
    def on_results(self, st: IxState, m: ManagerHandle, results: list) -> None:
        tasks = st.tasks
        assigned = m.assigned
        for key, state, result, error, start, done, out, err in results:
            t = tasks.pop(key, None)
            if t is None:
                continue
            assigned.discard(key)
            rec = {"task_id": t[T_ID], "state": state,
                   "events": [["DISPATCHED", t[T_RECV]], ["RUNNING", start], ["DONE", done]]}
            if result is not None:
                stored, kept = blob_results.offload(st.result_upload, t[T_ID], result)
                if stored:
                    rec["result"] = kept
                    if kept is not result and st.direct_packs and t[T_PACK] in st.direct_packs:
                        rec[SDK_RESULT] = result  # the SDK gets it inline, the service by reference
                else:
                    rec.update(state="FAILED", reason=kept)
            if error is not None:
                rec["error"] = error
            if out is not None:
                rec["stdout"] = out
            if err is not None:
                rec["stderr"] = err
            if st.staging is not None and st.staging.result(key, t, rec):
                continue  # held while its GlobusFile outputs are sent (endpoint_agent/data/staging.py)
            self.add(st, rec, t[T_PACK], result)
        if not assigned:
            m.last_busy = time.monotonic()
        st._room()

    def on_running(self, st: IxState, items: list) -> None:
        lease = st.config.lease_seconds
        tasks = st.tasks
        direct = st.direct_packs
        for key, ts in items:
            t = tasks.get(key)
            if t is not None and not (direct and t[T_PACK] in direct):  # the service knows no direct task yet
                self.update({"task_id": t[T_ID], "state": RUNNING_UPDATE, "ts": ts, "lease_seconds": lease})

    def update(self, rec: dict) -> None:
        """A TaskUpdate for the next flush."""
        if not (self.results or self.updates or self.acks):
            self.first_buffered = time.monotonic()
        self.updates.append(rec)

    # --- outcomes -----------------------------------------------------------------
    def add(self, st: IxState, rec: dict, pack: int, raw: str | None = None) -> None:
        """A task's final record; `pack` is the sequence number of its pack; `raw` its result
        as the worker gave it (before a large one went to S3)."""
        if st.staging is not None and st.staging.held:
            st.staging.settle(rec)
        parked = st.parked
        if parked is not None and parked.active:  # dependents parked here (parked.py): released with this result, or handed back
            parked.ended(st, rec, raw)
        if not self.results:
            self.first_buffered = time.monotonic()
        if rec["state"] == "SUCCEEDED":
            st.completed += 1
        else:
            st.failed += 1
        if st.direct_packs:
            d = st.direct_packs.get(pack)
            if d is not None:  # back to the SDK at the end of the step (direct/), and recorded by the service
                rec["session"] = d.session
                rec["function_id"] = d.functions.get(rec["task_id"])
                inline = rec.pop(SDK_RESULT, None)
                reply = rec if inline is None else dict(rec, result=inline)
                replies = st.direct_replies.get(d.identity)
                if replies is None:
                    st.direct_replies[d.identity] = [reply]
                else:
                    replies.append(reply)
        self.results.append(rec)
        self.results_bytes += 160 + len(rec.get("result") or "") + len(rec.get("error") or "") + \
            len(rec.get("stdout") or "") + len(rec.get("stderr") or "")
        self.task_gone(st, pack)
        if len(self.results) >= st.config.result_batch or self.results_bytes >= PACK_MAX_BYTES:
            self.flush(st)

    def task_gone(self, st: IxState, pack: int) -> None:
        """One task of the pack is done (with a result or without one)."""
        p = st.packs.get(pack)
        if p is not None:
            p[1] -= 1
            if p[1] <= 0:
                self.pack_done(st, pack)

    def pack_done(self, st: IxState, seq: int) -> None:
        """Every task of the pack is done: its message is acknowledged with the next flush."""
        receipt = st.packs.pop(seq)[0]
        if st.direct_packs and st.direct_packs.pop(seq, None) is not None:
            return  # no queue message to acknowledge
        if not (self.results or self.updates or self.acks):
            self.first_buffered = time.monotonic()
        self.acks.append(receipt)

    # --- to the outbox ------------------------------------------------------------
    def maybe_flush(self, st: IxState) -> None:
        """Group commit: flush when the outbox has nothing in flight, else leave the buffer
        for the round after the outbox runs dry (its on_idle wakes the interchange)."""
        if (self.results or self.updates or self.acks) and st.outbox.idle():
            self.flush(st)

    @staticmethod
    def _rec_size(rec: dict) -> int:
        return 160 + len(rec.get("result") or "") + len(rec.get("error") or "") + \
            len(rec.get("stdout") or "") + len(rec.get("stderr") or "")

    def flush(self, st: IxState) -> None:
        """Hand buffered results, updates and acks to the outbox as one operation."""
        if not (self.results or self.updates or self.acks):
            return
        eid = st.endpoint_id
        results, updates = self.results, self.updates
        batch = st.config.result_batch
        bodies = []
        if len(results) <= batch and self.results_bytes < PACK_MAX_BYTES and len(updates) <= UPDATES_PER_BODY:
            if results or updates:
                bodies.append(wire.dumps({"endpoint_id": eid, "results": results, "updates": updates}))
        else:
            chunk: list = []
            size = 0
            for rec in results:
                rb = self._rec_size(rec)
                if chunk and (len(chunk) >= batch or size + rb > PACK_MAX_BYTES):
                    bodies.append(wire.dumps({"endpoint_id": eid, "results": chunk, "updates": []}))
                    chunk, size = [], 0
                chunk.append(rec)
                size += rb
            if chunk:
                bodies.append(wire.dumps({"endpoint_id": eid, "results": chunk, "updates": []}))
            for i in range(0, len(updates), UPDATES_PER_BODY):
                bodies.append(wire.dumps({"endpoint_id": eid, "results": [], "updates": updates[i:i + UPDATES_PER_BODY]}))
        st.outbox.put(bodies=bodies, acks=self.acks)
        self.results, self.updates, self.acks = [], [], []
        self.results_bytes = 0
        self.last_flush = time.monotonic()

    def extend_leases(self, st: IxState) -> None:
        """Extend the leases of every pack held, and tell the service (LEASE updates)."""
        direct = st.direct_packs  # direct sessions' packs: no lease, and tasks the service does not know yet
        receipts = [p[0] for seq, p in st.packs.items() if seq not in direct]
        if not receipts:
            return
        ts = now()
        lease = st.config.lease_seconds
        self.updates.extend({"task_id": t[T_ID], "state": "LEASE", "ts": ts, "lease_seconds": lease}
                            for t in st.tasks.values() if not direct or t[T_PACK] not in direct)
        st.outbox.put(extend=receipts)
        self.flush(st)
