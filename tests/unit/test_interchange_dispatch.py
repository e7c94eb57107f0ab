"""Dispatcher (endpoint_agent/interchange/dispatch.py): pending tasks to managers over a real ROUTER."""
from __future__ import annotations

import pytest
import zmq

from endpoint_agent import wire
from endpoint_agent.interchange.dispatch import Dispatcher
from endpoint_agent.interchange.results import ResultBatcher
from endpoint_agent.interchange.state import PLAIN, ManagerHandle
from endpoint_agent.task_record import T_MGR
from tests.unit.agent_parts import make_state, recv_all, registered_manager, task_record


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(0)


def _pending(st, keys, route=PLAIN, fn="f1"):
    st.packs.setdefault(1, ["receipt", 0, "alice"])
    for k in keys:
        t = task_record(f"t{k}", 1, fn=fn, route=route)
        st.tasks[k] = t
        st.packs[1][1] += 1
        st.pend(k, t)
    st.functions[fn] = f"body-of-{fn}"


def _tasks_got(sock):
    msgs = [wire.loads(body) for op, body in recv_all(sock, 0.3) if op == wire.TASKS]
    return msgs, [t[0] for msg in msgs for t in msg["t"]]


def test_free_workers_first_then_prefetch_credit(ctx):
    st = make_state(ctx)
    d = Dispatcher(ResultBatcher(st.config))
    big, big_sock = registered_manager(st, ctx, "big", workers=3, credit=5)
    small, small_sock = registered_manager(st, ctx, "small", workers=1, credit=5)
    _pending(st, range(1, 8))
    d.dispatch(st)
    msgs_big, got_big = _tasks_got(big_sock)
    msgs_small, got_small = _tasks_got(small_sock)
    # most free workers first, each up to its free workers: big 3, small 1; then the prefetch up
    # to the credit, in the same order: big 2 more (credit 5), small the last one
    assert (got_big, got_small) == ([1, 2, 3, 5, 6], [4, 7])
    assert (big.credit, small.credit) == (0, 3)
    assert big.assigned == set(got_big) and small.assigned == set(got_small)
    assert st.n_pending == 0 and not st.pending[PLAIN]
    assert all(st.tasks[k][T_MGR] == b"big" for k in got_big)
    # the function body goes once per manager, in its first message only
    assert msgs_big[0]["f"] == {"f1": "body-of-f1"} and all(m["f"] == {} for m in msgs_big[1:])
    assert big.known == {"f1"} and small.known == {"f1"}
    # a task tuple: key, function, payload, walltime, container, cores, gpus, owner
    assert msgs_big[0]["t"][0] == [1, "f1", "payload-t1", None, None, 0, 0, "alice"]


def test_a_container_task_goes_to_the_manager_with_an_idle_warm_container(ctx):
    st = make_state(ctx)
    d = Dispatcher(ResultBatcher(st.config))
    cold, cold_sock = registered_manager(st, ctx, "cold", workers=4, credit=4)
    warm, warm_sock = registered_manager(st, ctx, "warm", workers=1, credit=4, warm={"sci": 1})
    route = ("sci", 0, 0)
    _pending(st, [1], route=route)
    d.dispatch(st)
    assert _tasks_got(warm_sock)[1] == [1] and _tasks_got(cold_sock)[1] == []
    assert warm.warm == {"sci": 0}      # its idle warm container is taken


def test_a_task_no_manager_can_fit_fails_with_the_largest_node_named(ctx):
    st = make_state(ctx)
    d = Dispatcher(ResultBatcher(st.config))
    registered_manager(st, ctx, "gpu1", workers=1, credit=2, cores=4, accelerators=["0"])
    _pending(st, [1, 2], route=("none", 0, 4))
    d.dispatch(st)
    failed = d.out.results
    assert [r["task_id"] for r in failed] == ["t1", "t2"] and {r["state"] for r in failed} == {"FAILED"}
    assert "needs 1 core(s) and 4 GPU(s)" in failed[0]["reason"] and "manager gpu1" in failed[0]["reason"]
    assert st.n_pending == 0 and st.tasks == {} and d.out.acks == ["receipt"]


def test_no_credit_no_dispatch_and_a_cancelled_pending_task_is_skipped(ctx):
    st = make_state(ctx)
    d = Dispatcher(ResultBatcher(st.config))
    m, sock = registered_manager(st, ctx, "m", workers=2, credit=0)
    _pending(st, [1, 2, 3])
    d.dispatch(st)
    assert _tasks_got(sock)[1] == [] and st.n_pending == 3
    del st.tasks[2]                     # cancelled while pending: its key stays in the deque
    st.n_pending -= 1
    m.credit = 5
    d.dispatch(st)
    assert _tasks_got(sock)[1] == [1, 3] and m.credit == 3 and st.n_pending == 0


def test_a_failed_send_puts_the_tasks_back_in_front(ctx):
    st = make_state(ctx)
    d = Dispatcher(ResultBatcher(st.config))
    ghost = ManagerHandle(b"never-connected")   # ROUTER_MANDATORY: the send raises
    ghost.registered, ghost.workers, ghost.cores, ghost.credit = True, 2, 2, 4
    st.managers[ghost.identity] = ghost
    _pending(st, [1, 2, 3])
    d.dispatch(st)
    assert list(st.pending[PLAIN]) == [1, 2, 3] and st.n_pending == 3
    assert ghost.credit == 0 and ghost.assigned == set() and ghost.known == set()
    assert all(st.tasks[k][T_MGR] is None for k in (1, 2, 3))


def test_draining_and_unregistered_managers_get_nothing(ctx):
    st = make_state(ctx)
    d = Dispatcher(ResultBatcher(st.config))
    m, sock = registered_manager(st, ctx, "m", workers=2, credit=4)
    m.draining = True
    _pending(st, [1])
    d.dispatch(st)
    assert _tasks_got(sock)[1] == [] and st.n_pending == 1 and d.out.results == []
