"""The task state machine and event helpers of skyfn.protocol.states."""
from skyfn.protocol.states import (
    FINAL_STATES, TaskState, can_transition, format_events, is_final, parse_events, stage_latencies,
)


def test_final_states_have_no_exits():
    for s in FINAL_STATES:
        assert not any(can_transition(s, t) for t in TaskState)
    assert is_final("CANCELLED") and not is_final("RUNNING")


def test_forward_path_and_lease_expiry_step_back():
    path = ["CREATED", "QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED"]
    assert all(can_transition(a, b) for a, b in zip(path, path[1:]))
    assert can_transition("RUNNING", "QUEUED") and can_transition("DISPATCHED", "QUEUED")
    assert not can_transition("QUEUED", "CREATED")
    assert all(can_transition(s, "CANCELLED") for s in TaskState if s not in FINAL_STATES)


def test_events_round_trip_and_stage_breakdown():
    events = [("CREATED", 1.0), ("QUEUED", 1.001), ("DISPATCHED", 1.011), ("RUNNING", 1.012),
              ("DONE", 1.112), ("SUCCEEDED", 1.115), ("STORED", 1.115)]
    assert parse_events(format_events(events)) == events
    got = stage_latencies(events)
    assert {k: round(v, 3) for k, v in got.items()} == {
        "service": 0.001, "queue_wait": 0.01, "dispatch": 0.001, "run": 0.1, "return": 0.003}
    assert parse_events("") == [] and parse_events(None) == []
