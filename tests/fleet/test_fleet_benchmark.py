"""benchmarks/fleet.py in its smallest form, end to end: one rung of 5 endpoints (a fleet
host process of light agents) with a few seconds per window, and a short churn (a host of
2 agents SIGKILLed and restarted under load). Checks the last line's keys and every rung
figure the report names, that every task resolved with its value, and that the churn lost
and duplicated nothing -- no timing is asserted (the machine may be loaded)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAST_LINE_KEYS = {"p99_rtt_over_n10_busy", "p99_rtt_over_n10_idle", "cpu_per_task_over_n10",
                  "idle_endpoint_redis_ops_per_s", "idle_endpoint_redis_bytes", "redis_mb_per_1000_endpoints",
                  "rungs", "churn_lost", "churn_duplicates", "churn_unresolved"}
RUNG_KEYS = {"n", "m", "service_cpu_us_per_task", "idle_service_cpu_ms_per_endpoint_min",
             "idle_redis_ops_per_endpoint_s", "idle_store_bytes_per_endpoint", "redis_used_mb_idle",
             "redis_connected_clients", "gateway_connections_idle", "agent_http_requests_per_endpoint_min",
             "agent_queue_receives_per_endpoint_min", "busy", "idle", "lag"}


@pytest.mark.timeout(600)
def test_fleet_benchmark_smallest_ladder_and_churn(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.fleet", "--json", "--rungs", "5", "--minutes", "0.2",
           "--heartbeat-period", "2", "--heartbeat-timeout", "6", "--lease-seconds", "10", "--lag-endpoints", "1",
           "--churn", "--churn-minutes", "0.3", "--churn-endpoints", "4", "--churn-batch", "2", "--churn-rate", "12",
           "--churn-users", "2", "--rate", "40"]
    env = {k: v for k, v in os.environ.items() if k not in ("SKYFN_HOME", "SKYFN_ENDPOINT_CREDENTIAL")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert LAST_LINE_KEYS <= set(out), proc.stderr[-3000:]
    (rung,) = out["rungs"]
    assert "error" not in rung, rung
    assert RUNG_KEYS <= set(rung)
    assert rung["n"] == 5 and rung["tasks_submitted"] > 0
    assert rung["tasks_resolved"] == rung["tasks_submitted"] and rung["unresolved"] == 0 and rung["wrong"] == 0
    assert rung["busy"]["n"] > 0 and rung["idle"]["n"] > 0
    assert "error" not in rung["lag"] and rung["lag"]["online_after_start_ms"], rung["lag"]
    assert out["idle_endpoint_redis_bytes"] is not None and out["redis_mb_per_1000_endpoints"] is not None
    churn = out["churn"]
    assert "error" not in churn, churn
    assert churn["kills"] >= 1 and churn["tasks_submitted"] > 0
    assert (out["churn_lost"], out["churn_duplicates"], out["churn_unresolved"]) == (0, 0, 0), churn
