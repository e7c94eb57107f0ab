"""TaskDispatcher (endpoint_agent/manager/dispatch.py): backlog to workers over a real ROUTER, in
chunks; resources; cold starts; cancels and drains."""
from __future__ import annotations

import time

import pytest
import zmq

from endpoint_agent import wire
from endpoint_agent.manager.dispatch import TaskDispatcher
from endpoint_agent.manager.results import ResultSender
from endpoint_agent.manager.state import NONE
from endpoint_agent.manager.workers import WorkerSupervisor
from tests.unit.agent_parts import make_manager_state, reap, recv_all, worker_standin


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(0)


def _dispatcher():
    return TaskDispatcher(WorkerSupervisor(ResultSender()))


def _task(key, ctype=None, cores=None, gpus=None, fn="f1"):
    return [key, fn, f"p{key}", None, ctype, cores, gpus, "alice"]


def _got(sock):
    return [wire.loads(body) for op, body in recv_all(sock, 0.3) if op == wire.TASKS]


def test_a_large_backlog_goes_in_chunks_and_a_second_chunk_per_worker(ctx):
    st, _ = make_manager_state(ctx, 2, cores=2)
    d = _dispatcher()
    try:
        a, a_sock = worker_standin(ctx, st, 0)
        b, b_sock = worker_standin(ctx, st, 1)
        st.functions["f1"] = "body"
        for k in range(100):
            st._queue(_task(k))
        d.dispatch(st)
        # avg task 0.5 ms: chunks of CHUNK_TARGET_S / 0.5 ms = 10; a large backlog: a second chunk each
        ma, mb = _got(a_sock), _got(b_sock)
        assert [[t[0] for t in m["t"]] for m in ma] == [list(range(0, 10)), list(range(20, 30))]
        assert [[t[0] for t in m["t"]] for m in mb] == [list(range(10, 20)), list(range(30, 40))]
        assert ma[0]["f"] == {"f1": "body"} and ma[1]["f"] == {}          # the body once per worker
        assert ma[0]["t"][0] == [0, "f1", "p0", None, None, "alice"]      # key, fn, payload, walltime, env, owner
        assert st.n_backlog == 60 and len(a.inflight) == 20 and st.cores_free == 0 and a.cores == 1
        # small backlog, one idle worker: single tasks
        st2, _ = make_manager_state(ctx, 1)
        try:
            c, c_sock = worker_standin(ctx, st2, 0)
            st2.functions["f1"] = "body"
            for k in range(3):
                st2._queue(_task(k))
            d.dispatch(st2)
            assert [[t[0] for t in m["t"]] for m in _got(c_sock)] == [[0]]
        finally:
            reap(st2)
    finally:
        reap(st)


def test_gpu_tasks_run_alone_with_their_devices_and_wait_for_room(ctx):
    st, _ = make_manager_state(ctx, 3, cores=4, accelerators=["0", "1"])
    d = _dispatcher()
    try:
        socks = [worker_standin(ctx, st, i)[1] for i in range(3)]
        st._queue(_task(1, cores=2, gpus=2))
        st._queue(_task(2, gpus=1))
        d.dispatch(st)
        got = [m for s in socks for m in _got(s)]
        assert len(got) == 1 and got[0]["t"][0][4] == {"OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": "0,1"}
        assert st.gpus_free == [] and st.cores_free == 2 and [t[0] for t in st.rbacklog] == [2]
        w = next(w for w in st.workers if w.inflight)
        st._release(w)                      # its result came back
        w.inflight.clear()
        d.dispatch(st)
        got = [m for s in socks for m in _got(s)]
        assert len(got) == 1 and got[0]["t"][0][0] == 2 and got[0]["t"][0][4]["CUDA_VISIBLE_DEVICES"] == "0"
    finally:
        reap(st)


def test_no_idle_worker_of_a_type_turns_an_idle_worker_of_another_into_one(ctx):
    st, _ = make_manager_state(ctx, 2, containers={"runtime": "none"})
    d = _dispatcher()
    try:
        a, a_sock = worker_standin(ctx, st, 0, "a")
        busy, _ = worker_standin(ctx, st, 1, "b")
        busy.inflight.append(_task(0, "b"))
        st._queue(_task(1, "b"))
        d.dispatch(st)
        assert _got(a_sock) == []
        assert st.slot_type == ["b", "b"] and a.kill_reason == ("evict", -1, "evicted") and not a.ready
        assert st.respawn_at[0] == 0.0 and st.n_backlog == 1     # the task waits for the new worker
    finally:
        reap(st)


def test_a_send_to_a_gone_worker_puts_the_tasks_back(ctx):
    st, _ = make_manager_state(ctx, 1)
    d = _dispatcher()
    try:
        w, sock = worker_standin(ctx, st, 0)
        sock.close(0)                       # the worker is gone: ROUTER_MANDATORY makes the send fail
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                st.wsock.send_multipart([w.identity, b"probe", b""])
            except zmq.ZMQError:
                break
            time.sleep(0.01)
        for k in range(3):
            st._queue(_task(k))
        st.functions["f1"] = "body"
        d.dispatch(st)
        assert [t[0] for t in st.backlog[NONE]] == [0, 1, 2] and st.n_backlog == 3
        assert not w.ready and w.inflight == type(w.inflight)() and st.cores_free == 1 and w.known == set()
    finally:
        reap(st)


def test_cancel_drops_queued_tasks_and_kills_a_running_one_and_drain_gives_back_the_rest(ctx):
    st, _ = make_manager_state(ctx, 1)
    d = _dispatcher()
    try:
        w, _ = worker_standin(ctx, st, 0)
        w.inflight.append(_task(1))
        st.slots.begin(0, 1, time.time())
        for k in (2, 3, 4):
            st._queue(_task(k))
        d.on_cancel(st, [1, 3])
        assert [t[0] for t in st.backlog[NONE]] == [2, 4] and st.n_backlog == 2
        assert st.cancelled == {1} and w.kill_reason == ("cancelled", 1, "cancelled")
        d.start_drain(st)
        assert st.draining and st.back_out == [2, 4] and st.n_backlog == 0 and not st.backlog[NONE]
        d.start_drain(st)
        assert st.back_out == [2, 4]        # once
    finally:
        reap(st)
