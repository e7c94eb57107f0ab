"""ParkedTasks (endpoint_agent/interchange/parked.py): dependents sent ahead of their inputs,
released when the inputs' results are here, handed back to the service when they cannot be;
through the real intake and ResultBatcher over a real IxState."""
from __future__ import annotations

import time

import pytest
import zmq

from endpoint_agent import wire
from endpoint_agent.interchange.intake import Intake
from endpoint_agent.interchange.parked import EXPECT_S, GRACE_S, LocalResults, ParkedTasks
from endpoint_agent.interchange.results import ResultBatcher
from endpoint_agent.interchange.state import PLAIN, ManagerHandle
from endpoint_agent.task_record import T_ID, T_PAYLOAD
from skyfn.protocol.dataflow import local_entry, make_envelope, open_envelope
from skyfn.protocol.messages import ResultPack, TaskPack, TaskSpec
from tests.unit.agent_parts import make_state


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(0)


@pytest.fixture
def ix(ctx):
    st = make_state(ctx, result_batch=1000, local_results_mb=1)
    out = ResultBatcher(st.config)
    st.parked = ParkedTasks(st.config.local_results_mb, out)
    intake = Intake(st.config, "ep", out)
    st.manager = ManagerHandle(b"m1")
    return st, out, intake


def spec(tid: str, after=None, entries=()) -> TaskSpec:
    payload = make_envelope("ARGS", list(entries)) if after is not None or entries else f"payload-{tid}"
    return TaskSpec(task_id=tid, function_id="f1", payload=payload, after=after)


def deliver(st, intake, receipt: str, *specs: TaskSpec) -> None:
    st.handoff.append((receipt, TaskPack(pack_id=receipt, endpoint_id="ep", functions={"f1": "body"},
                                         tasks=list(specs)), 50.0))
    st.given += len(specs)
    intake.ingest(st)


def key_of(st, tid: str) -> int:
    return next(k for k, t in st.tasks.items() if t[T_ID] == tid)


def finish(st, out, tid: str, state="SUCCEEDED", result="R"):
    """The manager's result for the task `tid`, as on_results gets it."""
    key = key_of(st, tid)
    st.manager.assigned.add(key)
    out.on_results(st, st.manager, [[key, state, result if state == "SUCCEEDED" else None,
                                     None if state == "SUCCEEDED" else "Trace", 60.0, 61.0, None, None]])


def updates(st, out) -> list[dict]:
    out.flush(st)
    return [u for b in st.outbox.bodies for u in wire.loads(b)["updates"]]


def test_a_dependent_waits_off_the_queues_then_runs_with_its_inputs_result(ix):
    st, out, intake = ix
    deliver(st, intake, "r1", spec("a"), spec("b", ["a"], [local_entry("a")]))
    assert [t[T_ID] for t in st.tasks.values()] == ["a"] and st.n_pending == 1  # b is held, not pending
    assert st.load() == 1 and st.parked.snapshot()["parked"] == 1
    finish(st, out, "a", result="RESULT-A")
    (t,) = [t for t in st.tasks.values() if t[T_ID] == "b"]
    assert open_envelope(t[T_PAYLOAD]) == {"args": "ARGS", "inputs": [{"task_id": "a", "result": "RESULT-A"}]}
    assert list(st.pending[PLAIN])[-1] == key_of(st, "b") and st.parked.held == {}
    finish(st, out, "b")
    out.flush(st)
    pack = ResultPack.model_validate(wire.loads(st.outbox.bodies[-1]))
    b = next(r for r in pack.results if r.task_id == "b")
    assert [e[0] for e in b.events] == ["QUEUED", "DISPATCHED", "RUNNING", "DONE"]
    assert b.events[0][1] == b.events[1][1]  # released and handed to the queues at once
    assert st.outbox.acks == ["r1"]  # the pack is done once both are
    assert st.parked.snapshot()["released_here"] == 1 and updates(st, out) == []


def test_a_dependent_arriving_after_its_input_finished_runs_at_once(ix):
    st, out, intake = ix
    deliver(st, intake, "r1", spec("a"))
    deliver(st, intake, "r0", spec("x", ["zz"], [local_entry("zz")]))  # the first parked arrival turns results on
    finish(st, out, "a", result="EARLY")
    deliver(st, intake, "r2", spec("b", ["a"], [{"task_id": "c", "result": "C"}, local_entry("a")]))
    (t,) = [t for t in st.tasks.values() if t[T_ID] == "b"]
    assert [e.get("result") for e in open_envelope(t[T_PAYLOAD])["inputs"]] == ["C", "EARLY"]


def test_a_failed_input_hands_its_dependents_back(ix):
    st, out, intake = ix
    deliver(st, intake, "r1", spec("a"), spec("b", ["a"], [local_entry("a")]), spec("c", ["a"], [local_entry("a")]))
    finish(st, out, "a", state="FAILED")
    assert [(u["task_id"], u["state"]) for u in updates(st, out)] == [("b", "UNPARK"), ("c", "UNPARK")]
    assert st.parked.held == {} and st.outbox.acks == ["r1"]  # handed back: their message is done here
    assert st.parked.snapshot()["handed_back"] == 2


def test_an_input_held_nowhere_here_hands_the_dependent_back_after_the_grace(ix):
    st, out, intake = ix
    deliver(st, intake, "r1", spec("a"))
    deliver(st, intake, "r2", spec("b", ["a"], [local_entry("a")]), spec("c", ["gone"], [local_entry("gone")]))
    mono = time.monotonic()
    st.parked.check(st, mono)
    assert len(st.parked.held) == 2  # within the grace: both wait
    st.parked.check(st, mono + GRACE_S + 0.1)
    assert [u["task_id"] for u in updates(st, out)] == ["c"]  # b's input is here (pending): it waits
    assert st.outbox.acks == []  # b, in the same pack, still waits
    assert list(st.parked.by_id) == ["b"]


def test_a_failed_input_hands_back_the_whole_chain_parked_on_it(ix):
    st, out, intake = ix
    deliver(st, intake, "r1", spec("a"), spec("b", ["a"], [local_entry("a")]), spec("c", ["b"], [local_entry("b")]))
    finish(st, out, "a", state="FAILED")
    assert [u["task_id"] for u in updates(st, out)] == ["b", "c"] and st.parked.held == {}


def test_dependents_of_a_task_handed_back_keep_waiting_for_it(ix):
    """b's input ran before b arrived and is gone: b goes back to the service, which sends it
    here again in full; c, parked on b, waits for that instead of going back too."""
    st, out, intake = ix
    deliver(st, intake, "r1", spec("b", ["a"], [local_entry("a")]), spec("c", ["b"], [local_entry("b")]))
    mono = time.monotonic()
    st.parked.check(st, mono + GRACE_S + 0.1)
    assert [u["task_id"] for u in updates(st, out)] == ["b"]
    st.parked.check(st, mono + GRACE_S + 5)
    assert list(st.parked.by_id) == ["c"] and len(updates(st, out)) == 1
    deliver(st, intake, "r2", spec("b", None, [{"task_id": "a", "result": "A"}]))  # b again, in full
    finish(st, out, "b", result="B")
    (t,) = [t for t in st.tasks.values() if t[T_ID] == "c"]
    assert open_envelope(t[T_PAYLOAD])["inputs"] == [{"task_id": "b", "result": "B"}]


def test_tasks_handed_back_are_forgotten_after_a_while(ix):
    st, out, intake = ix
    deliver(st, intake, "r1", spec("b", ["a"], [local_entry("a")]))
    st.parked.check(st, time.monotonic() + GRACE_S + 0.1)
    assert list(st.parked.expected) == ["b"] and st.parked.held == {}
    st.parked.check(st, time.monotonic() + EXPECT_S + 1)
    assert st.parked.expected == {}


def test_a_dependent_whose_input_is_parked_here_waits_for_it(ix):
    st, out, intake = ix
    deliver(st, intake, "r1", spec("a"), spec("b", ["a"], [local_entry("a")]), spec("c", ["b"], [local_entry("b")]))
    st.parked.check(st, time.monotonic() + 10)
    assert updates(st, out) == [] and len(st.parked.held) == 2
    finish(st, out, "a", result="1")
    finish(st, out, "b", result="2")
    (t,) = [t for t in st.tasks.values() if t[T_ID] == "c"]
    assert open_envelope(t[T_PAYLOAD])["inputs"] == [{"task_id": "b", "result": "2"}]


def test_a_dependent_sent_ahead_twice_waits_once(ix):
    st, out, intake = ix
    deliver(st, intake, "r1", spec("a"), spec("b", ["a"], [local_entry("a")]))
    deliver(st, intake, "r2", spec("b", ["a"], [local_entry("a")]))
    out.flush(st)
    assert len(st.parked.held) == 1 and st.outbox.acks == ["r2"]  # the second copy's message is done
    finish(st, out, "a")
    assert [t[T_ID] for t in st.tasks.values()] == ["b"]


def test_a_cancel_drops_a_parked_task(ix):
    st, out, intake = ix
    deliver(st, intake, "r1", spec("b", ["a"], [local_entry("a")]))
    intake.on_cancel(st, ["b"])
    assert st.parked.held == {} and st.cancelled == 1 and "b" not in intake.early_cancel
    out.flush(st)
    assert st.outbox.acks == ["r1"] and updates(st, out) == []


def test_a_payload_in_s3_or_local_release_off_hands_back_at_once(ctx):
    st = make_state(ctx, local_results_mb=0)
    out = ResultBatcher(st.config)
    st.parked = ParkedTasks(0, out)
    intake = Intake(st.config, "ep", out)
    deliver(st, intake, "r1", spec("b", ["a"], [local_entry("a")]))
    assert [u["state"] for u in updates(st, out)] == ["UNPARK"] and st.outbox.acks == ["r1"]


def test_local_results_keep_the_latest_within_their_bytes():
    kept = LocalResults(8000)
    for i in range(100):
        kept.put(f"t{i}", "x" * 100)
    assert kept.bytes <= 8000 and kept.get("t99") == "x" * 100 and kept.get("t0") is None
    kept.put("big", "y" * 2000)  # over an eighth of the bound: not kept
    assert kept.get("big") is None
    kept.put("t99", "z")
    assert kept.get("t99") == "z" and sum(len(v) + 100 for v in kept.items.values()) == kept.bytes
