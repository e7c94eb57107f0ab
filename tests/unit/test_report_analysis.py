"""skyfn.report.analysis on synthetic task events with known answers."""
from __future__ import annotations

import math

from skyfn.report.analysis import STAGES, analyse, stamps
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


def waited(i, created, wait, state="SUCCEEDED"):
    """A task with inputs: CREATED and WAITING at once, QUEUED when its inputs all succeeded
    `wait` seconds later, then 10 ms in the queue, 2 ms dispatch, 100 ms run, 3 ms return."""
    q = created + wait
    ev = [["CREATED", created], ["WAITING", created], ["QUEUED", q], ["DISPATCHED", q + 0.01],
          ["RUNNING", q + 0.012], ["DONE", q + 0.112], [state, q + 0.115], ["STORED", q + 0.115]]
    return {"task_id": f"w{i}", "endpoint_id": "ep1", "state": state, "created": created, "events": ev}


def test_waiting_for_inputs_is_its_own_stage_and_not_service():
    tasks = [task(i, 100.0) for i in range(10)] + [waited(i, 100.0, 0.5 + 0.1 * i) for i in range(10)]
    st = stamps(tasks[10]["events"])
    assert st["WAITING"] == 100.0 and st["RELEASED"] == st["QUEUED"] == 100.5
    summary, series = analyse(tasks, [], since=99.0, names={"ep1": "local"})
    stages = summary["stages_ms"]
    # service: 1 ms for the 10 plain tasks, 0 for the waiting ones (CREATED and WAITING at once)
    assert stages["service"]["n"] == 20 and math.isclose(stages["service"]["mean"], 0.5, rel_tol=1e-6)
    assert stages["waiting"]["n"] == 10
    assert math.isclose(stages["waiting"]["mean"], 950.0, rel_tol=1e-6)
    assert math.isclose(stages["waiting"]["p50"], 950.0, rel_tol=1e-6)
    assert math.isclose(stages["queue"]["mean"], 10.0, rel_tol=1e-6) and stages["queue"]["n"] == 20
    assert math.isclose(summary["endpoints"]["local"]["stages_mean_ms"]["waiting"], 950.0, rel_tol=1e-6)
    assert summary["states"] == {"SUCCEEDED": 20}
    assert summary["waiting"]["tasks"] == 10 and 0 < summary["waiting"]["peak"] <= 10
    assert series["stage_values_ms"]["waiting"].size == 10 and series["waiting"].max() <= 10
    # 10 tasks waiting 0.5..1.4 s each: the time average over the window is their total wait / window
    total = float((series["waiting"] * summary["window"]["bin_seconds"]).sum())
    assert math.isclose(total, sum(0.5 + 0.1 * i for i in range(10)), rel_tol=1e-6)


def test_a_task_still_waiting_or_failed_by_its_input_has_no_waiting_stage_yet():
    still = {"task_id": "s", "endpoint_id": "ep1", "state": "WAITING", "created": 10.0,
             "events": [["CREATED", 10.0], ["WAITING", 10.0]]}
    failed = {"task_id": "f", "endpoint_id": "ep1", "state": "FAILED", "created": 10.0,
              "events": [["CREATED", 10.0], ["WAITING", 10.0], ["FAILED", 12.0], ["STORED", 12.0]]}
    retried = waited(1, 10.0, 1.0)  # released at 11.0, then its lease expired: queued again at 13.0
    retried["events"][3:3] = [["DISPATCHED", 11.01], ["QUEUED", 13.0]]
    retried["events"][5:] = [["DISPATCHED", 13.01], ["RUNNING", 13.02], ["DONE", 13.1], ["SUCCEEDED", 13.2],
                             ["STORED", 13.2]]
    summary, series = analyse([still, failed, retried], [], since=0.0, now=14.0)
    assert summary["states"] == {"WAITING": 1, "FAILED": 1, "SUCCEEDED": 1}
    stages = summary["stages_ms"]
    assert stages["waiting"]["n"] == 1 and math.isclose(stages["waiting"]["mean"], 1000.0, rel_tol=1e-6)
    # the retried one's service is what its wait leaves of CREATED -> the last QUEUED
    assert stages["service"]["n"] == 1 and math.isclose(stages["service"]["mean"], 2000.0, rel_tol=1e-6)
    assert summary["waiting"]["tasks"] == 3  # all three waited: in the time series until released or final


def test_the_report_text_and_page_show_the_waiting_stage():
    from skyfn.report import page

    tasks = [task(i, 100.0) for i in range(5)] + [waited(i, 100.0, 2.0) for i in range(5)]
    summary, _ = analyse(tasks, [], since=99.0, names={"ep1": "local"})
    text = page.text(summary)
    row = next(ln for ln in text.splitlines() if ln.startswith("waiting "))
    assert row.split() == ["waiting", "2,000.00", "2,000.00", "2,000.00"]
    assert "5 tasks waited for their inputs" in text
    html = page.html(summary, {}, standalone=True)
    assert "<tr><th>waiting</th><td>2,000.00</td><td>2,000.00</td><td>2,000.00</td><td>2,000.00</td></tr>" in html
    assert "<th>waiting (ms)</th>" in html
    plain = page.text(analyse([task(1, 1.0)], [], since=0.0)[0])
    assert "waited for their inputs" not in plain and "waiting " in plain  # the row, empty


def test_the_figures_draw_the_waiting_stage(tmp_path):
    from skyfn.report import plots

    tasks = [task(i, 100.0 + i * 0.01) for i in range(20)] + [waited(i, 100.0, 0.5) for i in range(20)]
    summary, series = analyse(tasks, [], since=99.0, names={"ep1": "local"})
    pngs = plots.render(summary, series, tmp_path)
    assert set(pngs) == set(plots.FIGURES) and all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs.values())
    assert set(plots.COLORS) == set(STAGES)  # every stage, waiting among them, has its colour
