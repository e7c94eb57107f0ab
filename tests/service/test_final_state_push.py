"""Final states reached other than by a result are pushed like results (issue 13), through
the real handlers on a real redis-server and moto: the cancel route, the reaper (expired
leases past their budget, dead letters), tasks failed at submission (a group policy that
places them nowhere, a queue that refuses them). The embedded adapter is watched on Redis
pub/sub as the local gateway's hub watches it; the AWS adapter (connection table in
DynamoDB, PostToConnection) runs against moto's DynamoDB and API Gateway Management API."""
from __future__ import annotations

import json
import time

import orjson
import pytest

from skyfn.protocol import pack_args, serialize_function
from skyfn.protocol.messages import ResultPack, TaskUpdate
from skyfn.protocol.push import CHANNEL_PREFIX


def inc(x):
    return x + 1


class Pushes:
    """What is published on an owner's push channel (the embedded runtime's adapter)."""

    def __init__(self, redis_url: str, owner: str):
        import redis

        self.client = redis.Redis.from_url(redis_url)
        self.sub = self.client.pubsub(ignore_subscribe_messages=True)
        self.sub.subscribe(CHANNEL_PREFIX + owner)
        self.sub.get_message(timeout=1.0)  # subscribed from here on

    def take(self, n: int, timeout: float = 5.0) -> list[dict]:
        out, deadline = [], time.monotonic() + timeout
        while len(out) < n and time.monotonic() < deadline:
            msg = self.sub.get_message(timeout=0.1)
            if msg and msg["type"] == "message":
                out.append(orjson.loads(msg["data"]))
        return out

    def close(self) -> None:
        self.sub.close()
        self.client.close()


@pytest.fixture
def owner(api):
    return "alice"


@pytest.fixture
def pushes(redis_url, api, owner, monkeypatch):
    monkeypatch.setenv("SKYFN_PUSH", "redis")
    p = Pushes(redis_url, owner)
    yield p
    p.close()


@pytest.fixture
def submitted(api):
    _, f = api.call("POST", "/functions", {"function": serialize_function(inc)})
    _, e = api.call("POST", "/endpoints", {"name": "hpc"})
    _, s = api.call("POST", "/tasks", {"endpoint_id": e["endpoint_id"], "max_retries": 0,
                                       "tasks": [{"function_id": f["function_id"], "payload": pack_args((i,), {})}
                                                 for i in range(4)]})
    return e["endpoint_id"], s["task_ids"], f["function_id"]


def _cursor(owner: str) -> str:
    from lambdas.core import deps

    return deps.store().done_cursor(owner)


def test_cancel_route_pushes_the_cancelled_task_once(api, pushes, submitted, owner):
    _, ids, _ = submitted
    before = _cursor(owner)
    assert api.call("DELETE", f"/tasks/{ids[0]}")[0] == 200
    (msg,) = pushes.take(1)
    assert msg == {"type": "done", "prev": before, "cursor": _cursor(owner), "ids": [ids[0]],
                   "tasks": [{"task_id": ids[0], "state": "CANCELLED", "reason": "cancelled by its owner"}]}
    assert api.call("DELETE", f"/tasks/{ids[0]}")[0] == 200  # retried: succeeds, pushes nothing
    assert pushes.take(1, timeout=0.5) == []
    # the next push chains on the cancel's entry: a client that followed it sees no gap
    assert api.call("DELETE", f"/tasks/{ids[1]}")[0] == 200
    (nxt,) = pushes.take(1)
    assert nxt["prev"] == msg["cursor"]


def test_reaper_pushes_expired_leases_and_dead_letters(api, pushes, submitted, owner):
    from lambdas.core import deps
    from lambdas.reaper import reap
    from lambdas.results import apply_pack

    ep, ids, fid = submitted
    apply_pack(ResultPack(endpoint_id=ep, updates=[TaskUpdate(task_id=ids[0], state="RUNNING", ts=time.time(),
                                                              lease_seconds=0.01)]))
    time.sleep(0.05)
    before = _cursor(owner)
    assert reap()["lease_failed"] == 1
    (msg,) = pushes.take(1)
    assert (msg["prev"], msg["ids"]) == (before, [ids[0]])
    (st,) = msg["tasks"]
    assert st["state"] == "FAILED" and "retry budget max_retries=0 exhausted" in st["reason"]
    assert st["reason"] == api.call("GET", f"/tasks/{ids[0]}")[1]["reason"]

    # the pack of all four is dead-lettered: the three still open are failed and pushed in one message
    queue, _ = deps.task_queue(ep)
    queue.visibility_timeout = 0.05
    for _ in range(queue.max_deliveries + 1):
        queue.receive(10, 0, visibility_timeout=0.05)
        time.sleep(0.1)
    assert reap()["dead_lettered"] == 3
    (dead,) = pushes.take(1)
    assert dead["prev"] == msg["cursor"] and sorted(dead["ids"]) == sorted(ids[1:])
    assert {t["task_id"] for t in dead["tasks"]} == set(ids[1:])
    assert all(t["state"] == "FAILED" and t["reason"].startswith("dead-lettered after") for t in dead["tasks"])
    assert reap()["dead_lettered"] == 0 and pushes.take(1, timeout=0.5) == []


def test_tasks_failed_at_submission_are_pushed(api, pushes, owner, monkeypatch):
    from lambdas.core import deps

    _, fussy = api.call("POST", "/functions", {"function": serialize_function(inc), "name": "fussy", "tag": "fussy"})
    eps = [api.call("POST", "/endpoints", {"name": n})[1]["endpoint_id"] for n in ("alpha", "beta")]
    _, g = api.call("POST", "/endpoint-groups", {
        "name": "sites", "members": [{"endpoint_id": e} for e in eps],
        "policy": "fussy:\n  - workers: [alpha]\n    affinity: partner\n  - followup: fail\n"})
    status, body = api.call("POST", "/tasks", {"group_id": g["group_id"], "tasks": [
        {"function_id": fussy["function_id"], "payload": pack_args((1,), {})}]})
    assert status == 202
    (msg,) = pushes.take(1)
    assert msg["ids"] == body["task_ids"] and msg["tasks"][0]["state"] == "FAILED"
    assert "(followup: fail)" in msg["tasks"][0]["reason"]

    # a queue that refuses a submission without an idempotency key: its tasks are failed and pushed
    queue, _ = deps.task_queue(eps[0])

    def refuse(_packs):
        raise ConnectionError("queue unreachable")

    monkeypatch.setattr(queue, "send", refuse)
    _, plain = api.call("POST", "/functions", {"function": serialize_function(inc)})
    status, _ = api.call("POST", "/tasks", {"endpoint_id": eps[0], "tasks": [
        {"function_id": plain["function_id"], "payload": pack_args((i,), {})} for i in range(3)]})
    assert status == 503
    (failed,) = pushes.take(1)
    assert failed["prev"] == msg["cursor"] and len(failed["ids"]) == 3
    assert all(t["state"] == "FAILED" and t["reason"].startswith("could not be queued") for t in failed["tasks"])


# -- AWS: the connection table and PostToConnection (moto, in process) --------------------------

@pytest.fixture
def apigw(redis_url, monkeypatch):
    """SKYFN_PUSH=apigw against moto's DynamoDB (the connection table) and API Gateway
    Management API; the store on the real redis-server."""
    import boto3
    from moto import mock_aws

    from lambdas.core import deps
    from lambdas.core.tasks import push

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("SKYFN_REDIS_URL", redis_url)
    monkeypatch.setenv("SKYFN_QUEUE_KIND", "sqs")
    monkeypatch.setenv("SKYFN_PUSH", "apigw")
    monkeypatch.setenv("SKYFN_CONNECTION_TABLE", "skyfn-test-connections")
    monkeypatch.setenv("SKYFN_WS_ENDPOINT", "https://abc123.execute-api.us-east-1.amazonaws.com/ci")
    deps.reset()
    push._table.cache_clear()
    push._management.cache_clear()
    with mock_aws():
        boto3.client("dynamodb").create_table(
            TableName="skyfn-test-connections", BillingMode="PAY_PER_REQUEST",
            KeySchema=[{"AttributeName": "owner", "KeyType": "HASH"},
                       {"AttributeName": "connection_id", "KeyType": "RANGE"}],
            AttributeDefinitions=[{"AttributeName": "owner", "AttributeType": "S"},
                                  {"AttributeName": "connection_id", "AttributeType": "S"}])
        yield deps.store()
    push._table.cache_clear()
    push._management.cache_clear()
    deps.reset()


def _posted(connection_id: str) -> list[dict]:
    """The messages moto's API Gateway Management API received for a connection, in order
    (it keeps their bytes concatenated)."""
    from moto.apigatewaymanagementapi.models import apigatewaymanagementapi_backends
    from moto.core import DEFAULT_ACCOUNT_ID

    data = apigatewaymanagementapi_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].connections[connection_id].data.decode()
    decoder, out, pos = json.JSONDecoder(), [], 0
    while pos < len(data):
        msg, pos = decoder.raw_decode(data, pos)
        out.append(msg)
    return out


def test_apigw_posts_cancels_and_reaper_failures_to_subscribed_connections(apigw):
    from lambdas.core.tasks import push

    store = apigw
    push.remember("alice", "conn-a", subscribed=True)
    push.remember("alice", "conn-idle", subscribed=False)  # connected, never subscribed: nothing for it
    now = time.time()
    ids = [f"task-{i}" for i in range(3)]
    store.create("alice", "sub", [[tid, "fn", "ep1", 0] for tid in ids], now, now)

    assert push.notify(store.cancel("alice", ids[0])[2]) == 1
    store.progress([[ids[1], "RUNNING", now, -10]])
    assert push.notify(store.expire_leases()[2]) == 1
    assert push.notify(store.fail_unqueued(ids, "dead-lettered after 5 deliveries")) == 1  # only ids[2] is open
    assert push.notify(store.cancel("alice", ids[0])[2]) == 0  # a retried cancel: nothing to post

    cancel, lease, dead = _posted("conn-a")
    assert cancel["prev"] == "0-0" and lease["prev"] == cancel["cursor"] and dead["prev"] == lease["cursor"]
    assert cancel["tasks"] == [{"task_id": ids[0], "state": "CANCELLED", "reason": "cancelled by its owner"}]
    assert lease["ids"] == [ids[1]] and "max_retries=0 exhausted" in lease["tasks"][0]["reason"]
    assert dead["tasks"] == [{"task_id": ids[2], "state": "FAILED", "reason": "dead-lettered after 5 deliveries"}]
    assert dead["cursor"] == store.done_cursor("alice")
    assert _posted("conn-idle") == []
    # statuses handed over in a push count as retrieved, as pushed results do
    assert all(store.record(tid).get("rt") for tid in ids)


def _subscribe(connection_id: str, message: dict) -> dict:
    """The subscribe route of lambdas/ws.py as API Gateway invokes it; its answer."""
    from lambdas import ws

    out = ws.handler({"requestContext": {"routeKey": "subscribe", "connectionId": connection_id,
                                         "authorizer": {"sub": "alice"}},
                      "body": json.dumps(message)}, None)
    assert out["statusCode"] == 200
    return json.loads(out["body"])


def test_apigw_peek_connections_get_the_pushes_without_consuming_results(apigw):
    """A connection subscribed with peek (the status page, `skyfn task watch`) receives every
    push, but only a delivery to a connection without peek marks the results retrieved."""
    from lambdas.core.tasks import push

    store = apigw
    push.remember("alice", "conn-watch")  # $connect, then subscribe with peek
    assert _subscribe("conn-watch", {"action": "subscribe", "peek": True})["type"] == "subscribed"
    refused = _subscribe("conn-bad", {"action": "subscribe", "peek": "yes"})
    assert refused == {"type": "error", "message": '"peek" must be true or false'}
    assert push.connections("alice") == [("conn-watch", True)]

    now = time.time()
    ids = [f"task-{i}" for i in range(2)]
    store.create("alice", "sub", [[tid, "fn", "ep1", 0] for tid in ids], now, now)
    _, _, _, notices = store.finish([[ids[0], "SUCCEEDED", "json 3.11\n1", None, None, ""]])
    assert push.notify(notices) == 1
    (msg,) = _posted("conn-watch")
    assert msg["tasks"] == [{"task_id": ids[0], "state": "SUCCEEDED", "result": "json 3.11\n1"}]
    assert "rt" not in store.record(ids[0])

    # the SDK's connection (no peek) joins: the next push is handed over, the first stays unread
    assert _subscribe("conn-sdk", {"action": "subscribe"})["type"] == "subscribed"
    _, _, _, notices = store.finish([[ids[1], "SUCCEEDED", "json 3.11\n2", None, None, ""]])
    before = time.time()
    assert push.notify(notices) == 2
    assert [m["ids"] for m in _posted("conn-watch")] == [[ids[0]], [ids[1]]]
    assert _posted("conn-sdk")[0]["tasks"][0]["result"] == "json 3.11\n2"
    rt = float(store.record(ids[1])["rt"])
    assert rt >= before and "rt" not in store.record(ids[0])
    store.mark_archived(ids)  # once archived, the read one expires result_ttl after its read, the other later
    assert store.r.pexpiretime(f"t:{ids[1]}") / 1000 == pytest.approx(rt + store.result_ttl, abs=0.01)
    assert store.r.pexpiretime(f"t:{ids[0]}") / 1000 == pytest.approx(time.time() + store.unretrieved_ttl, abs=5)
