"""The results, reaper and history handlers on a real Redis and moto: CAS transitions,
partial batch failures, lease expiry, retry budgets, dead letters, durable history."""
from __future__ import annotations

import json
import time

import pytest

from skyfn.protocol import pack_args, serialize_function
from skyfn.protocol.messages import ResultPack, TaskResult, TaskUpdate
from tests.service.conftest import Context
from tests.service.liveness import heard_long_ago
from tests.service.sealing import sealed
from lambdas.adapters.redis_store.connection import redis_client


def inc(x):
    return x + 1


@pytest.fixture
def submitted(api):
    _, f = api.call("POST", "/functions", {"function": serialize_function(inc)})
    _, e = api.call("POST", "/endpoints", {"name": "hpc"})
    _, s = api.call("POST", "/tasks", {"endpoint_id": e["endpoint_id"], "max_retries": 1,
                                       "tasks": [{"function_id": f["function_id"], "payload": pack_args((i,), {})} for i in range(4)]})
    return e["endpoint_id"], s["task_ids"]


def sqs_event(bodies: list[str]) -> dict:
    return {"Records": [{"messageId": f"m{i}", "receiptHandle": f"r{i}", "body": b, "attributes": {"ApproximateReceiveCount": "1"},
                         "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
                         "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:results", "awsRegion": "us-east-1"}
                        for i, b in enumerate(bodies)]}


def states(api, ids):
    _, st = api.call("POST", "/tasks/status", {"task_ids": ids, "include_events": True})
    return {tid: st["tasks"][tid]["state"] for tid in ids}, st


def test_results_handler_drops_what_it_cannot_apply_and_duplicates(api, submitted):
    """A body that is not a sealed pack is dropped, not redelivered (a retry cannot mend it)."""
    from lambdas.results import handler

    ep, ids = submitted
    good = sealed(ep, ResultPack(endpoint_id=ep, results=[TaskResult(
        task_id=ids[0], state="SUCCEEDED", result="json 3.11\n1",
        events=[("DISPATCHED", 1.0), ("RUNNING", 2.0), ("DONE", 3.0)])]))
    out = handler(sqs_event([good, "{broken", sealed(ep, "{broken"), good]), Context())
    assert out == {"batchItemFailures": []}
    got, st = states(api, ids)
    assert got[ids[0]] == "SUCCEEDED" and st["tasks"][ids[0]]["result"] == "json 3.11\n1"
    names = [e[0] for e in st["tasks"][ids[0]]["events"]]
    assert names == ["CREATED", "QUEUED", "DISPATCHED", "RUNNING", "DONE", "SUCCEEDED", "STORED"]
    # a duplicate with another value never overwrites the stored result
    dup = sealed(ep, ResultPack(endpoint_id=ep, results=[TaskResult(task_id=ids[0], state="FAILED", reason="late")]))
    assert handler(sqs_event([dup]), Context()) == {"batchItemFailures": []}
    assert states(api, ids)[0][ids[0]] == "SUCCEEDED"


def test_progress_never_goes_backwards(api, submitted):
    from lambdas.results import apply_pack

    ep, ids = submitted
    now = time.time()
    apply_pack(ResultPack(endpoint_id=ep, updates=[TaskUpdate(task_id=ids[1], state="RUNNING", ts=now)]))
    apply_pack(ResultPack(endpoint_id=ep, updates=[TaskUpdate(task_id=ids[1], state="DISPATCHED", ts=now)]))
    assert states(api, ids)[0][ids[1]] == "RUNNING"


def test_reaper_requeues_expired_leases_then_fails_past_budget(api, submitted):
    from lambdas.reaper import reap
    from lambdas.results import apply_pack

    ep, ids = submitted
    apply_pack(ResultPack(endpoint_id=ep, updates=[TaskUpdate(task_id=ids[2], state="DISPATCHED", ts=time.time(), lease_seconds=0.01)]))
    time.sleep(0.05)
    assert reap()["requeued"] == 1
    got, st = states(api, ids)
    assert got[ids[2]] == "QUEUED" and st["tasks"][ids[2]]["retries"] == 1
    apply_pack(ResultPack(endpoint_id=ep, updates=[TaskUpdate(task_id=ids[2], state="RUNNING", ts=time.time(), lease_seconds=0.01)]))
    time.sleep(0.05)
    assert reap()["lease_failed"] == 1  # max_retries=1 exhausted
    got, st = states(api, ids)
    assert got[ids[2]] == "FAILED" and "retry budget max_retries=1 exhausted" in st["tasks"][ids[2]]["reason"]


def test_reaper_marks_silent_endpoints_offline(api, submitted, monkeypatch):
    from lambdas.core import deps
    from lambdas.reaper import reap

    ep, _ = submitted
    api.call("POST", f"/endpoints/{ep}/heartbeat", {})
    heard_long_ago(ep)
    assert reap()["offline"] == 1
    assert api.call("GET", f"/endpoints/{ep}")[1]["status"] == "offline"


def test_reaper_finds_endpoints_by_their_index_and_rebuilds_a_missing_one(api, submitted):
    from lambdas.core import deps
    from lambdas.core.tasks import registry
    from lambdas.reaper import reap

    ep, _ = submitted
    r = redis_client()
    assert r.sismember(registry.ALL_ENDPOINTS, ep)  # indexed when its record was cached
    r.delete(registry.ALL_ENDPOINTS)  # a store written before the index existed
    api.call("POST", f"/endpoints/{ep}/heartbeat", {})
    heard_long_ago(ep)
    assert reap()["offline"] == 1
    assert r.sismember(registry.ALL_ENDPOINTS, ep)  # scanned once, indexed again
    assert ep in registry.cached_endpoint_ids()


def test_dead_lettered_packs_fail_their_tasks_with_the_reason(api, submitted):
    from lambdas.core import deps
    from lambdas.reaper import reap

    ep, ids = submitted
    queue, _ = deps.task_queue(ep)
    queue.visibility_timeout = 0.05
    for _ in range(queue.max_deliveries + 1):
        queue.receive(10, 0, visibility_timeout=0.05)
        time.sleep(0.1)
    assert reap()["dead_lettered"] == 4
    got, st = states(api, ids)
    assert set(got.values()) == {"FAILED"}
    assert "dead-lettered after" in st["tasks"][ids[0]]["reason"]


def test_history_flush_archives_then_redis_expires_final_records(api, other_api, submitted):
    from lambdas.core import deps
    from lambdas.history import flush
    from lambdas.results import apply_pack

    ep, ids = submitted
    apply_pack(ResultPack(endpoint_id=ep, results=[TaskResult(task_id=t, state="SUCCEEDED", result="json 3.11\n0") for t in ids]))
    states(api, ids)  # retrieved: the records may leave Redis result_ttl later, once archived
    r = redis_client()
    assert [r.ttl(f"t:{t}") for t in ids] == [-1] * 4  # not before the durable history has them
    out = flush()
    assert out == {"taken": 5, "submissions": 1, "tasks": 4, "pages": 1}
    assert all(0 < r.ttl(f"t:{t}") <= 600 for t in ids) and int(r.get("stats:archived")) == 4
    r.delete(*[f"t:{t}" for t in ids])  # as if their time had come
    status, info = api.call("GET", f"/tasks/{ids[0]}")
    assert status == 200 and info["state"] == "SUCCEEDED"
    assert [e[0] for e in info["events"]][-2:] == ["SUCCEEDED", "STORED"]
    _, st = api.call("POST", "/tasks/status", {"task_ids": ids})
    assert {t["state"] for t in st["tasks"].values()} == {"SUCCEEDED"}
    sub = deps.dynamo().get_submission(info["submission_id"])
    assert sub["task_count"] == 4 and sub["owner"] == "alice"
    code, _ = other_api.call("GET", f"/tasks/{ids[0]}")
    assert code == 404  # another user's archived task is not theirs to read


def test_unarchived_records_never_expire(api, submitted):
    """A finished, read task keeps its record until the history has it, however long that takes."""
    from lambdas.core import deps
    from lambdas.results import apply_pack

    ep, ids = submitted
    apply_pack(ResultPack(endpoint_id=ep, results=[TaskResult(task_id=ids[0], state="SUCCEEDED", result="json 3.11\n0")]))
    states(api, [ids[0]])
    r = redis_client()
    assert r.exists(f"t:{ids[0]}") and r.ttl(f"t:{ids[0]}") == -1 and r.hget(f"t:{ids[0]}", "rt")


def test_service_on_sqs_queues(api, monkeypatch, unique):
    """The AWS shape: tasks packed into SQS messages, results consumed from SQS."""
    from lambdas.core import deps
    from lambdas.results import handler as results_handler
    from skyfn.protocol.messages import TaskPack
    from skyfn.protocol.queues import open_queue

    monkeypatch.setenv("SKYFN_QUEUE_KIND", "sqs")
    monkeypatch.setenv("SKYFN_SQS_PREFIX", f"q{unique}")
    deps.reset()
    _, f = api.call("POST", "/functions", {"function": serialize_function(inc)})
    status, e = api.call("POST", "/endpoints", {"name": "cloud"})
    assert status == 201 and e["task_queue"]["kind"] == "sqs" and e["task_queue"]["url"].startswith("http")
    _, s = api.call("POST", "/tasks", {"endpoint_id": e["endpoint_id"],
                                       "tasks": [{"function_id": f["function_id"], "payload": pack_args((i,), {})} for i in range(600)]})
    queue = open_queue(e["task_queue"], consumer="agent", visibility_timeout=30)
    msgs = queue.receive(max_messages=10, wait_seconds=1)
    packs = [TaskPack.model_validate_json(m.body) for m in msgs]
    assert sorted(t.task_id for p in packs for t in p.tasks) == sorted(s["task_ids"])  # 600 tasks in 2 messages
    assert len(msgs) == 2 and all(f["function_id"] in p.functions for p in packs)
    results = ResultPack(endpoint_id=e["endpoint_id"], results=[
        TaskResult(task_id=t, state="SUCCEEDED", result="json 3.11\n1") for t in s["task_ids"]])
    assert results_handler(sqs_event([sealed(e["endpoint_id"], results)]), Context()) == {"batchItemFailures": []}
    got, _ = states(api, s["task_ids"])
    assert set(got.values()) == {"SUCCEEDED"}


def test_pack_carries_container_walltime_resources_and_output_is_stored(api):
    from lambdas.core import deps
    from lambdas.results import apply_pack
    from skyfn.protocol.messages import TaskPack

    _, f = api.call("POST", "/functions", {"function": serialize_function(inc), "container": "py-sci"})
    _, e = api.call("POST", "/endpoints", {"name": "gpu-node"})
    _, s = api.call("POST", "/tasks", {"endpoint_id": e["endpoint_id"], "tasks": [
        {"function_id": f["function_id"], "payload": pack_args((1,), {}), "walltime": 5, "resources": {"gpus": 1}},
        {"function_id": f["function_id"], "payload": pack_args((2,), {}), "container": "other"}]})
    queue, _ = deps.task_queue(e["endpoint_id"])
    pack = TaskPack.model_validate_json(queue.receive(1, 0)[0].body)
    first, second = pack.tasks
    assert (first.container, first.walltime, first.resources) == ("py-sci", 5.0, {"cores": 1, "gpus": 1})
    assert (second.container, second.walltime, second.resources) == ("other", None, None)
    apply_pack(ResultPack(endpoint_id=e["endpoint_id"], results=[
        TaskResult(task_id=first.task_id, state="SUCCEEDED", result="json 3.11\n2", stdout="hello\n", stderr="warn\n")]))
    _, st = api.call("POST", "/tasks/status", {"task_ids": [first.task_id]})
    assert (st["tasks"][first.task_id]["stdout"], st["tasks"][first.task_id]["stderr"]) == ("hello\n", "warn\n")
    assert api.call("GET", f"/tasks/{first.task_id}")[1]["stdout"] == "hello\n"


def test_cancel_notifies_the_agent_on_its_control_queue(api, submitted):
    from skyfn.protocol.messages import ControlMessage
    from skyfn.protocol.queues import open_queue

    ep, ids = submitted
    status, reg = api.call("POST", "/endpoints", {"name": "hpc"})
    assert reg["control_queue"]["name"] == f"control:{ep}"
    assert api.call("DELETE", f"/tasks/{ids[3]}")[0] == 200
    control = open_queue(reg["control_queue"], consumer="agent")
    msgs = control.receive(10, 1)
    assert [ControlMessage.model_validate_json(m.body).cancel for m in msgs] == [[ids[3]]]


def test_a_store_from_before_record_expiry_gets_its_purge_index_turned_into_expiries(api, submitted):
    """Records a store of an earlier build listed in its `purge` zset: the archived ones get
    that time as their expiry, the unarchived ones wait for the drain; the zset goes."""
    from lambdas.core import deps
    from lambdas.reaper import reap

    _, ids = submitted
    r = redis_client()
    r.hset(f"t:{ids[0]}", "h", 1)
    at = time.time() + 300
    r.zadd("purge", {ids[0]: at, ids[1]: at})
    assert reap()["legacy_purge_index"] == 2
    assert not r.exists("purge")
    assert r.pexpiretime(f"t:{ids[0]}") == int(at * 1000) and r.ttl(f"t:{ids[1]}") == -1
