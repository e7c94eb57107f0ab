"""Flows built with skyfn.flows, compiled to ASL by the service and executed under moto's
Step Functions with the real RunTask handler and the local endpoint: sequence, map,
parallel, retry and catch, the documented failure states (TaskFailed, EndpointOffline),
the serial-crystallography example and `skyfn flow run`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skyfn.flows import Flow, Map, Parallel, Step
from skyfn.runs import RunFailed
from tests.runs import fns

REPO = Path(__file__).resolve().parents[2]


def test_sequence_map_parallel_values(client, endpoint):
    flow = Flow("values", Step(fns.upto, "local"), Map(Step(fns.square, "local"), name="squares"),
                Parallel(Step(fns.total, "local"), Step(fns.largest, "local"), name="summary"))
    assert flow.run(client, 5).result(timeout=120) == [0 + 1 + 4 + 9 + 16, 16]


def test_failing_step_fails_the_run_with_task_failed(client, endpoint):
    run = Flow("fails", Step(fns.square, "local"), Step(fns.always_fails, "local")).run(client, 3)
    with pytest.raises(RunFailed) as info:
        run.result(timeout=120)
    assert info.value.state == "FAILED" and info.value.error == "TaskFailed"
    assert "always_fails" in info.value.cause and "ValueError: this step always fails (input 9)" in info.value.cause
    status = run.status()
    assert status["state"] == "FAILED" and status["error"] == "TaskFailed"


def test_retry_resubmits_and_catch_recovers(client, endpoint, tmp_path):
    counter = str(tmp_path / "calls")
    flaky = Flow("flaky", Step(fns.fails_first_time, "local").retry(errors=["TaskFailed"], max_attempts=2))
    assert flaky.run(client, {"counter": counter}).result(timeout=120) == {"calls": 2}

    # the handler runs with {Error, Cause}; its result continues the flow (here: into `total`)
    caught = Flow("caught", Step(fns.always_fails, "local").catch(Step(fns.upto, "local", name="fallback"),
                                                                  errors=["ValueError", "TaskFailed"]),
                  Step(fns.total, "local"))
    with pytest.raises(RunFailed):  # upto({Error, Cause}) itself fails: a dict is not a number
        caught.run(client, 1).result(timeout=120)
    out = Flow("caught-once", Step(fns.always_fails, "local").catch(Step(fns.recover, "local"))).run(client, 1)
    assert out.result(timeout=120) == {"recovered_from": "TaskFailed", "cause_mentions_input": True}


def test_step_on_offline_endpoint_ends_in_endpoint_offline(client, offline_endpoint):
    run = Flow("offline", Step(fns.square, offline_endpoint)).run(client, 2)
    with pytest.raises(RunFailed) as info:
        run.result(timeout=60)
    assert info.value.error == "EndpointOffline" and "gone-away" in info.value.cause


def test_flow_naming_a_foreign_function_is_refused(client, endpoint):
    from skyfn.http import SkyfnAPIError

    with pytest.raises(SkyfnAPIError) as info:
        Flow("bad", Step("0b7a7c8e-0000-4000-8000-000000000000", "local")).run(client, 1)
    assert info.value.status == 404 and "register it first" in info.value.message


def test_crystallography_flow(client, endpoint, tmp_path):
    from examples import crystallography_flow as ssx

    params = dict(ssx.INPUT, images=6, workdir=str(tmp_path))
    metadata, plot = ssx.build("local").run(client, params).result(timeout=300)
    record = json.loads(Path(metadata["metadata"]).read_text())
    assert record["images"] == 6 and record["indexed"] == 6 and record["indexing_rate"] == 1.0
    assert abs(record["cell"] - params["cell"]) < 0.3 and record["cell_sigma"] < 0.3
    assert record["spots"] > 6 * 40
    png = Path(plot["plot"]).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and plot["width"] == 40 + 24 * 6
    assert sorted(p.name for p in tmp_path.glob("still_*.npy")) == [f"still_{i:04d}.npy" for i in range(6)]


def test_cli_flow_run(wf_home):
    env = dict(os.environ, SKYFN_HOME=str(wf_home), PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "skyfn.cli", "flow", "run", "tests/runs/sample_flow.py"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [0 + 1 + 4 + 9, 9]
    r = subprocess.run([sys.executable, "-m", "skyfn.cli", "flow", "run", "tests/runs/sample_flow.py",
                        "--input", "{not json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--input is not JSON" in r.stderr
