"""ManagerRegistry (endpoint_agent/interchange/managers.py): registration, heartbeats, lost managers and
the requeue of their tasks, drains, local manager slots, snapshots; over a real ROUTER."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import zmq

from endpoint_agent import wire
from endpoint_agent.interchange.managers import ManagerRegistry
from endpoint_agent.interchange.results import ResultBatcher
from endpoint_agent.interchange.state import PLAIN, ManagerHandle
from endpoint_agent.task_record import T_MGR, T_TRIES
from tests.unit.agent_parts import connect_dealer, make_state, recv_all, registered_manager, task_record


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(0)


def _registry(st):
    return ManagerRegistry(st.config, ResultBatcher(st.config))


def _assign(st, m, keys):
    st.packs.setdefault(1, ["receipt", 0, None])
    for k in keys:
        t = task_record(f"t{k}", 1)
        t[T_MGR] = m.identity
        st.tasks[k] = t
        st.packs[1][1] += 1
        m.assigned.add(k)


def _ops(sock):
    return [op for op, _ in recv_all(sock, 0.3)]


def test_a_registration_fills_the_handle_and_an_unknown_sender_is_told_to_stop(ctx):
    st = make_state(ctx)
    st.room_event = room = threading.Event()
    reg = _registry(st)
    sock = connect_dealer(ctx, st.address, "node-7")
    sock.send_multipart([wire.REG, b"{}"])
    assert st.router.poll(2000)
    identity, op, _ = st.router.recv_multipart()
    m = reg.unknown(st, identity, op, time.monotonic())
    assert m is not None and st.managers[b"node-7"] is m and not m.registered
    reg.on_register(st, m, {"hostname": "n7", "pid": 42, "block": "b3", "workers": 4, "cores": 8,
                            "accelerators": ["0"], "warm": {"sci": 1}, "containers": {"sci": 2}, "cold_starts": 3})
    assert (m.registered, m.hostname, m.pid, m.block, m.workers, m.cores) == (True, "n7", 42, "b3", 4, 8)
    assert m.accelerators == ["0"] and m.warm == {"sci": 1} and m.cold_starts == 3 and st.roster == 1
    assert room.is_set()
    # a message (not REG) from an identity the registry does not know: STOP, once remembered
    stranger = connect_dealer(ctx, st.address, "stranger")
    stranger.send_multipart([wire.HB, b"{}"])
    assert st.router.poll(2000)
    identity, op, _ = st.router.recv_multipart()
    assert reg.unknown(st, identity, op, time.monotonic()) is None
    assert _ops(stranger) == [wire.STOP] and b"stranger" in reg.told_to_stop and b"stranger" not in st.managers
    # ... and its REG is refused while it is remembered
    assert reg.unknown(st, b"stranger", wire.REG, time.monotonic()) is None


def test_a_heartbeat_updates_the_handle_and_is_answered(ctx):
    st = make_state(ctx)
    reg = _registry(st)
    m, sock = registered_manager(st, ctx, "m1")
    reg.on_heartbeat(st, m, {"running": [5, 6], "free": 1, "warm": {"a": 1}, "containers": {"a": 2},
                             "cold_starts": 9, "workers": [101, 102]})
    assert (m.running, m.free_hb, m.warm, m.cold_starts, m.worker_pids) == ([5, 6], 1, {"a": 1}, 9, [101, 102])
    assert m.last_heartbeat is not None and _ops(sock) == [wire.HB]


def test_a_lost_manager_requeues_its_tasks_in_front_and_charges_the_running_ones(ctx):
    st = make_state(ctx, max_task_retries=1)
    reg = _registry(st)
    m, sock = registered_manager(st, ctx, "m1")
    _assign(st, m, [1, 2, 3])
    st.tasks[9] = task_record("t9", 1)
    st.pend(9, st.tasks[9])                # already pending: the requeued ones go before it
    st.tasks[3][T_TRIES] = 1                # 3 has used its one retry
    m.running = [2, 3]                      # at its last heartbeat
    reg.lose_manager(st, m, "silent", time.monotonic())
    # the unstarted ones first go back in front (1), then the charged ones that have a retry left (2)
    assert list(st.pending[PLAIN]) == [2, 1, 9]
    assert st.tasks[2][T_TRIES] == 1 and st.tasks[1][T_TRIES] == 0 and st.retried == 1
    failed = reg.out.results
    assert [r["task_id"] for r in failed] == ["t3"] and "no retries left" in failed[0]["reason"]
    assert "manager m1 on ? lost (silent) while running the task" in failed[0]["reason"]
    assert m.identity not in st.managers and st.managers_lost == 1 and st.roster == 1
    assert _ops(sock) == [wire.STOP] and m.identity in reg.told_to_stop
    assert all(st.tasks[k][T_MGR] is None for k in (1, 2))


def test_check_managers_loses_a_silent_manager_and_forgets_a_stale_unregistered_one(ctx):
    st = make_state(ctx, manager_heartbeat_period=0.5)
    reg = _registry(st)
    m, _ = registered_manager(st, ctx, "quiet")
    fresh, _ = registered_manager(st, ctx, "fresh")
    stale = ManagerHandle(b"never-registered")
    st.managers[stale.identity] = stale
    now = time.monotonic()
    m.last_seen = now - 1.1                 # past 2 heartbeat periods
    stale.started = now - 61
    reg.check_managers(st, now)
    assert set(st.managers) == {b"fresh"} and st.managers_lost == 1


def test_a_local_manager_whose_process_died_is_lost_and_its_slot_backs_off(ctx):
    st = make_state(ctx)
    reg = _registry(st)
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait(30)
    m = ManagerHandle(b"m-local", proc, 0)
    st.managers[m.identity] = m
    reg.local_slots.append({"handle": m, "restart_at": 0.0, "failures": 1, "retired": True})  # retired: no restart
    now = time.monotonic()
    reg.check_managers(st, now)
    s = reg.local_slots[0]
    assert m.identity not in st.managers and st.managers_lost == 1 and s["handle"] is None
    assert s["failures"] == 2 and s["restart_at"] == pytest.approx(now + 1.0)   # died right after start
    assert reg.first_local() is None


def test_lost_reports_timeout_fail_and_retry(ctx):
    st = make_state(ctx, max_task_retries=2)
    reg = _registry(st)
    m, _ = registered_manager(st, ctx, "m1")
    _assign(st, m, [1, 2, 3])
    reg.on_lost(st, m, [[1, "timeout", "walltime of 1 s exceeded"], [2, "fail", "too big"],
                        [3, "died", "worker died"], [77, "died", "unknown key"]])
    got = {r["task_id"]: (r["state"], r["reason"]) for r in reg.out.results}
    assert got == {"t1": ("TIMED_OUT", "walltime of 1 s exceeded"), "t2": ("FAILED", "too big")}
    assert list(st.pending[PLAIN]) == [3] and st.tasks[3][T_TRIES] == 1 and st.retried == 1
    assert m.assigned == set()


def test_back_and_bye(ctx):
    st = make_state(ctx)
    reg = _registry(st)
    m, _ = registered_manager(st, ctx, "m1")
    _assign(st, m, [1, 2, 3])
    reg.on_back(st, m, [1, 2])
    assert list(st.pending[PLAIN]) == [1, 2] and m.assigned == {3}
    reg.on_bye(st, m)
    assert m.identity not in st.managers and m.draining and list(st.pending[PLAIN]) == [3, 1, 2]
    assert st.managers_lost == 0 and st.roster == 1


def test_drain_a_block_now_and_its_managers_registering_later(ctx):
    st = make_state(ctx)
    reg = _registry(st)
    a, a_sock = registered_manager(st, ctx, "a", credit=3, block="b1")
    b, b_sock = registered_manager(st, ctx, "b", credit=3, block="b2")
    reg.drain(st, [], "b1")
    assert a.draining and a.credit == 0 and not b.draining
    assert _ops(a_sock) == [wire.DRAIN] and _ops(b_sock) == []
    reg.drained_blocks.add("b1")
    late, late_sock = registered_manager(st, ctx, "late", block="?")
    late.registered = False
    reg.on_register(st, late, {"block": "b1", "workers": 1})
    assert late.draining and _ops(late_sock) == [wire.DRAIN]


def test_manager_command_and_snapshots(ctx):
    st = make_state(ctx, manager_heartbeat_period=2.5, cores=4)
    st.server_key = "K" * 40
    reg = _registry(st)
    cmd = reg.manager_command(st, "blk", 3, identity="m-x", parent=99)
    assert cmd[1:3] == ["-m", "endpoint_agent.manager"]
    joined = " ".join(cmd)
    for part in ("--interchange tcp://node.example:5555", "--block blk", "--workers 3", "--heartbeat 2.5",
                 "--server-key " + "K" * 40, "--identity m-x", "--parent 99", "--cores 4"):
        assert part in joined, part
    a, _ = registered_manager(st, ctx, "a", workers=2, block="b1")
    b, _ = registered_manager(st, ctx, "b", workers=3, block="b1")
    b.assigned = {1, 2}
    b.draining = True
    st.n_pending, st.given, st.taken = 4, 10, 9
    snap = reg.snapshot(st)
    assert snap["pending"] == 5 and snap["workers"] == 5 and snap["free_workers"] == 2   # b is draining
    assert snap["blocks"]["b1"] == {"managers": 2, "workers": 5, "free_workers": 3, "running": 0, "assigned": 2}
    assert snap["encrypted"] and snap["address"] == "tcp://node.example:5555"
    bs = reg.block_snapshot(st)
    assert bs["pending"] == 5
    assert {k: bs["blocks"]["b1"][k] for k in ("managers", "workers", "free", "tasks")} == \
        {"managers": 2, "workers": 5, "free": 2, "tasks": 2}
    assert bs["blocks"]["b1"]["last_busy"] is not None
