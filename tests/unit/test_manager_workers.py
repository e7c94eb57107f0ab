"""WorkerSupervisor (endpoint_agent/manager/workers.py): worker processes, deaths, walltimes,
RUNNING reports and idle containers, with real processes and real progress slots."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
import zmq

from endpoint_agent.manager.results import ResultSender
from endpoint_agent.manager.state import NONE
from endpoint_agent.manager.workers import WorkerSupervisor
from tests.unit.agent_parts import make_manager_state, reap, worker_standin


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(0)


def _task(key, walltime=None):
    return [key, "f", "p", walltime, None, None, None, None]


def _dead(code=3):
    p = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    p.wait(30)
    return p


def _wait_exit(proc):
    proc.wait(10)


def test_a_dead_worker_reports_its_running_task_lost_and_requeues_the_rest(ctx):
    st, _ = make_manager_state(ctx, 2)
    sup = WorkerSupervisor(ResultSender())
    try:
        w, _ = worker_standin(ctx, st, 0, proc=_dead())
        w.inflight.extend([_task(2), _task(3), _task(4)])
        w.reported = 1                  # task 1 done; 2 started (the 2nd task it began) and running
        w.cores, st.cores_free = 1, 1
        st.slots.begin(0, 2, time.time())
        st._queue(_task(9))
        st.stopping = True              # no respawn here: the slot stays empty
        sup.check_workers(st, time.time())
        assert [(k, kind) for k, kind, _ in st.lost_out] == [(2, "died")]
        assert st.lost_out[0][2] == f"worker process {w.proc.pid} exited with code 3 while running the task"
        assert [t[0] for t in st.backlog[NONE]] == [3, 4, 9] and st.n_backlog == 3   # back in front, in order
        assert st.workers[0] is None and w.identity not in st.by_identity and st.cores_free == 2
        assert st.fail_streak[0] == 0 and st.respawn_at[0] <= time.monotonic()    # it had run a task: no backoff
    finally:
        reap(st)


def test_quick_deaths_in_a_row_back_off(ctx):
    st, _ = make_manager_state(ctx, 1)
    sup = WorkerSupervisor(ResultSender())
    try:
        st.stopping = True
        for streak in (1, 2, 3):
            w, _ = worker_standin(ctx, st, 0, proc=_dead(), ready=False)
            before = time.monotonic()
            sup.check_workers(st, time.time())
            assert st.fail_streak[0] == streak
            delay = 0.0 if streak <= 1 else 0.1 * 2 ** streak
            assert st.respawn_at[0] == pytest.approx(before + delay, abs=0.05)
    finally:
        reap(st)


def test_walltime_kills_the_worker_and_reports_a_timeout(ctx):
    st, _ = make_manager_state(ctx, 1)
    sup = WorkerSupervisor(ResultSender())
    try:
        w, _ = worker_standin(ctx, st, 0)
        w.inflight.append(_task(5, walltime=1.0))
        st.slots.begin(0, 1, time.time() - 5)
        sup.check_workers(st, time.time())
        assert w.kill_reason == ("timeout", 5, "walltime of 1 s exceeded")
        _wait_exit(w.proc)
        st.stopping = True
        sup.check_workers(st, time.time())
        assert st.lost_out == [[5, "timeout", "walltime of 1 s exceeded"]] and st.workers[0] is None
    finally:
        reap(st)


def test_a_long_task_is_reported_running_once_and_a_cancelled_one_is_killed_silently(ctx):
    st, _ = make_manager_state(ctx, 2)
    sup = WorkerSupervisor(ResultSender())
    try:
        long_w, _ = worker_standin(ctx, st, 0)
        long_w.inflight.append(_task(7))
        ts = time.time() - 1.0
        st.slots.begin(0, 1, ts)
        sup.check_workers(st, time.time())
        sup.check_workers(st, time.time())
        assert st.running_out == [[7, ts]] and st.running_reported == {7} and long_w.kill_reason is None
        gone, _ = worker_standin(ctx, st, 1)
        gone.inflight.append(_task(8))
        st.slots.begin(1, 1, time.time())
        st.cancelled.add(8)
        sup.check_workers(st, time.time())
        assert gone.kill_reason == ("cancelled", 8, "cancelled")
        _wait_exit(gone.proc)
        st.stopping = True
        sup.check_workers(st, time.time())
        assert st.lost_out == [] and st.cancelled == set() and st.workers[1] is None
    finally:
        reap(st)


def test_an_idle_container_past_its_timeout_is_stopped_and_its_slot_turns_plain(ctx):
    st, _ = make_manager_state(ctx, 1, containers={"idle_timeout": 1, "runtime": "none"})
    sup = WorkerSupervisor(ResultSender())
    try:
        w, _ = worker_standin(ctx, st, 0, "sci")
        w.last_used = time.monotonic() - 2
        sup.check_workers(st, time.time())
        assert st.slot_type[0] == NONE and w.kill_reason == ("evict", -1, "idle")
    finally:
        reap(st)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract unix sockets")
def test_spawn_starts_a_real_worker_that_says_ready_and_stop_workers_ends_it(ctx):
    st, _ = make_manager_state(ctx, 1, worker_addr=f"ipc://@skyfn-test-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    sender = ResultSender()
    sup = WorkerSupervisor(sender)
    try:
        sup.spawn(st, 0)
        w = st.workers[0]
        assert w is not None and st.by_identity[w.identity] is w and st.gen == 1 and w.identity == b"w0.1"
        assert st.cold_starts == 0      # a plain worker is no cold start
        deadline = time.monotonic() + 30
        while not w.ready and time.monotonic() < deadline:
            if st.wsock.poll(100):
                sender.drain_workers(st)
        assert w.ready
        sup.stop_workers(st)
        assert w.proc.poll() is not None
    finally:
        reap(st)
