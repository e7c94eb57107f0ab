"""Backpressure for the hot store (issue 24, lambdas/core/tasks/backlog.py): over the bound
(history outbox length, or a fraction of Redis's maxmemory) every path that creates tasks
answers 429 `backlog` with Retry-After before it stores anything or claims its idempotency
key, and takes the same request again once the backlog is back under the bound; the SDK
waits and retries through it. Real API handler, real redis-server, moto."""
from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
import redis

from lambdas.core import deps
from lambdas.core.errors import Backlogged
from lambdas.core.tasks import backlog
from skyfn.protocol import pack_args, serialize_function
from tests.service.conftest import Context, api_event

BOUND = 100


def inc(x):
    return x + 1


@pytest.fixture
def r(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.config_set("maxmemory", 0)  # the session's redis-server: leave it unbounded
    client.close()


@pytest.fixture
def bounded(api, r, monkeypatch):
    """The API with a backlog bound of BOUND outbox records, a function and an endpoint."""
    monkeypatch.setenv("SKYFN_BACKLOG_MAX", str(BOUND))
    deps.reset()
    backlog.reset()
    _, fn = api.call("POST", "/functions", {"function": serialize_function(inc)})
    _, ep = api.call("POST", "/endpoints", {"name": "site"})
    yield api, fn["function_id"], ep["endpoint_id"]
    backlog.reset()


def call(api, method: str, path: str, body) -> tuple[int, dict, dict]:
    """(status, body, headers) of the API handler's answer."""
    from lambdas.api import handler

    resp = handler(api_event(method, path, body, api.token), Context())
    headers = dict(resp.get("headers") or {})
    for name, values in (resp.get("multiValueHeaders") or {}).items():
        headers.setdefault(name, values[0])
    return resp["statusCode"], json.loads(resp["body"]) if resp.get("body") else None, headers


def fill_outbox(r, n: int) -> None:
    r.rpush("outbox", *[f"fake-{i}" for i in range(n)])
    backlog.reset()  # the next check reads the gauge now, not 0.5 s later


def task_keys(r) -> list[bytes]:
    return list(r.scan_iter("t:*"))


def submission(fid: str, ep: str, key: str, n: int = 3) -> dict:
    return {"endpoint_id": ep, "idempotency_key": key,
            "tasks": [{"function_id": fid, "payload": pack_args((i,), {})} for i in range(n)]}


# --- the outbox bound -------------------------------------------------------------------
def test_over_the_outbox_bound_submissions_get_429_backlog_and_nothing_is_stored(bounded, r):
    api, fid, ep = bounded
    fill_outbox(r, BOUND + 1)
    key = uuid.uuid4().hex
    status, body, headers = call(api, "POST", "/tasks", submission(fid, ep, key))
    assert status == 429, body
    assert body["error"] == "backlog"
    assert "history outbox holds 101 records" in body["message"] and "SKYFN_BACKLOG_MAX" in body["message"]
    assert "Nothing was stored: retry this request after 1 s" in body["message"]
    assert headers["Retry-After"] == "1"  # just over the bound
    assert body["details"]["outbox"] == BOUND + 1 and body["details"]["retry_after"] == 1
    assert task_keys(r) == []  # no task record
    assert list(r.scan_iter("idem:*")) == []  # the idempotency key was not claimed
    assert r.llen("outbox") == BOUND + 1  # no submission record queued either

    r.ltrim("outbox", 0, BOUND - 1)  # the drain catches up: at the bound is not over it
    backlog.reset()
    status, body, _ = call(api, "POST", "/tasks", submission(fid, ep, key))
    assert status == 202, body
    assert len(body["task_ids"]) == 3 and len(task_keys(r)) == 3


def test_retry_after_grows_with_how_far_over_the_bound(bounded, r):
    api, fid, ep = bounded
    fill_outbox(r, BOUND * 3 // 2)  # 50 % over
    status, body, headers = call(api, "POST", "/tasks", submission(fid, ep, "k1"))
    assert status == 429 and headers["Retry-After"] == str(backlog.MAX_RETRY_AFTER)

    def seconds(outbox: int) -> int:
        return backlog.retry_after(backlog.Backlog(outbox, 0, 0, 0, 0.0))

    assert [seconds(n) for n in (101, 106, 111, 116, 121, 1000)] == [1, 2, 3, 4, 5, 5]  # one more per 5 % over


def test_the_gauge_is_cached_for_max_age(bounded, r):
    store = deps.backlog_figures()
    first = backlog.gauge(store)
    r.rpush("outbox", "x")
    assert backlog.gauge(store) is first  # within max_age: no round trip
    assert backlog.gauge(store, 0).outbox == first.outbox + 1
    time.sleep(0.05)
    assert backlog.gauge(store, max_age=0.01).outbox == first.outbox + 1


def test_batches_are_refused_before_anything_is_staged(bounded, r):
    api, fid, ep = bounded
    fill_outbox(r, BOUND + 12)  # 12 % over: 3 s
    status, body, headers = call(api, "POST", "/batches", {
        "endpoint_id": ep, "function_id": fid, "payloads": [pack_args((1,), {})] * 5, "idempotency_key": "b1"})
    assert status == 429 and body["error"] == "backlog" and headers["Retry-After"] == "3", body
    assert list(r.scan_iter("idem:*")) == [] and list(r.scan_iter("batch:*")) == []


def test_the_action_provider_refuses_a_new_action_with_429_backlog(bounded, r):
    """Globus Flows' run of an action submits one task: refused the same way, no action made."""
    api, fid, ep = bounded
    fill_outbox(r, BOUND + 1)
    status, body, headers = call(api, "POST", "/flows-ap/run", {
        "request_id": "req-1", "body": {"function_id": fid, "endpoint_id": ep, "args": [1]}})
    assert status == 429 and body["error"] == "backlog" and headers["Retry-After"] == "1", body
    assert task_keys(r) == [] and list(r.scan_iter("apreq:*")) == [] and list(r.scan_iter("idem:*")) == []
    r.delete("outbox")
    backlog.reset()
    status, body, _ = call(api, "POST", "/flows-ap/run", {
        "request_id": "req-1", "body": {"function_id": fid, "endpoint_id": ep, "args": [1]}})
    assert status == 202 and len(task_keys(r)) == 1, body


def test_steps_that_submit_for_the_owner_raise_backlogged(bounded, r):
    """The Step Functions steps (flows, SPMD ranks, batch chunks) submit through tasks.submit:
    they raise Backlogged, which their states Retry (next test) instead of failing."""
    from lambdas.core.tasks import tasks
    from skyfn.protocol.api import SubmitTasks, TaskRequest

    _, fid, ep = bounded
    fill_outbox(r, BOUND + 1)
    req = SubmitTasks(endpoint_id=ep, tasks=[TaskRequest(function_id=fid, payload=pack_args((1,), {}))])
    with pytest.raises(Backlogged) as info:
        tasks.submit("alice", req)
    assert type(info.value).__name__ == "Backlogged" and info.value.retry_after == 1  # the name Step Functions sees
    assert task_keys(r) == []


def test_the_states_that_submit_retry_backlogged():
    from skyfn.protocol.flowspec import FlowSpec, compile_json
    from stepfunctions.render import load

    def retries(state: dict) -> list[dict]:
        return [rule for rule in state["Retry"] if rule["ErrorEquals"] == ["Backlogged"]]

    fanout = json.loads(load("batch-fanout"))
    [rule] = retries(fanout["States"]["RouteChunks"]["ItemProcessor"]["States"]["RouteChunk"])
    assert rule["MaxAttempts"] * rule["MaxDelaySeconds"] / 2 >= 3600  # full jitter: about an hour on average
    spmd = json.loads(load("spmd-group"))
    assert retries(spmd["States"]["Ranks"]["ItemProcessor"]["States"]["SubmitRank"]) == [rule]
    flow = FlowSpec.model_validate({"name": "f", "root": {"type": "step", "name": "s", "function_id": "f1",
                                                          "endpoint_id": "e1"}})
    states = json.loads(compile_json(flow, "alice", "arn:aws:lambda:us-east-1:0:function:run"))["States"]
    assert retries(states["s"]) == [rule] and retries(states["s/wait"]) == []  # only the submit state


# --- the memory bound -----------------------------------------------------------------
def test_over_the_memory_fraction_submissions_get_429_backlog(bounded, r):
    api, fid, ep = bounded
    used = int(r.info("memory")["used_memory"])
    r.config_set("maxmemory", int(used / 0.85))  # 85 % used, over the default 80 %
    backlog.reset()
    status, body, headers = call(api, "POST", "/tasks", submission(fid, ep, "m1"))
    assert status == 429 and body["error"] == "backlog", body
    assert "SKYFN_BACKLOG_MEMORY_FRACTION" in body["message"] and "of its" in body["message"]
    assert headers["Retry-After"] in ("2", "3")  # 0.85 / 0.8: about 6 % over
    assert task_keys(r) == [] and list(r.scan_iter("idem:*")) == []

    r.config_set("maxmemory", used * 4)
    backlog.reset()
    status, body, _ = call(api, "POST", "/tasks", submission(fid, ep, "m1"))
    assert status == 202, body


def test_a_full_store_answers_429_backlog_not_500(bounded, r):
    """maxmemory reached between two readings of the gauge: Redis refuses the write (noeviction)."""
    api, fid, ep = bounded
    r.config_set("maxmemory", 1)  # every write refused; the gauge has not seen it yet
    status, body, headers = call(api, "POST", "/tasks", submission(fid, ep, "full"))
    r.config_set("maxmemory", 0)
    assert status == 429 and body["error"] == "backlog" and headers["Retry-After"] == "5", body
    assert "maxmemory" in body["message"]


def test_at_maxmemory_accepted_work_still_ends_is_read_and_archived(bounded, r):
    """Past maxmemory only new work is refused: tasks already taken finish, their results
    are read and the drain archives them and sets their expiry, which frees the memory."""
    from lambdas import history
    from skyfn.protocol.ids import uuid7s

    store = deps.store()
    ids = uuid7s(20)
    now = time.time()
    store.create("alice", "sub", [[t, "fn", "ep1", 0] for t in ids], now, now)
    r.config_set("maxmemory", 1)
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            store.create("alice", "sub-2", [[t, "fn", "ep1", 0] for t in uuid7s(2)], now, now)
        store.progress([[t, "RUNNING", now, 60] for t in ids])
        assert store.finish([[t, "SUCCEEDED", "json 3.11\n1", None, None, ""] for t in ids])[0] == 20
        assert {row.state for row in store.status("alice", ids).values()} == {"SUCCEEDED"}
        assert history.flush()["tasks"] == 20
    finally:
        r.config_set("maxmemory", 0)
    assert all(0 < r.ttl(f"t:{t}") <= 600 for t in ids)


def test_the_hot_store_runs_with_noeviction(r):
    assert r.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"


# --- the SDK waits and retries ---------------------------------------------------------
@pytest.fixture
def gateway(bounded):
    """The API behind the embedded gateway (real HTTP), counting the statuses it answered."""
    from infra.local.standins.gateway import Gateway
    from lambdas.api import handler

    statuses: list[int] = []

    def counted(event, context):
        resp = handler(event, context)
        statuses.append(resp["statusCode"])
        return resp

    with Gateway(counted, concurrency=1) as gw:
        yield gw, statuses


def _drain_later(r, seconds: float) -> threading.Thread:
    def drain():
        time.sleep(seconds)
        r.ltrim("outbox", 0, BOUND // 2)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("retry_seconds,backlog_s", [(60.0, 1.5), (0.5, 3.0)])
def test_the_sdk_retries_a_backlog_429_until_it_is_taken(bounded, gateway, r, retry_seconds, backlog_s):
    """Retry-After is honoured, and a backlog outlasting retry_seconds (which bounds outages)
    is still waited out: each backlog answer renews it, up to backlog_seconds."""
    from skyfn import Client

    api, fid, ep = bounded
    gw, statuses = gateway
    fill_outbox(r, BOUND + 1)
    drained = _drain_later(r, backlog_s)
    client = Client(gw.url, api.token, retry_seconds=retry_seconds)
    try:
        t0 = time.monotonic()
        ids = client.submit_tasks([{"function_id": fid, "payload": pack_args((1,), {})}] * 4, ep)
        took = time.monotonic() - t0
    finally:
        client.close()
    drained.join()
    assert len(ids) == 4 and len(task_keys(r)) == 4  # taken once, after the refusals
    assert statuses.count(429) >= 1 and statuses[-1] == 202, statuses
    assert took >= 1.0  # it honoured Retry-After (1 s) between attempts


def test_the_executor_keeps_its_futures_through_a_backlog(bounded, gateway, r):
    from skyfn import Client, Executor

    api, fid, ep = bounded
    gw, statuses = gateway
    fill_outbox(r, BOUND + 1)
    drained = _drain_later(r, 1.5)
    client = Client(gw.url, api.token)
    ex = Executor(endpoint_id=ep, client=client, push=False, data_store=None)
    try:
        futures = [ex.submit(fid, i) for i in range(3)]
        deadline = time.monotonic() + 20
        while any(f.task_id is None for f in futures) and time.monotonic() < deadline:
            assert not any(f.done() for f in futures), [f.exception() for f in futures if f.done()]
            time.sleep(0.05)
        assert all(f.task_id for f in futures)
        assert statuses.count(429) >= 1 and 202 in statuses
        assert sorted(k.decode()[2:] for k in task_keys(r)) == sorted(f.task_id for f in futures)
    finally:
        ex.shutdown(wait=False, cancel_futures=True)
        client.close()
        drained.join()


# --- settings and the embedded runtime --------------------------------------------------
@pytest.mark.parametrize("name,value,message", [
    ("SKYFN_BACKLOG_MAX", "lots", "SKYFN_BACKLOG_MAX='lots' is not a number"),
    ("SKYFN_BACKLOG_MAX", "0", "SKYFN_BACKLOG_MAX='0' must be a whole number >= 1"),
    ("SKYFN_BACKLOG_MAX", "2.5", "SKYFN_BACKLOG_MAX='2.5' must be a whole number >= 1"),
    ("SKYFN_BACKLOG_MAX", "inf", "SKYFN_BACKLOG_MAX='inf' must be a whole number >= 1"),
    ("SKYFN_BACKLOG_MEMORY_FRACTION", "0", "SKYFN_BACKLOG_MEMORY_FRACTION=0.0 must be a fraction in (0, 1]"),
    ("SKYFN_BACKLOG_MEMORY_FRACTION", "1.5", "must be a fraction in (0, 1]"),
    ("SKYFN_BACKLOG_MEMORY_FRACTION", "nan", "must be a fraction in (0, 1]"),
])
def test_bad_backlog_settings_name_the_variable(monkeypatch, name, value, message):
    from lambdas.config import settings

    monkeypatch.setenv(name, value)
    settings.cache_clear()
    try:
        with pytest.raises(RuntimeError) as info:
            settings()
        assert message in str(info.value)
    finally:
        settings.cache_clear()


def test_backlog_settings_defaults_and_values(monkeypatch):
    from lambdas.config import settings

    monkeypatch.delenv("SKYFN_BACKLOG_MAX", raising=False)
    monkeypatch.delenv("SKYFN_BACKLOG_MEMORY_FRACTION", raising=False)
    settings.cache_clear()
    try:
        assert (settings().backlog_max, settings().backlog_memory_fraction) == (1_000_000, 0.8)
        monkeypatch.setenv("SKYFN_BACKLOG_MAX", "2_000_000")
        monkeypatch.setenv("SKYFN_BACKLOG_MEMORY_FRACTION", "0.9")
        settings.cache_clear()
        assert (settings().backlog_max, settings().backlog_memory_fraction) == (2_000_000, 0.9)
    finally:
        settings.cache_clear()


def test_publish_emits_the_three_metrics_and_warns_over_the_bound(bounded, capsys, caplog):
    backlog.publish(backlog.Backlog(outbox=BOUND + 1, used_bytes=2048, max_bytes=0, task_records=4,
                                    bytes_per_task=512.0))
    out = capsys.readouterr()
    lines = [json.loads(line) for line in (out.out + out.err).splitlines() if line.startswith("{")]
    [emf] = [line for line in lines if "_aws" in line]
    [directive] = emf["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "skyfn" and directive["Dimensions"] == [["service"]]
    assert emf["service"] == "history"
    assert {m["Name"] for m in directive["Metrics"]} == {"OutboxLength", "RedisUsedBytes", "RedisBytesPerTask"}
    assert emf["OutboxLength"] == [BOUND + 1.0] and emf["RedisBytesPerTask"] == [512.0]
    assert any("backpressure" in rec.getMessage() and "SKYFN_BACKLOG_MAX" in rec.getMessage()
               for rec in caplog.records if rec.levelname == "WARNING")


def test_local_status_shows_the_backlog_and_warns_from_half_the_bound(bounded, r, redis_url):
    from infra.local.runtime import backlog_report

    report = backlog_report(redis_url)
    assert report["warning"] is None and report["backlog_max"] == BOUND and report["task_records"] >= 1
    fill_outbox(r, BOUND // 2 + 10)
    report = backlog_report(redis_url)
    assert report["outbox"] == BOUND // 2 + 10 and report["pressure"] == 0.6
    assert "at 60% of its bound" in report["warning"] and "429 backlog" in report["warning"]
    fill_outbox(r, BOUND)
    assert "submissions get 429 backlog until" in backlog_report(redis_url)["warning"]


def test_the_embedded_redis_maxmemory_option(tmp_path, monkeypatch):
    from infra.local.processes import redis_maxmemory, start_redis

    monkeypatch.delenv("SKYFN_REDIS_MAXMEMORY", raising=False)
    assert redis_maxmemory() is None
    monkeypatch.setenv("SKYFN_REDIS_MAXMEMORY", "64MB")
    assert redis_maxmemory() == "64mb"
    assert redis_maxmemory("0") is None
    with pytest.raises(ValueError, match="SKYFN_REDIS_MAXMEMORY='lots' is not a memory size"):
        redis_maxmemory("lots")
    server = start_redis(tmp_path / "redis", appendonly=False, maxmemory=redis_maxmemory())
    try:
        client = redis.Redis.from_url(server.url)
        assert client.config_get("maxmemory")["maxmemory"] == str(64 << 20)
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        client.close()
    finally:
        server.stop()
