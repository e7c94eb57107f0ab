"""benchmarks/dataflow.py runs end to end (issue 26; `make bench-dataflow` is the full run): a
chain of 20 and a fan-in of 50 on its own embedded runtime, on Parsl HTEX, and on Dask
distributed when it is installed (requirements-bench.txt). The JSON holds every figure and
ratio, every system's chain ended at 20 and its reduce summed the 50 mappers, and the SDK
sent nothing but its POST /tasks while the graphs ran -- bar the results push's own safety
net (a status call after a quiet second), which its counters then show. No timing is
asserted: the figures are the benchmark's to report, not this test's to judge."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("chain", "fanin", "workers", "chain_edge_ms", "chain_s", "fanin_s", "client_requests_during_graph",
          "chain_edge_breakdown_ms", "requests_detail", "push_stats", "startup_s", "peers", "checks", "goals",
          "chain_edge_over_parsl", "fanin_over_parsl")
DASK_FIELDS = ("chain_edge_over_dask", "fanin_over_dask")


@pytest.mark.timeout(480)
def test_tiny_dataflow_benchmark_reports_every_figure_with_right_results():
    dask = importlib.util.find_spec("distributed") is not None
    peers = "parsl,dask" if dask else "parsl"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "dataflow.py"), "--json", "--chain", "20",
                           "--fanin", "50", "--graph", "25", "--peers", peers, "--timeout", "120"],
                          cwd=ROOT, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    missing = [key for key in FIELDS + (DASK_FIELDS if dask else ()) if key not in report]
    assert missing == [], missing
    assert (report["chain"], report["fanin"]) == (20, 50)
    systems = {"skyfn", "parsl_htex"} | ({"dask_distributed"} if dask else set())
    assert set(report["checks"]) == systems
    assert report["checks"]["skyfn"] == {"chain": True, "fanin": True, "graph": True}, report["checks"]
    assert all(c == {"chain": True, "fanin": True} for name, c in report["checks"].items() if name != "skyfn")
    assert (report["graph"]["tasks"], report["graph"]["edges"], report["graph"]["wrong"]) == (25, 25, 0)
    assert set(report["peers"]) == systems - {"skyfn"}
    for graph in ("chain", "fanin"):
        detail = report["requests_detail"][graph]
        assert detail["task_posts"] >= 1, detail
        assert set(detail["after_submission"]) <= {"POST /tasks/status"}, detail
    push = report["push_stats"]
    assert push["connects"] >= 1 and push["pushed_results"] >= 20 + 1 + 50 + 1, push
    if report["client_requests_during_graph"]:
        assert push["quiet_checks"] or push["gaps"] or push["fetched"], (report["requests_detail"], push)
    assert isinstance(report["goals"], dict) and "client_requests_during_graph == 0" in report["goals"]
