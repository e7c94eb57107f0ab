"""The manager's result sending: results from the workers, reports and credit to the interchange.

Workers send their results in batches (RES) and say READY when started. A result takes
its task off the worker (in order), frees the worker's cores and accelerators when it
has nothing left, feeds the measured task duration that sizes chunks (dispatch.py),
and is forwarded unless its task was cancelled. Once per loop round everything due goes
to the interchange, one message per kind: results (RES), tasks running for a while
(RUN), tasks lost, timed out or failed here (LOST), tasks given back unstarted on a drain
(BACK); then, unless stopping or draining, a request for more tasks (REQ) when the
credit held has dropped by a quarter of the capacity (or to nothing). The methods take
the manager's state (state.py).
"""
from __future__ import annotations

import time

import zmq

from endpoint_agent import wire
from endpoint_agent.manager.state import NONE, ManagerState, WorkerProc


class ResultSender:

    def drain_workers(self, st: ManagerState) -> None:
        sock = st.wsock
        by_identity = st.by_identity
        EVENTS, POLLIN = zmq.EVENTS, zmq.POLLIN
        while True:
            try:  # ZMQ_EVENTS first: cheaper than a recv that raises Again
                if not sock.getsockopt(EVENTS) & POLLIN:
                    return
                identity, op, body = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            w = by_identity.get(identity)
            if w is None:
                continue  # a replaced worker's last words: its tasks were already requeued
            if op == wire.RES:
                self.on_results(st, w, wire.loads(body))
            elif op == wire.READY:
                w.ready = True
                st.fail_streak[w.slot] = 0
                st.warm_dirty = True

    def on_results(self, st: ManagerState, w: WorkerProc, results: list) -> None:
        inflight = w.inflight
        cancelled = st.cancelled
        running_reported = st.running_reported
        for res in results:
            key = res[0]
            if inflight and inflight[0][0] == key:
                inflight.popleft()
            else:  # out of order should not happen; stay correct anyway
                for i, task in enumerate(inflight):
                    if task[0] == key:
                        del inflight[i]
                        break
            w.reported += 1
            if running_reported:
                running_reported.discard(key)
        if cancelled:
            results = [r for r in results if r[0] not in cancelled or cancelled.discard(r[0])]
        if not inflight:
            st._release(w)
            w.last_used = time.monotonic()
            st.warm_dirty = st.warm_dirty or w.ctype != NONE
        if results:
            last = results[-1]
            st.avg_task_s = 0.8 * st.avg_task_s + 0.2 * max(1e-6, last[5] - last[4])
            st.results.extend(results)

    def send_upstream(self, st: ManagerState) -> None:
        ix = st.ix
        if st.results:
            ix.send_multipart([wire.RES, wire.dumps(st.results)])
            st.results = []
        if st.running_out:
            ix.send_multipart([wire.RUN, wire.dumps(st.running_out)])
            st.running_out = []
        if st.lost_out:
            ix.send_multipart([wire.LOST, wire.dumps(st.lost_out)])
            st.lost_out = []
        if st.back_out:
            ix.send_multipart([wire.BACK, wire.dumps(st.back_out)])
            st.back_out = []
        if st.stopping or st.draining:
            return
        held = st.held()
        want = st.capacity - held - st.requested
        if want > 0 and (want >= max(1, st.capacity // 4) or held + st.requested == 0):
            ix.send_multipart([wire.REQ, wire.dumps(want)])
            st.requested += want
