"""The pure parts of `skyfn task watch`: counting states per task and endpoint, throughput
over a sliding window, the ETA, the failures kept, the exit code and summary, reading the
reason of a failure from a status, and the lines and board that show a snapshot."""
from __future__ import annotations

import io
import json

import pytest

from skyfn.protocol.remote_exception import wrap_exception
from skyfn.protocol.serialize import serialize
from skyfn.protocol.states import TaskState
from skyfn.watch.feed import apply, failure_reason, finished_at
from skyfn.watch.selection import WatchError, check, read_ids
from skyfn.watch.tally import EXIT_FAILED, EXIT_OK, EXIT_RUNNING, STATES, Tally, exit_code, summary
from skyfn.watch.view import COLOURS, duration, plain_line, render

T0 = 1_700_000_000.0


def tally(n=10, endpoints=("a", "b"), **kw):
    return Tally({f"t{i}": endpoints[i % len(endpoints)] for i in range(n)}, origin=T0, **kw)


def test_counts_per_state_and_endpoint_follow_each_task():
    t = tally(4)
    for tid in t.state:
        assert t.update(tid, "QUEUED")
    t.update("t0", "RUNNING")
    t.update("t0", "SUCCEEDED", finished_at=T0 + 1)
    t.update("t1", "FAILED", reason="ValueError: no", finished_at=T0 + 2)
    snap = t.snapshot(T0 + 3)
    assert list(snap["states"]) == list(STATES)  # every state, in lifecycle order
    assert snap["states"]["QUEUED"] == 2 and snap["states"]["SUCCEEDED"] == 1 and snap["states"]["FAILED"] == 1
    assert snap["states"]["RUNNING"] == 0
    assert snap["endpoints"] == {"a": {"QUEUED": 1, "SUCCEEDED": 1}, "b": {"QUEUED": 1, "FAILED": 1}}
    assert (snap["total"], snap["finished"], snap["succeeded"], snap["failed"], snap["remaining"]) == (4, 2, 1, 1, 2)
    assert snap["failures"] == [{"task_id": "t1", "state": "FAILED", "endpoint": "b", "reason": "ValueError: no"}]
    assert not snap["done"] and exit_code(snap) == EXIT_FAILED
    assert json.loads(json.dumps(snap)) == snap


def test_a_final_state_is_never_left_and_strangers_are_ignored():
    t = tally(2)
    assert t.update("t0", "SUCCEEDED", finished_at=T0)
    assert not t.update("t0", "SUCCEEDED", finished_at=T0 + 5)  # pushed, then polled
    assert not t.update("t0", "RUNNING")
    assert not t.update("someone-else", "FAILED")
    assert t.snapshot(T0)["states"]["SUCCEEDED"] == 1 and t.total == 2
    assert t.outstanding() == ["t1"]
    t.update("t1", "QUEUED")
    t.update("t1", "RUNNING")
    t.update("t1", "QUEUED")  # a lease expired: back to QUEUED is allowed
    assert t.snapshot(T0)["states"]["QUEUED"] == 1 and t.snapshot(T0)["states"]["RUNNING"] == 0


def test_throughput_counts_the_window_and_the_eta_follows():
    t = tally(100, window=10.0)
    for i in range(40):  # 40 finished over 20 s: 2 per second
        t.update(f"t{i}", "SUCCEEDED", finished_at=T0 + 0.5 * (i + 1))
    now = T0 + 20.0
    assert t.throughput(now) == pytest.approx(2.0)  # the 20 that finished in (10 s, 20 s]
    assert t.eta(now) == pytest.approx(60 / 2.0)
    assert t.throughput(T0 + 100) == 0 and t.eta(T0 + 100) is None  # nothing lately: no ETA


def test_a_young_batch_is_measured_over_its_age_and_unknown_finish_times_are_left_out():
    t = tally(10, window=10.0)
    for i in range(4):
        t.update(f"t{i}", "SUCCEEDED", finished_at=T0 + 1.0)
    t.update("t9", "SUCCEEDED")  # final before the watch began, time unknown
    assert t.throughput(T0 + 2.0) == pytest.approx(2.0)  # 4 tasks over the 2 s since the start
    assert t.throughput(T0 + 0.1) == pytest.approx(4.0)  # never over less than a second
    assert t.snapshot(T0 + 2)["finished"] == 5


def test_all_done_gives_eta_zero_exit_ok_and_summary():
    t = tally(3, endpoints=("local",))
    for i in range(3):
        t.update(f"t{i}", "SUCCEEDED", finished_at=T0 + i)
    snap = t.snapshot(T0 + 4)
    assert snap["done"] and snap["eta_seconds"] == 0 and exit_code(snap) == EXIT_OK
    assert summary(snap) == "3 tasks, all succeeded: 3 SUCCEEDED (4.0 s)"


def test_exit_code_and_summary_while_running_and_with_failures():
    t = tally(3)
    t.update("t0", "RUNNING")
    snap = t.snapshot(T0 + 1)
    assert exit_code(snap) == EXIT_RUNNING and summary(snap) == "3 tasks, 3 not finished: 1 RUNNING"
    t.update("t0", "CANCELLED", finished_at=T0 + 1)
    t.update("t1", "TIMED_OUT", finished_at=T0 + 1)
    t.update("t2", "SUCCEEDED", finished_at=T0 + 1)
    snap = t.snapshot(T0 + 2)
    assert exit_code(snap) == EXIT_FAILED
    assert summary(snap) == "3 tasks, 2 did not succeed: 1 SUCCEEDED, 1 TIMED_OUT, 1 CANCELLED (2.0 s)"
    assert [f["reason"] for f in snap["failures"]] == ["cancelled", "timed out"]  # no reason given


def test_only_the_last_failures_are_kept():
    t = tally(20, keep=5)
    for i in range(20):
        t.update(f"t{i}", "FAILED", reason=f"boom {i}", finished_at=T0)
    assert [f["reason"] for f in t.snapshot(T0)["failures"]] == [f"boom {i}" for i in range(15, 20)]


def _raise(exc):
    try:
        raise exc
    except BaseException as e:  # noqa: BLE001
        return wrap_exception(e)


def test_failure_reason_reads_the_exception_without_unpickling_it():
    class Private(Exception):  # not importable by the watcher: still named
        pass

    assert failure_reason({"state": "FAILED", "error": _raise(ValueError("bad seed 3\nsecond line"))}) == \
        "ValueError: bad seed 3"
    assert "Private: mine" in failure_reason({"state": "FAILED", "error": _raise(Private("mine"))})
    assert failure_reason({"state": "FAILED", "reason": "worker died"}) == "worker died"
    assert failure_reason({"state": "FAILED", "reason": "retries exhausted", "error": _raise(KeyError("k"))}) == \
        "retries exhausted: KeyError: 'k'"
    pickled = serialize({"type": "x", "message": ("not", "json")})  # a tuple: not the json strategy
    assert failure_reason({"state": "FAILED", "error": pickled}) is None
    assert failure_reason({"state": "FAILED", "error": "garbage"}) is None
    assert len(failure_reason({"state": "FAILED", "reason": "x" * 500})) == 201


def test_apply_takes_finish_times_from_events_else_the_observation():
    t = tally(3)
    statuses = {
        "t0": {"state": "SUCCEEDED", "events": [["CREATED", T0], ["SUCCEEDED", T0 + 3], ["STORED", T0 + 3.1]]},
        "t1": {"state": "FAILED", "error": _raise(ZeroDivisionError("division by zero"))},
        "t2": {"state": "RUNNING", "events": [["CREATED", T0], ["RUNNING", T0 + 1]]},
    }
    assert finished_at(statuses["t0"]) == T0 + 3 and finished_at(statuses["t2"]) is None
    assert apply(t, statuses, observed=T0 + 9) == 3
    assert t._finished_at == [T0 + 3, T0 + 9]
    assert t.snapshot(T0 + 9)["failures"][0]["reason"] == "ZeroDivisionError: division by zero"


def test_reading_ids_and_checking_input(tmp_path):
    f = tmp_path / "ids.txt"
    f.write_text("# my batch\nb\n\n  c  \na\n")
    assert read_ids(["a", " ", "b"], str(f)) == ["a", "b", "c"]
    assert read_ids([], "-", io.StringIO("x\ny\nx\n")) == ["x", "y"]
    with pytest.raises(WatchError, match="no such file"):
        read_ids([], str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(WatchError, match="no task ids in"):
        read_ids([], str(tmp_path / "empty"))
    with pytest.raises(WatchError, match="nothing to watch"):
        check([], None)
    with pytest.raises(WatchError, match=r"--since 'ten minutes': use an age like 90s, 10m"):
        check([], "ten minutes")
    with pytest.raises(WatchError, match="add --once"):
        check(["a"], None, once=False, as_json=True)
    check([], "10m")
    check(["a"], None, once=True, as_json=True)


def test_the_plain_line_and_the_board_show_the_snapshot():
    t = tally(4, endpoints=("local",))
    t.update("t0", "SUCCEEDED", finished_at=T0 + 1)
    t.update("t1", "FAILED", reason="ValueError: odd", finished_at=T0 + 1)
    t.update("t2", "RUNNING")
    t.update("t3", "QUEUED")
    snap = t.snapshot(T0 + 2)
    line = plain_line(snap, now=T0)
    assert "2/4 finished (50%): QUEUED 1, RUNNING 1, SUCCEEDED 1, FAILED 1 | 1.0 tasks/s | ETA 2 s" in line

    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=120, force_terminal=False, color_system=None).print(render(snap))
    text = buf.getvalue()
    assert "2/4 (50%)" in text and "ETA 2 s" in text and "1.0 tasks/s" in text
    assert all(s in text for s in STATES)
    assert "local" in text and "ValueError: odd" in text and "last failures" in text


def test_every_state_has_a_colour_and_durations_read_well():
    assert set(COLOURS) == {s.value for s in TaskState}
    assert [duration(x) for x in (None, 4.4, 125, 7300)] == ["-", "4 s", "2 min 05 s", "2 h 01 min"]


def test_waiting_for_inputs_has_its_own_count_column_and_stage():
    """A task with inputs is WAITING (its own state, colour and endpoint column, apart from the
    CREATED/QUEUED/DISPATCHED ones pending on the endpoint's side) and the time it waited,
    WAITING -> the QUEUED that released it, is read from its events."""
    t = tally(5, endpoints=("local",))
    first = {
        "t0": {"state": "SUCCEEDED", "events": [["CREATED", T0], ["QUEUED", T0], ["RUNNING", T0 + 0.5],
                                                ["DONE", T0 + 2], ["SUCCEEDED", T0 + 2], ["STORED", T0 + 2]]},
        "t1": {"state": "RUNNING", "events": [["CREATED", T0], ["WAITING", T0], ["QUEUED", T0 + 2],
                                              ["DISPATCHED", T0 + 2.1], ["RUNNING", T0 + 2.2]]},
        "t2": {"state": "WAITING", "events": [["CREATED", T0 + 1], ["WAITING", T0 + 1]]},
        "t3": {"state": "WAITING", "events": [["CREATED", T0 + 1], ["WAITING", T0 + 1]]},
        "t4": {"state": "QUEUED", "events": [["CREATED", T0 + 1], ["QUEUED", T0 + 1]]},
    }
    apply(t, first, observed=T0 + 3)
    snap = t.snapshot(T0 + 5)
    assert snap["states"]["WAITING"] == 2 and snap["states"]["QUEUED"] == 1 and snap["states"]["RUNNING"] == 1
    assert list(snap["states"])[:3] == ["CREATED", "WAITING", "QUEUED"]
    assert snap["endpoints"] == {"local": {"WAITING": 2, "QUEUED": 1, "RUNNING": 1, "SUCCEEDED": 1}}
    # t1 waited 2 s (released); t2 and t3 have waited 4 s so far
    assert snap["waits"] == {"tasks": 3, "mean_seconds": pytest.approx(10 / 3, abs=1e-3), "max_seconds": 4.0}

    # released without events (a full read): left out until the events tell when, which are
    # asked for once
    t.update("t2", "QUEUED")
    assert t.snapshot(T0 + 5)["waits"]["tasks"] == 2
    assert t.take_unreleased() == ["t2"] and t.take_unreleased() == []
    apply(t, {"t2": {"state": "SUCCEEDED", "events": [["CREATED", T0 + 1], ["WAITING", T0 + 1], ["QUEUED", T0 + 4.5],
                                                      ["RUNNING", T0 + 4.6], ["DONE", T0 + 4.8],
                                                      ["SUCCEEDED", T0 + 4.9]]}}, observed=T0 + 5)
    # an input failed: t3 ends FAILED without ever being released; its wait is not a stage
    apply(t, {"t3": {"state": "FAILED", "reason": "DependencyFailed: input task t9 ended FAILED",
                     "events": [["CREATED", T0 + 1], ["WAITING", T0 + 1], ["FAILED", T0 + 5]]}}, observed=T0 + 5)
    snap = t.snapshot(T0 + 6)
    assert t.take_unreleased() == []  # t3's events were read: it was never released
    assert snap["states"]["WAITING"] == 0 and snap["states"]["FAILED"] == 1
    assert snap["waits"] == {"tasks": 2, "mean_seconds": 2.75, "max_seconds": 3.5}
    assert snap["failures"][-1]["reason"] == "DependencyFailed: input task t9 ended FAILED"
    assert "; waited for inputs: 2 tasks, mean 2.8 s, max 3.5 s" in summary(snap)

    from rich.console import Console

    t5 = tally(3, endpoints=("local",))
    apply(t5, {f"t{i}": {"state": "WAITING", "events": [["CREATED", T0], ["WAITING", T0]]} for i in range(2)}, T0)
    t5.update("t2", "DISPATCHED")
    snap = t5.snapshot(T0 + 90)
    line = plain_line(snap, now=T0)
    assert "0/3 finished (0%): WAITING 2, DISPATCHED 1 |" in line
    assert line.endswith("| waited for inputs: 2 tasks, mean 1 min 30 s, max 1 min 30 s")
    buf = io.StringIO()
    Console(file=buf, width=120, force_terminal=False, color_system=None).print(render(snap))
    text = buf.getvalue()
    header = next(ln for ln in text.splitlines() if "endpoint" in ln and "pending" in ln).split()
    row = next(ln for ln in text.splitlines() if ln.strip().startswith("local")).split()
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if "CREATED" in ln)
    assert dict(zip(lines[at].split(), lines[at + 1].split())) == {
        "CREATED": "0", "WAITING": "2", "QUEUED": "0", "DISPATCHED": "1", "RUNNING": "0", "SUCCEEDED": "0",
        "FAILED": "0", "TIMED_OUT": "0", "CANCELLED": "0"}
    assert header == ["endpoint", "tasks", "waiting", "pending", "running", "succeeded", "failed"]
    assert row == ["local", "3", "2", "1", "0", "0", "0"]
    assert "waited for inputs: 2 tasks, mean 1 min 30 s, max 1 min 30 s" in text
    assert COLOURS["WAITING"] not in {c for s, c in COLOURS.items() if s != "WAITING"}  # a colour of its own


def test_no_task_waited_no_wait_shown():
    t = tally(2)
    apply(t, {"t0": {"state": "RUNNING", "events": [["CREATED", T0], ["QUEUED", T0], ["RUNNING", T0 + 1]]}}, T0)
    snap = t.snapshot(T0 + 2)
    assert snap["waits"] == {"tasks": 0, "mean_seconds": None, "max_seconds": None}
    assert "waited" not in plain_line(snap, now=T0) and "waited" not in summary(snap)
