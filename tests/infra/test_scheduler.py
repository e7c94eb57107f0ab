"""Schedules run at their rate with EventBridge events; a failing handler neither stops
its own schedule nor the others."""
from __future__ import annotations

import json
import os
import time

import pytest

from infra.local.standins.scheduler import Schedule, Scheduler


def test_schedules_are_isolated_from_failures():
    seen = []

    def good(event, context):
        seen.append(event)

    def bad(event, context):
        raise RuntimeError("reaper bug")

    schedules = [Schedule("skyfn-history", 0.05, good), Schedule("skyfn-reaper", 0.05, bad)]
    scheduler = Scheduler(schedules).start()
    try:
        time.sleep(0.6)
        assert scheduler.alive()
    finally:
        scheduler.stop()
    good_s, bad_s = schedules
    assert good_s.runs >= 5 and good_s.failures == 0
    assert bad_s.runs >= 5 and bad_s.failures == bad_s.runs
    assert bad_s.last_error == "RuntimeError: reaper bug"
    event = seen[0]
    assert event["detail-type"] == "Scheduled Event" and event["source"] == "aws.events"
    assert event["resources"][0].endswith("rule/skyfn-history")


def test_rate_is_kept_and_overruns_skip_ticks():
    runs = []

    def slow(event, context):
        runs.append(time.monotonic())
        time.sleep(0.25)

    s = Schedule("slow", 0.1, slow)
    scheduler = Scheduler([s]).start()
    time.sleep(1.0)
    scheduler.stop()
    # 0.25 s per run at a 0.1 s rate: runs do not pile up, about one every 0.3 s
    assert 2 <= len(runs) <= 4


def test_lazy_handlers_resolve_on_start():
    calls = []
    s = Schedule("lazy", 0.05, lambda: (lambda e, c: calls.append(c.function_name)), lazy=True)
    scheduler = Scheduler([s]).start()
    time.sleep(0.2)
    scheduler.stop()
    assert calls and calls[0] == "lazy"


def test_target_schedules_run_in_their_own_niced_environment(tmp_path, monkeypatch):
    log = tmp_path / "runs.jsonl"
    monkeypatch.setenv("SKYFN_TEST_SCHEDULE_LOG", str(log))
    s = Schedule("skyfn-history", 0.05, target="tests.infra.sample_handlers:scheduled_record", nice=7)
    scheduler = Scheduler([s]).start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 3):
            time.sleep(0.05)
        (pid,) = scheduler.pids()["skyfn-history"]
    finally:
        scheduler.stop()
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) >= 3 and s.failures == 0
    # one environment, not this process, reused for every run, at our niceness + 7
    assert {r[0] for r in runs} == {pid} and pid != os.getpid()
    assert {r[1] for r in runs} == {os.getpriority(os.PRIO_PROCESS, 0) + 7}
    assert runs[0][2:] == ["Scheduled Event", "skyfn-history"]
    with pytest.raises(ProcessLookupError):  # stopped with the scheduler
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.05)
