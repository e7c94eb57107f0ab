"""benchmarks/multi_user.py runs end to end (issue 23's figures): `--quick --json` ends with
one JSON object holding the four figures, each a positive number. No timing is asserted:
the figures are the benchmark's to report, not this test's to judge."""
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


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("redis-server"),
                    reason="the multi-user benchmark needs root, useradd and redis-server")
def test_quick_benchmark_reports_the_four_figures():
    from tests.multiuser import system_python_problem

    problem = system_python_problem()
    if problem:
        pytest.skip(problem)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "multi_user.py"), "--quick", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    figures = json.loads(lines[-1])
    for key in FIGURES:
        value = figures.get(key)
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0, (key, value)
    assert len(figures["cold_start_samples_s"]) == figures["users"]
