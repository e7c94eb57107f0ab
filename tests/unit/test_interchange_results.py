"""ResultBatcher (endpoint_agent/interchange/results.py): outcomes in, ResultPack bodies and acks to the outbox."""
from __future__ import annotations

import threading
import time

import pytest
import zmq

from endpoint_agent import wire
from endpoint_agent.interchange.results import UPDATES_PER_BODY, ResultBatcher
from endpoint_agent.interchange.state import ManagerHandle
from skyfn.protocol.messages import PACK_MAX_BYTES, ResultPack
from tests.unit.agent_parts import RecordingOutbox, make_state, task_record


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(0)


def _with_pack(st, seq: int, receipt: str, keys: list[int]) -> None:
    st.packs[seq] = [receipt, len(keys), "alice"]
    for k in keys:
        st.tasks[k] = task_record(f"t{k}", seq)


def test_results_of_a_manager_become_records_and_the_pack_is_acked_after_its_last(ctx):
    st = make_state(ctx, result_batch=100)
    st.room_event = room = threading.Event()
    out = ResultBatcher(st.config)
    _with_pack(st, 1, "receipt-1", [10, 11])
    m = ManagerHandle(b"m1")
    m.assigned = {10, 11}
    out.on_results(st, m, [[10, "SUCCEEDED", "r10", None, 101.0, 102.0, "hello", None]])
    assert out.results == [{"task_id": "t10", "state": "SUCCEEDED", "result": "r10", "stdout": "hello",
                            "events": [["DISPATCHED", 100.0], ["RUNNING", 101.0], ["DONE", 102.0]]}]
    assert out.acks == [] and st.packs[1][1] == 1 and m.assigned == {11} and m.last_busy is None
    out.on_results(st, m, [[11, "FAILED", None, "Traceback", 103.0, 104.0, None, "err"],
                           [99, "SUCCEEDED", "stale", None, 0.0, 0.0, None, None]])   # unknown key: ignored
    assert [r["task_id"] for r in out.results] == ["t10", "t11"]
    assert out.results[1]["error"] == "Traceback" and out.results[1]["stderr"] == "err"
    assert out.acks == ["receipt-1"] and 1 not in st.packs
    assert (st.completed, st.failed) == (1, 1) and st.tasks == {}
    assert m.assigned == set() and m.last_busy is not None
    assert room.is_set()                # room for more tasks: the poller is told
    out.flush(st)
    assert st.outbox.acks == ["receipt-1"] and out.results == [] and out.acks == []
    pack = ResultPack.model_validate(wire.loads(st.outbox.bodies[0]))   # the wire shape is exactly ResultPack
    assert [r.task_id for r in pack.results] == ["t10", "t11"] and pack.endpoint_id == "ep"


def test_add_flushes_when_result_batch_is_reached(ctx):
    st = make_state(ctx, result_batch=3)
    out = ResultBatcher(st.config)
    _with_pack(st, 1, "r1", list(range(5)))
    for k in range(5):
        t = st.tasks.pop(k)
        out.add(st, {"task_id": t[0], "state": "SUCCEEDED", "result": "x"}, 1)
    assert st.outbox.puts == 1 and len(st.outbox.results()) == 3   # one put at the 3rd result
    assert len(out.results) == 2 and out.acks == ["r1"]
    out.flush(st)
    assert len(st.outbox.results()) == 5 and st.outbox.acks == ["r1"]


def test_task_gone_acks_a_pack_whose_tasks_ended_without_results(ctx):
    st = make_state(ctx)
    out = ResultBatcher(st.config)
    _with_pack(st, 7, "r7", [1, 2])
    out.task_gone(st, 7)
    out.task_gone(st, 7)
    assert out.acks == ["r7"] and out.results == [] and 7 not in st.packs
    out.task_gone(st, 7)                # a pack already done: nothing more
    assert out.acks == ["r7"]


def test_running_updates_carry_the_lease(ctx):
    st = make_state(ctx, lease_seconds=90)
    out = ResultBatcher(st.config)
    _with_pack(st, 1, "r1", [5])
    out.on_running(st, [[5, 123.5], [6, 124.0]])   # 6 is unknown: no update
    assert out.updates == [{"task_id": "t5", "state": "RUNNING", "ts": 123.5, "lease_seconds": 90}]
    assert out.first_buffered > 0


def test_group_commit_a_lone_result_leaves_at_once_and_results_during_a_send_leave_together(ctx):
    outbox = RecordingOutbox(idle=True)
    st = make_state(ctx, outbox=outbox, result_batch=100)
    out = ResultBatcher(st.config)
    _with_pack(st, 1, "r1", [1, 2, 3, 4])
    st.tasks.pop(1)
    out.add(st, {"task_id": "t1", "state": "SUCCEEDED", "result": "x"}, 1)
    out.maybe_flush(st)
    assert outbox.puts == 1 and len(outbox.results()) == 1   # nothing in flight: at once, no timer
    outbox.is_idle = False              # that send is in flight: what comes now waits for it
    for k in (2, 3):
        st.tasks.pop(k)
        out.add(st, {"task_id": f"t{k}", "state": "SUCCEEDED", "result": "y"}, 1)
        out.maybe_flush(st)
    assert outbox.puts == 1 and len(out.results) == 2
    outbox.is_idle = True               # the send completed (the outbox's on_idle woke the loop)
    out.maybe_flush(st)
    assert outbox.puts == 2 and [r["task_id"] for r in outbox.results()] == ["t1", "t2", "t3"]
    out.maybe_flush(st)
    assert outbox.puts == 2             # nothing buffered: nothing sent
    st.tasks.pop(4)
    out.add(st, {"task_id": "t4", "state": "SUCCEEDED", "result": "z"}, 1)
    out.maybe_flush(st)                 # the pack's last result: its ack goes with it
    assert outbox.puts == 3 and outbox.acks == ["r1"]


def test_a_busy_outbox_still_gets_a_full_pack_at_result_batch(ctx):
    outbox = RecordingOutbox(idle=False)
    st = make_state(ctx, outbox=outbox, result_batch=3)
    out = ResultBatcher(st.config)
    _with_pack(st, 1, "r1", [1, 2, 3, 4])
    for k in (1, 2, 3, 4):
        st.tasks.pop(k)
        out.add(st, {"task_id": f"t{k}", "state": "SUCCEEDED", "result": "x"}, 1)
        out.maybe_flush(st)
    assert outbox.puts == 1 and len(outbox.results()) == 3 and len(out.results) == 1   # a size bound


class _GatedQueue:
    """A queue the real Outbox sends to: a send waits for `gate` (a send in flight) when given."""

    def __init__(self, gate: threading.Event | None = None):
        self.gate, self.sent = gate, []

    def send(self, bodies):
        if self.gate is not None:
            self.gate.wait(10)
        self.sent.extend(bodies)

    def delete(self, acks):
        pass

    def extend(self, receipts, seconds):
        pass

    def close(self):
        pass


def test_the_outbox_running_dry_wakes_the_interchange_loop(ctx, tmp_path):
    """The loop waits (no timer) for an in-flight send: the real Outbox's on_idle, wired as the
    agent wires it, wakes it."""
    from endpoint_agent.config import EndpointConfig
    from endpoint_agent.interchange import Interchange
    from endpoint_agent.service.outbox import Outbox

    release = threading.Event()
    q = _GatedQueue(release)
    box = Outbox(q, q, 60.0)
    box.start()
    ix = Interchange(EndpointConfig(workers=1, managers=1, log_level="WARNING"), "ep", box, ctx=ctx)
    box.on_idle = ix.on_outbox_idle
    try:
        ix.out.update({"task_id": "a", "state": "RUNNING", "ts": 1.0, "lease_seconds": 60})
        ix.step(0)                       # nothing in flight: handed over at once
        deadline = time.monotonic() + 5
        while box.idle() and time.monotonic() < deadline:
            time.sleep(0.001)
        ix.out.update({"task_id": "b", "state": "RUNNING", "ts": 1.0, "lease_seconds": 60})
        ix.step(0)
        assert ix.out.updates and not box.idle()   # held: a send is in flight
        release.set()
        t0 = time.monotonic()
        ix.step(30)                      # woken by the outbox running dry, long before 30 s
        while ix.out.updates and time.monotonic() - t0 < 10:
            ix.step(30)
        assert not ix.out.updates and time.monotonic() - t0 < 10
        assert box.drain(5)
        assert [u["task_id"] for b in q.sent for u in wire.loads(b)["updates"]] == ["a", "b"]
    finally:
        box.on_idle = None
        box.close()
        ix.close()


def test_the_outbox_running_dry_with_nothing_held_leaves_the_loop_asleep(ctx):
    """A send completing with nothing buffered (a lone result, the usual interactive case)
    costs the interchange no wake-up; one completing with results held wakes it."""
    from endpoint_agent.config import EndpointConfig
    from endpoint_agent.interchange import Interchange
    from endpoint_agent.service.outbox import Outbox

    called = threading.Event()
    q = _GatedQueue()
    box = Outbox(q, q, 60.0)
    ix = Interchange(EndpointConfig(workers=1, managers=1, log_level="WARNING"), "ep", box, ctx=ctx)

    def on_idle():
        ix.on_outbox_idle()
        called.set()

    box.on_idle = on_idle
    box.start()
    try:
        box.put([b"a result"])           # nothing held by the interchange meanwhile
        assert called.wait(5)
        assert ix.wake.poll(0) == 0       # no wake-up was sent
        called.clear()
        ix.out.update({"task_id": "b", "state": "RUNNING", "ts": 1.0, "lease_seconds": 60})
        box.put([b"another"])            # held while this send is in flight
        assert called.wait(5)
        assert ix.wake.poll(5000) == zmq.POLLIN  # woken to send what was held
    finally:
        box.on_idle = None
        box.close()
        ix.close()


def test_flush_splits_bodies_by_count_size_and_updates(ctx):
    st = make_state(ctx, result_batch=2)
    out = ResultBatcher(st.config)
    big = "x" * (PACK_MAX_BYTES // 2)
    out.results = [{"task_id": f"t{i}", "state": "SUCCEEDED", "result": "r",
                    "events": []} for i in range(3)] + \
                  [{"task_id": f"big{i}", "state": "SUCCEEDED", "result": big, "events": []} for i in range(2)]
    out.results_bytes = sum(ResultBatcher._rec_size(r) for r in out.results)
    out.updates = [{"task_id": f"u{i}", "state": "RUNNING", "ts": 1.0, "lease_seconds": 60}
                   for i in range(UPDATES_PER_BODY + 1)]
    out.acks = ["r1"]
    out.flush(st)
    bodies = [wire.loads(b) for b in st.outbox.bodies]
    assert [[r["task_id"] for r in b["results"]] for b in bodies] == \
        [["t0", "t1"], ["t2", "big0"], ["big1"], [], []]   # 2 per body; never over PACK_MAX_BYTES
    assert [len(b["updates"]) for b in bodies] == [0, 0, 0, UPDATES_PER_BODY, 1]
    assert st.outbox.puts == 1 and st.outbox.acks == ["r1"]     # one outbox operation
    assert (out.results, out.updates, out.acks, out.results_bytes) == ([], [], [], 0)


def test_extend_leases_extends_every_pack_and_sends_lease_updates(ctx):
    st = make_state(ctx, lease_seconds=30)
    out = ResultBatcher(st.config)
    out.extend_leases(st)
    assert st.outbox.puts == 0          # nothing held
    _with_pack(st, 1, "r1", [1])
    _with_pack(st, 2, "r2", [2, 3])
    out.extend_leases(st)
    assert st.outbox.extended == ["r1", "r2"]
    ups = st.outbox.updates()
    assert sorted(u["task_id"] for u in ups) == ["t1", "t2", "t3"]
    assert {u["state"] for u in ups} == {"LEASE"} and {u["lease_seconds"] for u in ups} == {30}
