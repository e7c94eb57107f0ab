"""benchmarks/multi_user.py runs end to end (issue 23's figures): `--quick --json` ends with
one JSON object holding the four figures, each a positive number; `--idle` with two users
and short timeouts (issue 39's) ends with its figures, every lane unbound and bound again and
no task lost. No timing is asserted: the figures are the benchmark's to report, not this
test's to judge."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ("cold_start_first_result_s", "warm_rtt_over_single_user", "ten_users_over_one_user",
           "idle_user_agent_rss_mb")


needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("redis-server"),
                                reason="the multi-user benchmark needs root, useradd and redis-server")


def _run(*args: str, timeout: float) -> dict:
    from tests.multiuser import system_python_problem

    problem = system_python_problem()
    if problem:
        pytest.skip(problem)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "multi_user.py"), *args, "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    return json.loads(lines[-1])


@needs_root
def test_quick_benchmark_reports_the_four_figures():
    figures = _run("--quick", timeout=300)
    for key in FIGURES:
        value = figures.get(key)
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0, (key, value)
    assert len(figures["cold_start_samples_s"]) == figures["users"]


@needs_root
def test_idle_benchmark_stops_restarts_unbinds_and_loses_nothing():
    figures = _run("--idle", "--users", "2", "--idle-timeout", "2", "--lane-idle", "20", "--window", "1",
                   "--running", "1", timeout=900)
    for key in ("router_idle_cpu_percent", "router_idle_cpu_percent_unbound", "router_running_cpu_percent"):
        value = figures[key]
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0, (key, value)
    for key in ("cold_start_first_s", "cold_start_restart_s", "cold_start_rebind_s"):
        assert figures[key]["n"] == 2 and figures[key]["p50"] > 0, (key, figures[key])
    assert figures["routed_during_restart"] == 0  # through the lanes
    assert figures["lanes_unbound_before_phase_4"] == 0 and figures["lanes_unbound_idle"] == 2
    assert figures["routed_during_rebind"] == 2   # through the router, which bound the lanes again
    assert figures["tasks_submitted"] == 7 and figures["tasks_lost"] == 0
