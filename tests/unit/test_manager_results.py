"""ResultSender (endpoint_agent/manager/results.py): worker results in, results/reports/credit out,
over real ROUTER/DEALER sockets."""
from __future__ import annotations

import pytest
import zmq

from endpoint_agent import wire
from endpoint_agent.manager.results import ResultSender
from tests.unit.agent_parts import make_manager_state, reap, recv_all, worker_standin


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(0)


def _task(key):
    return [key, "f", "p", None, None, None, None, None]


def _result(key, start=1.0, done=1.002):
    return [key, "SUCCEEDED", "r", None, start, done, None, None]


def _wait(sock):
    assert sock.poll(2000)


def test_ready_and_results_from_workers(ctx):
    st, _ = make_manager_state(ctx, 2, cores=2)
    sender = ResultSender()
    try:
        w, sock = worker_standin(ctx, st, 0, "sci", ready=False)
        st.fail_streak[0] = 3
        sock.send_multipart([wire.READY, b""])
        _wait(st.wsock)
        sender.drain_workers(st)
        assert w.ready and st.fail_streak[0] == 0 and st.warm_dirty
        w.inflight.extend([_task(1), _task(2), _task(3)])
        w.cores = 1
        st.cores_free = 1
        st.running_reported.add(1)
        st.cancelled.add(2)             # cancelled while running: its result is dropped
        sock.send_multipart([wire.RES, wire.dumps([_result(1), _result(2)])])
        _wait(st.wsock)
        sender.drain_workers(st)
        assert [t[0] for t in w.inflight] == [3] and w.reported == 2
        assert [r[0] for r in st.results] == [1] and st.cancelled == set() and st.running_reported == set()
        assert w.cores == 1             # still has a task: keeps its core
        sock.send_multipart([wire.RES, wire.dumps([_result(3, 2.0, 2.1)])])
        _wait(st.wsock)
        sender.drain_workers(st)
        assert w.inflight == type(w.inflight)() and w.cores == 0 and st.cores_free == 2
        assert st.avg_task_s == pytest.approx(0.8 * (0.8 * 0.0005 + 0.2 * 0.002) + 0.2 * 0.1)
        # a replaced worker's last words are ignored
        st.by_identity.clear()
        sock.send_multipart([wire.RES, wire.dumps([_result(4)])])
        _wait(st.wsock)
        sender.drain_workers(st)
        assert [r[0] for r in st.results] == [1, 3]
    finally:
        reap(st)


def test_send_upstream_sends_each_kind_then_asks_for_credit(ctx):
    st, ix = make_manager_state(ctx, 2, prefetch=6)      # capacity 8
    sender = ResultSender()
    try:
        st.results = [_result(1)]
        st.running_out = [[2, 5.0]]
        st.lost_out = [[3, "died", "worker died"]]
        st.back_out = [4]
        sender.send_upstream(st)
        got = [(op, wire.loads(body)) for _, op, body in recv_all(ix)]
        assert got == [(wire.RES, [_result(1)]), (wire.RUN, [[2, 5.0]]), (wire.LOST, [[3, "died", "worker died"]]),
                       (wire.BACK, [4]), (wire.REQ, 8)]
        assert (st.results, st.running_out, st.lost_out, st.back_out, st.requested) == ([], [], [], [], 8)
        # credit again only when a quarter of the capacity is wanted
        st.requested = 7
        sender.send_upstream(st)
        assert recv_all(ix, 0.2) == []
        st.requested = 6
        sender.send_upstream(st)
        assert [(op, wire.loads(b)) for _, op, b in recv_all(ix)] == [(wire.REQ, 2)] and st.requested == 8
        # draining: reports still go, credit is not asked
        st.requested, st.draining, st.back_out = 0, True, [9]
        sender.send_upstream(st)
        assert [op for _, op, _ in recv_all(ix)] == [wire.BACK] and st.requested == 0
    finally:
        reap(st)
