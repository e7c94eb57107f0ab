"""ManagerState (endpoint_agent/manager/state.py) and the containers setup (endpoint_agent/manager/containers.py)."""
from __future__ import annotations

import logging

import pytest
import zmq

from endpoint_agent.manager.containers import SimplePool, configure
from endpoint_agent.manager.state import NONE, WorkerProc
from tests.unit.agent_parts import make_manager_state, reap, worker_standin


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(0)


def _task(key, ctype=None, cores=None, gpus=None):
    return [key, "f", "p", None, ctype, cores, gpus, "alice"]


def test_queue_sorts_tasks_by_type_and_resources_and_fails_what_the_node_cannot_fit(ctx):
    st, _ = make_manager_state(ctx, 2, cores=4, accelerators=["0"])
    try:
        for t in (_task(1), _task(2, "sci"), _task(3, cores=2), _task(4, gpus=1), _task(5, cores=1),
                  _task(6, gpus=2), _task(7, cores=8)):
            st._queue(t)
        assert [t[0] for t in st.backlog[NONE]] == [1, 5] and [t[0] for t in st.backlog["sci"]] == [2]
        assert [t[0] for t in st.rbacklog] == [3, 4]
        assert st.n_backlog == 5 and st.held() == 5
        assert [(k, kind) for k, kind, _ in st.lost_out] == [(6, "fail"), (7, "fail")]
        assert "needs 1 core(s) and 2 GPU(s)" in st.lost_out[0][2] and "1 GPU(s) ['0']" in st.lost_out[0][2]
        assert "manager mgr-test" in st.lost_out[1][2] and "4 core(s)" in st.lost_out[1][2]
        assert st.pool.received == {NONE: 4, "sci": 1}   # what the warm pool's shares see
        st._queue_front(_task(8))
        st._queue_front(_task(9, gpus=1))
        assert st.backlog[NONE][0][0] == 8 and st.rbacklog[0][0] == 9 and st.n_backlog == 7
    finally:
        reap(st)


def test_release_returns_a_workers_cores_and_gpus_and_warm_counts_idle_containers(ctx):
    st, _ = make_manager_state(ctx, 3, cores=4, accelerators=["0", "1"])
    try:
        a, _ = worker_standin(ctx, st, 0, "sci")
        b, _ = worker_standin(ctx, st, 1, "sci")
        worker_standin(ctx, st, 2)
        st.cores_free, st.gpus_free = 1, []
        a.cores, a.gpus = 3, ["1", "0"]
        st._release(a)
        assert (st.cores_free, st.gpus_free, a.cores, a.gpus) == (4, ["1", "0"], 0, [])
        b.inflight.append(_task(1, "sci"))
        assert st.warm() == ({"sci": 1}, {"sci": 2})     # plain workers are left out
        b.kill_reason = ("evict", -1, "idle")
        assert st.warm() == ({"sci": 1}, {"sci": 1})
        assert st.held() == 1
    finally:
        reap(st)


def test_configure_defaults_a_bad_routing_and_a_seeded_rng(caplog):
    setup = configure({}, 4)
    assert (setup.routing, setup.idle_timeout, setup.runtime) == ("warm", 300.0, None)
    assert isinstance(setup.pool, SimplePool)
    with caplog.at_level(logging.ERROR, logger="skyfn.manager"):
        bad = configure({"routing": "lru", "idle_timeout": 5, "routing_seed": 7, "runtime": "none"}, 2)
    assert bad.routing == "warm" and bad.idle_timeout == 5.0
    assert "containers.routing 'lru' is not one of: warm, random" in caplog.text
    r1, r2 = configure({"routing_seed": 3}, 2).rng, configure({"routing_seed": 3}, 2).rng
    assert [r1.randrange(10) for _ in range(8)] == [r2.randrange(10) for _ in range(8)]


def test_simple_pool_victim_prefers_types_over_their_share_and_spares_types_with_a_backlog():
    pool = SimplePool(4)
    pool.demand = None                  # plain counts (without endpoint_agent.containers' WarmPool)
    pool.note("a", 1)
    pool.note("b", 3)
    assert pool.shares(4) == {"a": 1, "b": 3}

    def w(slot, ctype, last_used):
        x = WorkerProc(slot, 1, None, b"w", ctype)
        x.last_used = last_used
        return x

    a1, a2, c1 = w(0, "a", 5.0), w(1, "a", 1.0), w(2, "c", 0.5)
    counts = {"a": 2, "b": 0, "c": 1}
    # "a" is over its share (2 > 1) and "c" has none: over-share types first, least recently used first
    assert pool.victim("b", [a1, a2, c1], counts, {}, 4) is c1
    assert pool.victim("b", [a1, a2], counts, {}, 4) is a2
    # a type with queued tasks is spared unless it is over its share
    assert pool.victim("b", [c1], {"c": 0, "b": 1}, {"c": 2}, 4) is None
