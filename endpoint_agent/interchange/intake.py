"""The interchange's intake: task packs from the poller become pending tasks; cancels end them.

Each pack delivered (Interchange.deliver, from the poller thread) gets a sequence number
and every task an integer key and a task record (endpoint_agent/task_record.py), pending on its route
(container type, cores, GPUs; plus the function tag under a placement policy). Refused
here, with a result and never dispatched: a function outside `allowed_functions` (its
body is not even kept), a function whose body is not in the pack, and a task with
GlobusFiles on an endpoint without data staging. Packs of direct sessions (endpoint_agent.direct) come
the same way, with a DirectReceipt. A task cancelled before it arrived is
dropped on arrival. A dependent sent ahead of its inputs (`after`) is held by the
ParkedTasks (parked.py) instead of pending. A cancel drops a pending or parked task, and
asks the manager holding a dispatched one to drop or kill it; either way the task counts as done for its pack, with
no result (the service already marked it CANCELLED). The methods take the interchange's
state (state.py).
"""
from __future__ import annotations

import collections
import itertools
import logging
import time
from typing import Any

import zmq

from endpoint_agent import wire
from endpoint_agent.config import EndpointConfig
from endpoint_agent.interchange.results import ResultBatcher
from endpoint_agent.interchange.state import PLAIN, IxState
from endpoint_agent.task_record import T_ID, T_MGR, T_PACK, new_record
from skyfn.protocol import blobs

log = logging.getLogger("skyfn.agent.interchange")

EARLY_CANCEL_TTL_S = 3600.0


def task_route(spec, placed: bool) -> tuple:
    """The pending queue of a task: (container type, cores, GPUs), plus the function tag when
    a placement policy decides per tag."""
    res = spec.resources
    cores = int(res.get("cores") or 0) if res else 0
    gpus = int(res.get("gpus") or 0) if res else 0
    route = (spec.container or wire.NO_CONTAINER, cores if cores > 1 or gpus else 0, gpus)
    return route + (spec.tag,) if placed else route


class Intake:
    def __init__(self, config: EndpointConfig, endpoint_id: str, results: ResultBatcher):
        self.out = results
        self.keys = itertools.count((int(time.time() * 1000) % (1 << 40)) << 20)
        self.pack_seq = itertools.count(1)
        self.early_cancel: dict[str, float] = {}  # task ids cancelled before they arrived
        # allowed_functions: a task of any other function fails here, before anything of it is deserialized
        self.gate = None
        if config.allowed_functions is not None:
            from endpoint_agent.allowlist import FunctionGate

            self.gate = FunctionGate(config.allowed_functions, endpoint_id)

    def ingest(self, st: IxState, direct: list | None = None) -> None:
        """Take every pack handed off by the poller, or the `direct` ones (endpoint_agent.direct: from
        this thread, so not counted in `given`)."""
        out = self.out
        handoff = st.handoff if direct is None else collections.deque(direct)
        tasks = st.tasks
        plain = st.pending[PLAIN]
        functions = st.functions
        early = self.early_cancel
        keys = self.keys
        placed = st.placement is not None
        gate = self.gate
        while handoff:
            receipt, pack, recv_ts = handoff.popleft()
            n = len(pack.tasks)
            if direct is None:
                st.taken += n
            st.received_packs += 1
            st.received_tasks += n
            if pack.functions:
                if gate is None:
                    functions.update(pack.functions)
                else:  # the bodies of refused functions are not even kept
                    functions.update({fid: body for fid, body in pack.functions.items()
                                      if gate.refuse(fid, pack.function_meta.get(fid)) is None})
            if pack.result_upload:  # where results too large to travel inline go (service/blob_results.py)
                st.result_upload = pack.result_upload
            seq = next(self.pack_seq)
            st.packs[seq] = [receipt, n, pack.owner]  # the owner: whose refs the tasks may resolve
            if direct is not None:
                st.direct_packs[seq] = receipt
            if not n:
                out.pack_done(st, seq)
                continue
            for spec in pack.tasks:
                if gate is not None:
                    why = gate.refuse(spec.function_id, pack.function_meta.get(spec.function_id))
                    if why is not None:
                        if spec.function_id not in gate.logged:  # once per function, not per task
                            gate.logged.add(spec.function_id)
                            log.warning("task %s refused: %s", spec.task_id, why)
                        out.add(st, {"task_id": spec.task_id, "state": "FAILED", "reason": why,
                                     "events": [["DISPATCHED", recv_ts]]}, seq)
                        continue
                if spec.function_id not in functions:
                    out.add(
                        st, {"task_id": spec.task_id, "state": "FAILED", "events": [["DISPATCHED", recv_ts]],
                         "reason": f"the body of function {spec.function_id} was not in the task pack"}, seq)
                    continue
                if early and spec.task_id in early:
                    st.cancelled += 1
                    out.task_gone(st, seq)
                    continue
                key = next(keys)
                res = spec.resources
                payload = spec.payload if spec.payload_url is None else blobs.make_ref(spec.payload_url)
                if (spec.stage_in or spec.stage_out) and self.stage(st, key, spec, payload, seq, recv_ts):
                    continue
                if spec.container is None and not res and not placed and spec.after is None:
                    tasks[key] = new_record(spec.task_id, spec.function_id, payload, spec.walltime, seq, recv_ts,
                                            PLAIN)
                    plain.append(key)
                    st.n_pending += 1
                    continue
                t = new_record(spec.task_id, spec.function_id, payload, spec.walltime, seq, recv_ts,
                               task_route(spec, placed))
                if spec.after:  # sent ahead of its inputs: held until their results are here (parked.py)
                    st.parked.admit(st, key, t, spec.after)
                    continue
                tasks[key] = t
                st.pend(key, t)

    def stage(self, st: IxState, key: int, spec, payload: Any, seq: int, recv_ts: float) -> bool:
        """A task with GlobusFiles: held while its inputs arrive (True), or pended now (False)."""
        if st.staging is None:
            from endpoint_agent.data.staging import no_staging_reason

            self.out.add(st, {"task_id": spec.task_id, "state": "FAILED",
                              "reason": no_staging_reason(st.endpoint_id), "events": [["DISPATCHED", recv_ts]]}, seq)
            return True
        t = new_record(spec.task_id, spec.function_id, payload, spec.walltime, seq, recv_ts,
                       task_route(spec, st.placement is not None))
        st.tasks[key] = t
        if not st.staging.admit(key, t, spec):
            st.pend(key, t)
        return True

    def on_cancel(self, st: IxState, task_ids: list[str]) -> None:
        want = set(task_ids)
        found = {t[T_ID]: key for key, t in st.tasks.items() if t[T_ID] in want}
        per_manager: dict[bytes, list[int]] = {}
        mono = time.monotonic()
        for tid in want:
            key = found.get(tid)
            if key is None:
                if st.parked is None or not st.parked.cancel(st, tid):  # a parked one is dropped; else it may yet arrive
                    self.early_cancel[tid] = mono + EARLY_CANCEL_TTL_S
                continue
            t = st.tasks.pop(key)
            st.cancelled += 1
            if st.parked is not None:
                st.parked.forget(tid)
            if st.staging is not None:
                st.staging.forget(tid)
            if t[T_MGR] is not None:
                m = st.managers.get(t[T_MGR])
                if m is not None:
                    m.assigned.discard(key)
                    per_manager.setdefault(m.identity, []).append(key)
            else:
                st.n_pending -= 1  # its key stays in the deque; dispatch skips it
            self.out.task_gone(st, t[T_PACK])
        for ident, keys in per_manager.items():
            try:
                st.router.send_multipart([ident, wire.CANCEL, wire.dumps(keys)], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        if self.early_cancel:
            for tid, until in list(self.early_cancel.items()):
                if until < mono:
                    del self.early_cancel[tid]
        log.info("cancelled %d task(s) (%d running or queued on managers)", len(found),
                 sum(len(k) for k in per_manager.values()))
        st._room()
