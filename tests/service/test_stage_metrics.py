"""Per-stage latency metrics (EMF) of the results function and the results push from the
results path, on a real Redis (issue 13)."""
from __future__ import annotations

import json
import math

import pytest

from skyfn.protocol.messages import ResultPack, TaskResult
from tests.service.sealing import sealed
from tests.service.test_handlers import submitted  # noqa: F401 - the fixture
from lambdas.adapters.redis_store.connection import redis_client


def test_stage_means_from_events():
    from lambdas.core.tasks.stage_metrics import stage_means

    a = "CREATED@10.000;QUEUED@10.001;DISPATCHED@10.011;RUNNING@10.013;DONE@10.113;SUCCEEDED@10.116;STORED@10.116;"
    b = "CREATED@20.000;QUEUED@20.003;DISPATCHED@20.013;RUNNING@20.015;DONE@20.315;FAILED@20.318;STORED@20.318;"
    means, n = stage_means([a, b, None, "CREATED@1.0;QUEUED@1.5;"])
    assert n == 3
    want = {"StageServiceMs": 2.0 * 1000 / 1000, "StageQueueMs": 10.0, "StageDispatchMs": 2.0, "StageRunMs": 200.0,
            "StageReturnMs": 3.0, "TaskTotalMs": 217.0}
    want["StageServiceMs"] = (1.0 + 3.0 + 500.0) / 3
    for name, value in want.items():
        assert math.isclose(means[name], value, rel_tol=1e-6), (name, means[name])


def test_the_wait_for_inputs_is_its_own_stage_not_service():
    from lambdas.core.tasks.stage_metrics import stage_means

    # a task with inputs: released 2.5 s after it was stored WAITING
    w = ("CREATED@10.000;WAITING@10.000;QUEUED@12.500;DISPATCHED@12.510;RUNNING@12.512;DONE@12.612;"
         "SUCCEEDED@12.615;STORED@12.615;")
    plain = "CREATED@20.000;QUEUED@20.004;DISPATCHED@20.014;RUNNING@20.016;DONE@20.116;SUCCEEDED@20.119;STORED@20.119;"
    failed = "CREATED@30.000;WAITING@30.000;FAILED@31.000;STORED@31.000;"  # an input failed: never released
    means, n = stage_means([w, plain, failed])
    assert n == 3
    assert math.isclose(means["StageWaitingMs"], 2500.0, rel_tol=1e-6)  # only the released one has the stage
    assert math.isclose(means["StageServiceMs"], (0.0 + 4.0) / 2, rel_tol=1e-6)
    assert math.isclose(means["StageQueueMs"], 10.0, rel_tol=1e-6)
    assert math.isclose(means["TaskTotalMs"], (2615.0 + 119.0 + 1000.0) / 3, rel_tol=1e-6)
    assert "StageWaitingMs" not in stage_means([plain])[0]  # no task waited: no such metric in the pack


def test_results_function_emits_stage_metrics_and_pushes(api, submitted, monkeypatch, capsys):  # noqa: F811
    from aws_lambda_powertools import Metrics

    from lambdas import results
    from skyfn.protocol.push import CHANNEL_PREFIX

    ep, ids = submitted
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    pubsub = redis_client().pubsub()
    pubsub.psubscribe(CHANNEL_PREFIX + "*")
    pubsub.get_message(timeout=2)
    metrics = Metrics(namespace="skyfn", service="results")
    monkeypatch.setattr(results, "metrics", metrics)
    pack = ResultPack(endpoint_id=ep, results=[
        TaskResult(task_id=tid, state="SUCCEEDED", result=f"json 3.11\n{i}",
                   events=[("DISPATCHED", 1.0), ("RUNNING", 2.0), ("DONE", 2.5)]) for i, tid in enumerate(ids[:3])])
    results.record_handler(type("R", (), {"body": sealed(ep, pack)})())
    emf = metrics.serialize_metric_set()
    names = {m["Name"] for m in emf["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert {"ResultsStored", "StageRunMs", "TaskTotalMs", "TasksMeasured", "StageServiceMs"} <= names
    assert emf["StageRunMs"] == [500.0] and emf["TasksMeasured"] == [3.0] and emf["service"] == "results"
    # the push: one message for the owner, with every id, the small results inside, and the chain
    msg = None
    for _ in range(20):
        got = pubsub.get_message(timeout=1)
        if got and got["type"] == "pmessage":
            msg = json.loads(got["data"])
            break
    pubsub.close()
    assert msg is not None and msg["type"] == "done"
    assert sorted(msg["ids"]) == sorted(ids[:3])
    assert {t["task_id"]: t["result"] for t in msg["tasks"]} == {tid: f"json 3.11\n{i}" for i, tid in enumerate(ids[:3])}
    assert msg["prev"] != msg["cursor"]
    _, status = api.call("POST", "/tasks/status", {"task_ids": ids[:3]})
    assert status["cursor"] == msg["cursor"]  # the same position the status long-poll reports
