"""IxState (endpoint_agent/interchange/state.py): the interchange's shared bookkeeping."""
from __future__ import annotations

import threading

import pytest
import zmq

from endpoint_agent.interchange.state import PLAIN, ManagerHandle
from tests.unit.agent_parts import make_state, task_record


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(0)


def test_pend_appends_and_pend_front_prepends_per_route(ctx):
    st = make_state(ctx)
    gpu = ("none", 0, 1)
    st.pend(1, task_record("a", 1))
    st.pend(2, task_record("b", 1))
    st._pend_front(3, task_record("c", 1))
    st.pend(4, task_record("d", 1, route=gpu))
    assert list(st.pending[PLAIN]) == [3, 1, 2]
    assert list(st.pending[gpu]) == [4]
    assert st.n_pending == 4


def test_load_and_capacity(ctx):
    st = make_state(ctx, prefetch=1)     # workers 1, no local manager: config.capacity 2
    st.tasks = {1: task_record("a", 1), 2: task_record("b", 1)}
    st.given, st.taken = 10, 7          # three delivered by the poller, not taken yet
    assert st.load() == 5
    assert st.capacity() == 2           # no manager: the configured floor
    busy = ManagerHandle(b"m1")
    busy.registered, busy.workers = True, 4
    draining = ManagerHandle(b"m2")
    draining.registered, draining.workers, draining.draining = True, 8, True
    unregistered = ManagerHandle(b"m3")
    unregistered.workers = 16
    for m in (busy, draining, unregistered):
        st.managers[m.identity] = m
    assert st.capacity() == 5           # 4 workers of the registered, not draining one + prefetch 1


def test_room_sets_the_poller_event_only_below_capacity(ctx):
    st = make_state(ctx, prefetch=1)     # capacity 2
    st.room_event = ev = threading.Event()
    st.tasks = {1: task_record("a", 1), 2: task_record("b", 1)}
    st._room()
    assert not ev.is_set()              # full
    del st.tasks[2]
    st._room()
    assert ev.is_set()


def test_manager_handle_free_workers_fits_and_info():
    m = ManagerHandle(b"node-1")
    m.workers, m.cores, m.accelerators = 4, 8, ["0", "1"]
    m.assigned = {1, 2, 3}
    assert m.free_workers() == 1
    m.assigned |= {4, 5}
    assert m.free_workers() == 0        # never negative
    assert m.fits(("none", 8, 2)) and not m.fits(("none", 9, 0)) and not m.fits(("none", 0, 3))
    info = m.info()
    assert info["id"] == "node-1" and info["assigned"] == 5 and info["block"] == "?" and info["local"] is False
    assert info["accelerators"] == ["0", "1"] and info["accelerators"] is not m.accelerators
