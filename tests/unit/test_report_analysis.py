"""skyfn.report.analysis on synthetic task events with known answers."""
from __future__ import annotations

import math

from skyfn.report.analysis import analyse, stamps
from skyfn.report.since import parse_since


def task(i, created, endpoint="ep1", service=0.001, queue=0.01, dispatch=0.002, run=0.1, ret=0.003, state="SUCCEEDED"):
    q = created + service
    d = q + queue
    r = d + dispatch
    done = r + run
    stored = done + ret
    ev = [["CREATED", created], ["QUEUED", q], ["DISPATCHED", d], ["RUNNING", r], ["DONE", done],
          [state, stored], ["STORED", stored]]
    return {"task_id": f"t{i}", "endpoint_id": endpoint, "state": state, "created": created, "events": ev}


def test_stages_are_differences_of_events():
    tasks = [task(i, 1000.0 + i * 0.05) for i in range(200)]
    summary, series = analyse(tasks, [{"endpoint_id": "ep1", "name": "local", "metadata": {"workers": 2}}],
                              since=999.0, names={"ep1": "local"})
    st = summary["stages_ms"]
    for name, want in (("service", 1.0), ("queue", 10.0), ("dispatch", 2.0), ("run", 100.0), ("return", 3.0)):
        assert st[name]["n"] == 200
        assert math.isclose(st[name]["p50"], want, rel_tol=1e-6) and math.isclose(st[name]["mean"], want, rel_tol=1e-6)
    assert summary["tasks"] == 200 and summary["states"] == {"SUCCEEDED": 200}
    assert summary["endpoints"]["local"]["tasks"] == 200
    assert math.isclose(summary["endpoints"]["local"]["stages_mean_ms"]["run"], 100.0, rel_tol=1e-6)
    assert summary["utilization"]["workers"] == 2 and summary["utilization"]["workers_from"] == "endpoints"
    # one task every 50 ms, each 116 ms in the system: about 2.3 in flight, 2 running at most
    ll = summary["littles_law"]
    assert math.isclose(ll["W_mean_s"], 0.116, rel_tol=1e-6)
    assert math.isclose(ll["lambda_per_s"], 20.0, rel_tol=0.05)
    assert math.isclose(ll["ratio"], 1.0, rel_tol=0.05)
    assert 0.9 < summary["utilization"]["mean"] < 1.1
    assert len(series["t"]) == 60 and series["backlog"]["local"].max() <= 1.0
    assert series["stage_values_ms"]["run"].size == 200


def test_throughput_counts_completions_per_bin():
    tasks = [task(i, 0.0, service=0, queue=0, dispatch=0, run=1.0 + (i % 10), ret=0) for i in range(100)]
    summary, series = analyse(tasks, [], since=0.0, bins=10)
    assert sum(series["completions_per_s"] * summary["window"]["bin_seconds"]) == 100
    assert summary["utilization"]["workers_from"] == "observed peak"
    assert math.isclose(summary["throughput"]["mean_per_s"], 100 / summary["window"]["seconds"])


def test_unfinished_and_retried_tasks():
    t = task(1, 10.0)
    t["events"] = [["CREATED", 10.0], ["QUEUED", 10.1], ["DISPATCHED", 10.2], ["QUEUED", 11.0],
                   ["DISPATCHED", 11.5], ["RUNNING", 11.6]]
    t["state"] = "RUNNING"
    st = stamps(t["events"])
    assert st["DISPATCHED"] == 11.5 and st["QUEUED"] == 11.0 and "FINAL" not in st
    summary, _ = analyse([t, task(2, 10.0)], [], since=0.0)
    assert summary["states"] == {"RUNNING": 1, "SUCCEEDED": 1}
    assert summary["stages_ms"]["run"]["n"] == 1  # the unfinished one has no run time yet


def test_empty_and_since():
    summary, series = analyse([], [], since=5.0)
    assert summary["tasks"] == 0 and summary["window"] is None and series == {}
    assert parse_since("30m", now=10_000.0) == 10_000.0 - 1800
    assert parse_since("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_since(123.5) == 123.5
    assert parse_since("1970-01-01T00:01:00Z") == 60.0
    try:
        parse_since("yesterday-ish")
    except ValueError as exc:
        assert "30m" in str(exc)
    else:
        raise AssertionError("a bad since was accepted")
