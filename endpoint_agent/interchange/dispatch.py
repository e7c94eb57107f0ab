"""The interchange's dispatch: choosing managers for pending tasks and sending them.

Every pending task waits per route (container type, cores, GPUs) until a manager has
credit. Routing: managers that can fit the task (cores, GPUs), free workers first, then
prefetch; for a container type C, managers advertising an idle warm C first (most free
workers first), then the one with the most free capacity. Many tasks go in one TASKS
message per manager, with the bodies of the functions it has not seen yet. A task no
connected manager can fit fails with the reason. With an aAPP policy (placement.py)
the policy chooses the managers instead, and sends through `send_tasks`. The methods
take the interchange's state (state.py).
"""
from __future__ import annotations

import collections
import logging

import zmq

from endpoint_agent import wire
from endpoint_agent.interchange.results import ResultBatcher
from endpoint_agent.interchange.state import IxState, ManagerHandle
from endpoint_agent.task_record import T_FN, T_MGR, T_PACK, T_PAYLOAD, T_WALL, fail_queued

log = logging.getLogger("skyfn.agent.interchange")


class Dispatcher:
    def __init__(self, results: ResultBatcher):
        self.out = results

    def dispatch(self, st: IxState) -> None:
        live = [m for m in st.managers.values() if m.registered and not m.draining]
        if not live:
            return
        if st.placement is not None:
            st.placement.dispatch(st, live)
            return
        send = self.send_tasks
        for route, dq in list(st.pending.items()):
            if not dq:
                continue
            cands = [m for m in live if m.credit > 0 and m.fits(route)]
            if not cands:
                if not any(m.fits(route) for m in live):
                    self.fail_unfit(st, route, dq, live)
                continue
            if len(cands) > 1:
                ctype = route[0]
                if ctype != wire.NO_CONTAINER:
                    cands.sort(key=lambda m: (m.warm.get(ctype, 0) > 0, m.free_workers(), m.credit), reverse=True)
                else:
                    cands.sort(key=lambda m: (m.free_workers(), m.credit), reverse=True)
                # first pass: up to each manager's free workers; second: up to its credit (prefetch)
                for m in cands:
                    if not dq:
                        break
                    free = m.free_workers()
                    if free:
                        send(st, m, dq, min(free, m.credit), route)
            for m in cands:
                if not dq:
                    break
                if m.credit > 0:
                    send(st, m, dq, m.credit, route)

    def fail_unfit(self, st: IxState, route: tuple, dq: collections.deque, live: list[ManagerHandle]) -> None:
        """Fail every task of the route: no manager connected can fit it."""
        biggest = max(live, key=lambda m: (len(m.accelerators), m.cores))
        reason = (f"the task needs {route[1] or 1} core(s) and {route[2]} GPU(s); the largest node connected "
                  f"({biggest.hostname}, manager {biggest.id}) has {biggest.cores} core(s) and "
                  f"{len(biggest.accelerators)} GPU(s)")
        fail_queued(st, dq, reason, lambda rec, pack: self.out.add(st, rec, pack))
        st._room()

    def send_tasks(self, st: IxState, m: ManagerHandle, dq: collections.deque, n: int, route: tuple) -> None:
        """Up to n tasks of the route from dq to the manager, in one message."""
        tasks = st.tasks
        batch = []
        fids = set()
        ctype = None if route[0] == wire.NO_CONTAINER else route[0]
        cores, gpus = route[1], route[2]
        ident = m.identity
        packs = st.packs
        while dq and len(batch) < n:
            key = dq.popleft()
            t = tasks.get(key)
            if t is None:
                continue  # cancelled while pending
            pack = packs.get(t[T_PACK])
            batch.append((key, t[T_FN], t[T_PAYLOAD], t[T_WALL], ctype, cores, gpus, pack[2] if pack else None))
            fids.add(t[T_FN])
            t[T_MGR] = ident
        if not batch:
            return
        st.n_pending -= len(batch)
        new = fids - m.known
        fns = {fid: st.functions[fid] for fid in new}
        try:
            st.router.send_multipart([ident, wire.TASKS, wire.dumps({"f": fns, "t": batch})])
        except zmq.ZMQError as exc:  # not connected (yet, or any more)
            log.debug("dispatch to manager %s failed (%s); will retry", m.id, exc)
            for b in reversed(batch):
                tasks[b[0]][T_MGR] = None
                dq.appendleft(b[0])
            st.n_pending += len(batch)
            m.credit = 0
            return
        m.credit -= len(batch)  # the manager counts what it receives
        m.known |= new
        m.assigned.update(b[0] for b in batch)
        if ctype is not None and m.warm.get(ctype):
            m.warm[ctype] = max(0, m.warm[ctype] - len(batch))
