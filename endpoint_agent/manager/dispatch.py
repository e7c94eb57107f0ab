"""The manager's task dispatch: backlog to workers inside the node.

Tasks go to ready workers over the ROUTER socket in chunks sized to the backlog and the
measured task duration: single tasks when the backlog is small or tasks are long
(latency, load balance), chunks of up to MAX_CHUNK short tasks when the backlog is large
(throughput), and a second chunk per worker on a large backlog so none waits for a round
trip. A task of type C goes to an idle worker of type C (warm); when there is none, the
warm-pool policy may turn an idle worker of another type into a C worker (a cold start).
With `routing: random` each task is bound to a random slot instead.

Resources: a task's {"cores", "gpus"} are granted from the node's cores and accelerators;
a task needing GPUs runs alone on a worker with CUDA_VISIBLE_DEVICES set to the ids
assigned to it (and OMP_NUM_THREADS to its cores); workers are held back rather than
oversubscribe the node. Cancels drop queued tasks and have the supervisor kill running
ones; a drain gives every queued task back. The methods take the manager's state
(state.py).
"""
from __future__ import annotations

import collections
import logging
import time

import zmq

from endpoint_agent import wire
from endpoint_agent.manager.state import CHUNK_TARGET_S, MAX_CHUNK, NONE, ManagerState, WorkerProc, _owner
from endpoint_agent.manager.workers import WorkerSupervisor

log = logging.getLogger("skyfn.manager")


class TaskDispatcher:
    def __init__(self, supervisor: WorkerSupervisor):
        self.sup = supervisor

    def _wire_task(self, task: list, env: dict | None = None) -> list:
        return [task[0], task[1], task[2], task[3], env, _owner(task)]

    def dispatch(self, st: ManagerState) -> None:
        if not st.n_backlog:
            return
        workers = st.workers
        ready = [w for w in workers if w is not None and w.ready and w.kill_reason is None]
        if not ready:
            return
        if st.rbacklog:
            self._dispatch_resources(st, ready)
        if st.routing == "random":
            return self._dispatch_random(st, ready)
        for ctype, dq in st.backlog.items():
            if not dq:
                continue
            mine = [w for w in ready if w.ctype == ctype] if ctype != NONE or len(st.backlog) > 1 or \
                st.slot_type.count(NONE) != st.n_workers else ready
            n = len(mine)
            if n:
                by_time = int(CHUNK_TARGET_S / st.avg_task_s) if st.avg_task_s > 0 else MAX_CHUNK
                size = max(1, min(MAX_CHUNK, len(dq) // (2 * n), by_time))
                for w in mine:
                    if not dq:
                        break
                    if not w.inflight and not w.gpus and st.cores_free >= 1:
                        st.cores_free -= 1
                        w.cores = 1
                        self.send_chunk(st, w, dq, size)
                # Large backlog: give each worker a second chunk so it never waits for a round trip.
                if size > 1 and len(dq) >= 4 * n:
                    for w in mine:
                        if dq and w.inflight and w.cores == 1 and not w.gpus and len(w.inflight) <= size:
                            self.send_chunk(st, w, dq, size)
            if dq and not st.draining:
                self._convert(st, ctype, ready)

    def _convert(self, st: ManagerState, ctype: str, ready: list[WorkerProc]) -> None:
        """No idle worker of this type: maybe cold-start one in place of an idle other-type worker.
        Not one whose own type has queued tasks: dispatch feeds it later in the same pass."""
        backlog = st.backlog
        idle = [w for w in ready if not w.inflight and w.ctype != ctype and not backlog.get(w.ctype)]
        if not idle:
            return
        workers = st.workers
        starting = sum(1 for s, t in enumerate(st.slot_type) if t == ctype and (workers[s] is None or not workers[s].ready))
        if starting >= (len(backlog.get(ctype, ())) or 1):
            return  # workers of this type already starting will take its queued tasks
        counts = collections.Counter(st.slot_type)
        backlog = {t: len(d) for t, d in st.backlog.items()}
        w = st.pool.victim(ctype, idle, counts, backlog, st.n_workers)
        if w is None:
            return
        log.info("worker %s: %s -> %s (cold start)", w.slot, w.ctype, ctype)
        st.slot_type[w.slot] = ctype
        self.sup.kill_worker(st, w, "evict", -1, "evicted")
        st.respawn_at[w.slot] = 0.0
        w.ready = False
        ready.remove(w)  # dispatch's list: nothing more is sent to it in this pass

    def _dispatch_random(self, st: ManagerState, ready: list[WorkerProc]) -> None:
        """containers.routing: random (funcX's baseline): each task is bound to a slot drawn
        uniformly at random (kept in the backlog under the slot's int index, so cancel and
        drain see it) and waits for it; a slot whose worker is of another type is restarted
        as the task's type (a cold start). One task at a time per worker."""
        backlog = st.backlog
        n = st.n_workers
        new = []
        for key, dq in backlog.items():
            if dq and not isinstance(key, int):
                new.extend(dq)
                dq.clear()
        for task in sorted(new, key=lambda t: t[0]):  # keys grow in arrival order
            backlog.setdefault(st.rng.randrange(n), collections.deque()).append(task)
        for w in ready:
            dq = backlog.get(w.slot)
            if not dq or w.inflight or w.gpus:
                continue
            ctype = dq[0][4] or NONE
            if w.ctype != ctype:
                if not st.draining:
                    log.info("worker %s: %s -> %s (random routing, cold start)", w.slot, w.ctype, ctype)
                    st.slot_type[w.slot] = ctype
                    self.sup.kill_worker(st, w, "evict", -1, "evicted")
                    st.respawn_at[w.slot] = 0.0
                    w.ready = False
                continue
            if st.cores_free >= 1:
                st.cores_free -= 1
                w.cores = 1
                self.send_chunk(st, w, dq, 1)

    def _dispatch_resources(self, st: ManagerState, ready: list[WorkerProc]) -> None:
        """Tasks with cores/GPUs: one at a time, on an idle worker, when the node has room."""
        rb = st.rbacklog
        for _ in range(len(rb)):
            task = rb[0]
            cores, gpus = task[5] or 1, task[6] or 0
            if cores > st.cores_free or gpus > len(st.gpus_free):
                break  # in order: hold workers back until the node has room for it
            ctype = task[4] or NONE
            w = next((w for w in ready if not w.inflight and w.ctype == ctype), None)
            if w is None:
                if not st.draining:
                    self._convert(st, ctype, ready)
                break
            rb.popleft()
            st.n_backlog -= 1
            st.cores_free -= cores
            w.cores = cores
            w.gpus = [st.gpus_free.pop(0) for _ in range(gpus)]
            env = {"OMP_NUM_THREADS": str(cores)}
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(w.gpus)
            self._send(st, w, [task], [self._wire_task(task, env)])

    def send_chunk(self, st: ManagerState, w: WorkerProc, dq: collections.deque, size: int) -> None:
        chunk = [dq.popleft() for _ in range(min(size, len(dq)))]
        st.n_backlog -= len(chunk)
        self._send(st, w, chunk, [[t[0], t[1], t[2], t[3], None, _owner(t)] for t in chunk])

    def _send(self, st: ManagerState, w: WorkerProc, chunk: list, wire_tasks: list) -> None:
        fids = {t[1] for t in chunk} - w.known
        fns = {fid: st.functions[fid] for fid in fids if fid in st.functions}
        try:
            st.wsock.send_multipart([w.identity, wire.TASKS, wire.dumps({"f": fns, "t": wire_tasks})])
        except zmq.ZMQError:  # the worker is gone; its death is handled on the next check
            for task in reversed(chunk):
                st._queue_front(task)
            if not w.inflight:
                st._release(w)
            w.ready = False
            return
        w.known |= fids
        w.inflight.extend(chunk)
        if w.ctype != NONE:
            st.warm_dirty = True

    # --- from the interchange -------------------------------------------------
    def on_cancel(self, st: ManagerState, keys: list[int]) -> None:
        want = set(keys)
        for dq in list(st.backlog.values()) + [st.rbacklog]:
            if want and any(t[0] in want for t in dq):
                kept = [t for t in dq if t[0] not in want]
                st.n_backlog -= len(dq) - len(kept)
                want -= {t[0] for t in dq}
                dq.clear()
                dq.extend(kept)
        for w in st.workers:
            if w is None or not want:
                continue
            for task in w.inflight:
                if task[0] in want:
                    st.cancelled.add(task[0])
                    want.discard(task[0])
        if st.cancelled:
            self.sup.check_workers(st, time.time())  # kill the running ones now

    def start_drain(self, st: ManagerState) -> None:
        if st.draining:
            return
        st.draining = True
        log.info("draining: taking no more tasks; %d queued task(s) given back", st.n_backlog)
        for dq in list(st.backlog.values()) + [st.rbacklog]:
            st.back_out.extend(t[0] for t in dq)
            dq.clear()
        st.n_backlog = 0
