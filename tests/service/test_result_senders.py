"""Results count only from the endpoint (or lane) a task was sent to, written from the
attacker's side on a real redis-server: mallory registers an endpoint of her own (X) and,
with nothing but the credential and queue login that gives her, adds result packs to the
shared results stream about alice's tasks on alice's endpoint Y -- a result carrying a
pickle, a FAILED, a RUNNING update, a hand-back of a parked dependent and a direct-session
record -- with `endpoint_id` naming Y, naming "", unsealed, and sealed under a key that is
not Y's. The service's reader feeds the stream to the results function as the embedded
runtime does. Every one is refused, Y's tasks are as they were; Y's own agent's results
then land (not dropped as duplicates), the memo cache holds the genuine value, and the
SDK never unpickles a value produced elsewhere.

On a multi-user endpoint: a lane login's unsealed pack, a pack sealed by another lane, and a
valid seal of bob's lane naming alice's task are refused; alice's lane's result lands.
"""
from __future__ import annotations

import base64
import json
import pickle
import time
import uuid

import pytest

from lambdas.core import deps
from skyfn.client import task_outcome
from skyfn.protocol import pack_args, serialize_function
from skyfn.protocol.dataflow import PARK_FEATURE, Input
from skyfn.protocol.lanes import seal as lane_seal
from skyfn.protocol.messages import ResultPack, TaskResult, TaskUpdate
from skyfn.protocol.queues import open_queue
from skyfn.protocol.result_seal import key_of_credential, seal
from skyfn.protocol.serialize import serialize
from tests.service.conftest import SECRET, Api, Context, mint_token
from tests.service.test_lanes import LANE, bind, site, submit  # noqa: F401 - site: the fixture
from tests.service.test_sessions import channel
from lambdas.adapters.redis_store.connection import redis_client


def square(x):
    return x * x


class Boom:
    """Unpickling it creates the file `path`: the attacker's code, run by whoever unpickles."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def pickled(obj) -> str:
    return f"pickle 3.11\n{base64.b64encode(pickle.dumps(obj)).decode()}"


def drain() -> int:
    """The service's reader of the results stream (consumer group of the embedded runtime's
    event source): every entry waiting goes to the results function in SQS-shaped batches.
    Returns how many entries it handed over."""
    from lambdas.config import settings
    from lambdas.results import handler

    reader = open_queue({"kind": "redis", "name": "results", "url": settings().redis_url}, consumer="gateway",
                        visibility_timeout=30)
    reader.ensure()
    n = 0
    while True:
        messages = reader.receive(max_messages=50, wait_seconds=0)
        if not messages:
            reader.close()
            return n
        event = {"Records": [{"messageId": m.message_id, "receiptHandle": m.receipt, "body": m.body.decode(),
                              "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {},
                              "md5OfBody": "", "eventSource": "aws:sqs", "awsRegion": "us-east-1",
                              "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:results"} for m in messages]}
        assert handler(event, Context()) == {"batchItemFailures": []}
        reader.delete([m.receipt for m in messages])
        n += len(messages)


def record(tid: str) -> dict:
    return {k.decode(): v.decode() for k, v in redis_client().hgetall(f"t:{tid}").items()}


def status(api, *ids: str) -> dict:
    code, body = api.call("POST", "/tasks/status", {"task_ids": list(ids), "peek": True})
    assert code == 200, body
    return body["tasks"]


@pytest.fixture
def victim(api, tmp_path):
    """alice's endpoint Y with its agent (park feature, a published direct channel), her tasks
    on it -- one memoized, one parked dependent -- taken from Y's queue by Y's agent, one of
    them RUNNING, and a direct session the service granted her with Y."""
    _, fn = api.call("POST", "/functions", {"function": serialize_function(square), "name": "square"})
    fid = fn["function_id"]
    _, y = api.call("POST", "/endpoints", {"name": "alice-site"})
    agent = Api(y["agent_credential"])
    code, _ = agent.call("POST", f"/endpoints/{y['endpoint_id']}/heartbeat",
                         {"stats": {}, "features": [PARK_FEATURE], "direct": channel()})
    assert code == 200
    code, sub = api.call("POST", "/tasks", {"endpoint_id": y["endpoint_id"], "tasks": [
        {"function_id": fid, "payload": pack_args((i,), {})} for i in (2, 3, 4, 5)]})
    assert code == 202, sub
    plain, failing, running, source = sub["task_ids"]
    code, memo = api.call("POST", "/tasks", {"endpoint_id": y["endpoint_id"], "memoize": True, "tasks": [
        {"function_id": fid, "payload": pack_args((7,), {})}]})
    assert code == 202, memo
    code, dep = api.call("POST", "/tasks", {"endpoint_id": y["endpoint_id"], "tasks": [
        {"function_id": fid, "payload": pack_args((Input(0),), {}), "inputs": [source]}]})
    assert code == 202, dep
    parked = dep["task_ids"][0]
    queue = open_queue(y["task_queue"], consumer="agent-y", visibility_timeout=60)
    taken = [t["task_id"] for m in queue.receive(max_messages=10, wait_seconds=1)
             for t in json.loads(m.body)["tasks"]]
    assert set(taken) >= {plain, failing, running, source, memo["task_ids"][0]}
    ykey = key_of_credential(y["agent_credential"])
    open_queue(y["results_queue"], consumer="agent-y").send([seal(y["endpoint_id"], ykey, ResultPack(
        endpoint_id=y["endpoint_id"], updates=[TaskUpdate(task_id=running, state="DISPATCHED", ts=time.time())])
        .model_dump_json().encode())])
    drain()
    code, session = api.call("POST", f"/endpoints/{y['endpoint_id']}/sessions", {"function_ids": [fid]})
    assert code == 201, session
    return {"y": y, "ykey": ykey, "fid": fid, "plain": plain, "failing": failing, "running": running,
            "memo": memo["task_ids"][0], "parked": parked, "session": session["session_id"],
            "direct": str(uuid.uuid4()), "marker": tmp_path / "attacker-code-ran"}


def forged_pack(v: dict, endpoint_id: str) -> ResultPack:
    """Everything mallory would like to say about alice's tasks."""
    now = time.time()
    return ResultPack(endpoint_id=endpoint_id, results=[
        TaskResult(task_id=v["plain"], state="SUCCEEDED", result=pickled(Boom(str(v["marker"])))),
        TaskResult(task_id=v["memo"], state="SUCCEEDED", result=serialize(666)),
        TaskResult(task_id=v["failing"], state="FAILED", reason="forged failure"),
        TaskResult(task_id=v["direct"], state="SUCCEEDED", result=serialize(666), session=v["session"],
                   function_id=v["fid"], events=[("DISPATCHED", now), ("RUNNING", now), ("DONE", now)])],
        updates=[TaskUpdate(task_id=v["running"], state="RUNNING", ts=now),
                 TaskUpdate(task_id=v["parked"], state="UNPARK", ts=now)])


def test_another_endpoints_agent_cannot_touch_alices_tasks(api, other_api, victim):
    v, y = victim, victim["y"]
    ep_y = y["endpoint_id"]
    before = {t: record(t) for t in (v["plain"], v["memo"], v["failing"], v["running"], v["parked"])}
    assert before[v["running"]]["s"] == "DISPATCHED" and before[v["parked"]]["pk"] == "1"
    _, x = other_api.call("POST", "/endpoints", {"name": "mallory-site"})  # mallory's own endpoint
    xkey = key_of_credential(x["agent_credential"])
    stream = open_queue(x["results_queue"], consumer="mallory")  # her own login: XADD to results
    bodies = [
        seal(x["endpoint_id"], xkey, forged_pack(v, ep_y).model_dump_json().encode()),   # names Y, sealed as X
        seal(x["endpoint_id"], xkey, forged_pack(v, "").model_dump_json().encode()),     # names "", sealed as X
        forged_pack(v, ep_y).model_dump_json().encode(),                                  # unsealed, names Y
        forged_pack(v, "").model_dump_json().encode(),                                    # unsealed, names ""
        seal(ep_y, xkey, forged_pack(v, ep_y).model_dump_json().encode()),               # Y's header, X's key
        seal(ep_y, "ab" * 32, forged_pack(v, ep_y).model_dump_json().encode()),          # Y's header, a guess
    ]
    stream.send(bodies)
    assert drain() == len(bodies)
    for tid, rec in before.items():  # alice's tasks are exactly as they were
        assert record(tid) == rec, tid
    assert not redis_client().exists(f"t:{v['direct']}")  # no direct task recorded in her name
    memo = before[v["memo"]]
    assert deps.store().memo_lookup(memo["o"], [memo["mk"]]) == [None]  # nothing cached from the forgery
    assert not v["marker"].exists()

    # Y's own agent, with its own credential: its results land, none dropped as a duplicate
    now = time.time()
    genuine = ResultPack(endpoint_id=ep_y, results=[
        TaskResult(task_id=v["plain"], state="SUCCEEDED", result=serialize(4)),
        TaskResult(task_id=v["memo"], state="SUCCEEDED", result=serialize(49)),
        TaskResult(task_id=v["failing"], state="FAILED", reason="genuine failure"),
        TaskResult(task_id=v["direct"], state="SUCCEEDED", result=serialize(36), session=v["session"],
                   function_id=v["fid"], events=[("DISPATCHED", now), ("RUNNING", now), ("DONE", now)])],
        updates=[TaskUpdate(task_id=v["running"], state="RUNNING", ts=now)])
    open_queue(y["results_queue"], consumer="agent-y").send(
        [seal(ep_y, v["ykey"], genuine.model_dump_json().encode())])
    assert drain() == 1
    st = status(api, v["plain"], v["memo"], v["failing"], v["running"], v["direct"])
    assert st[v["plain"]]["state"] == "SUCCEEDED" and st[v["plain"]]["result_by"] == ep_y
    assert [task_outcome(t, st[t]) for t in (v["plain"], v["memo"], v["direct"])] == [(True, 4), (True, 49), (True, 36)]
    assert st[v["failing"]]["reason"] == "genuine failure" and st[v["running"]]["state"] == "RUNNING"
    assert record(v["parked"])["pk"] == "1"  # still parked at Y: nobody handed it back
    assert not v["marker"].exists()
    # the memo cache holds the genuine value: a later memoized call is answered with it
    code, again = api.call("POST", "/tasks", {"endpoint_id": ep_y, "memoize": True, "tasks": [
        {"function_id": v["fid"], "payload": pack_args((7,), {})}]})
    assert code == 202
    hit = status(api, again["task_ids"][0])[again["task_ids"][0]]
    assert task_outcome(again["task_ids"][0], hit) == (True, 49)
    assert deps.store().memo_lookup(memo["o"], [memo["mk"]]) == [serialize(49)]
    # and Y's agent hands its own parked task back, as ever
    open_queue(y["results_queue"], consumer="agent-y").send([seal(ep_y, v["ykey"], ResultPack(
        endpoint_id=ep_y, updates=[TaskUpdate(task_id=v["parked"], state="UNPARK", ts=time.time())])
        .model_dump_json().encode())])
    drain()
    assert "pk" not in record(v["parked"])


def test_the_sdk_never_decodes_a_result_produced_elsewhere(api, victim):
    """Were a forged value ever stored (a regression of the service's check), the victim's
    client refuses it unread: the record says which endpoint produced it."""
    v = victim
    r = redis_client()
    r.hset(f"t:{v['plain']}", mapping={"s": "SUCCEEDED", "res": pickled(Boom(str(v["marker"]))), "by": "mallory-ep"})
    r.hset(f"t:{v['failing']}", mapping={"s": "FAILED", "err": pickled(Boom(str(v["marker"]))), "by": ""})
    st = status(api, v["plain"], v["failing"])
    for tid in (v["plain"], v["failing"]):
        assert st[tid]["endpoint_id"] == v["y"]["endpoint_id"]
        ok, exc = task_outcome(tid, st[tid])
        assert not ok and "refused unread" in str(exc) and v["y"]["endpoint_id"] in str(exc)
    assert "produced by endpoint mallory-ep" in str(task_outcome(v["plain"], st[v["plain"]])[1])
    assert not v["marker"].exists()
    # the same status with the right producer is decoded: the buffer would have run
    r.hset(f"t:{v['plain']}", "by", v["y"]["endpoint_id"])
    task_outcome(v["plain"], status(api, v["plain"])[v["plain"]])
    assert v["marker"].exists()


def test_an_inline_result_above_the_cap_fails_its_task_naming_the_cap(api, victim):
    from skyfn.protocol.limits import MAX_INLINE_RESULT_BYTES

    v, ep_y = victim, victim["y"]["endpoint_id"]
    big = serialize("x" * (MAX_INLINE_RESULT_BYTES + 1))
    open_queue(v["y"]["results_queue"], consumer="agent-y").send([seal(ep_y, v["ykey"], ResultPack(
        endpoint_id=ep_y, results=[TaskResult(task_id=v["plain"], state="SUCCEEDED", result=big),
                                   TaskResult(task_id=v["memo"], state="SUCCEEDED", result=serialize(49))])
        .model_dump_json().encode())])
    assert drain() == 1
    st = status(api, v["plain"], v["memo"])
    assert st[v["plain"]]["state"] == "FAILED" and "result" not in st[v["plain"]]
    assert f"above the cap of {MAX_INLINE_RESULT_BYTES} bytes" in st[v["plain"]]["reason"]
    assert st[v["memo"]]["state"] == "SUCCEEDED"


def test_a_rotated_credential_seals_from_then_on_and_the_old_one_is_refused(api, victim):
    """The results function keeps Y's key (the fixture's pack sealed with it): a pack sealed
    with the rotated credential's key is checked again under a fresh read and applied at
    once; once the kept key has aged out (KEY_TTL), the old key is refused."""
    v, ep_y = victim, victim["y"]["endpoint_id"]
    from lambdas.core.identity import result_seals

    old_key = v["ykey"]
    _, again = api.call("POST", "/endpoints", {"name": "alice-site"})  # registering again rotates it
    new_key = key_of_credential(again["agent_credential"])
    assert again["results_key"] == new_key != old_key
    queue = open_queue({**v["y"]["results_queue"], "url": again["results_queue"]["url"]}, consumer="agent-y")
    queue.send([seal(ep_y, new_key, ResultPack(endpoint_id=ep_y, results=[
        TaskResult(task_id=v["plain"], state="SUCCEEDED", result=serialize(4))]).model_dump_json().encode())])
    assert drain() == 1 and record(v["plain"])["res"] == serialize(4)
    result_seals.keys.clear()  # as KEY_TTL later
    queue.send([seal(ep_y, old_key, ResultPack(endpoint_id=ep_y, results=[
        TaskResult(task_id=v["failing"], state="FAILED", reason="old key")]).model_dump_json().encode())])
    assert drain() == 1 and record(v["failing"])["s"] == "QUEUED"


# --- lanes of a multi-user endpoint -----------------------------------------------------------
BOB_LANE = "b0b0b0b0b0b0b0b0"
BOB_CONFIG = {"account": "bobproj", "cores": 1}


def lane_result(ep: str, tid: str, value: int) -> bytes:
    return ResultPack(endpoint_id=ep, results=[TaskResult(task_id=tid, state="SUCCEEDED", result=serialize(value))]
                      ).model_dump_json().encode()


def test_a_lane_answers_only_with_its_own_key_for_its_own_identities(api, site):  # noqa: F811 - the fixture
    ep = site["ep"]
    alices = bind(site)
    bob = Api(mint_token(SECRET, "bob"))
    bobs = bind(site, lane=BOB_LANE, identity="bob", user_config=BOB_CONFIG)
    [a1] = submit(api, site)
    [b1] = submit(bob, site, user_config=BOB_CONFIG)
    bob_stream = open_queue(bobs["results_queue"], consumer="bob-ua")  # bob's lane login
    bob_stream.send([
        lane_result(ep, a1, 666),                                               # unsealed, names the endpoint
        ResultPack(endpoint_id="", results=[TaskResult(task_id=a1, state="SUCCEEDED", result=serialize(666))])
        .model_dump_json().encode(),                                           # unsealed, names ""
        lane_seal(LANE, bobs["mac_key"], lane_result(ep, a1, 666)),           # alice's lane named, bob's key
        lane_seal(BOB_LANE, bobs["mac_key"], lane_result(ep, a1, 666)),       # bob's valid seal, alice's task
        seal(ep, bobs["mac_key"], lane_result(ep, a1, 666)),                  # as the endpoint, with a lane key
    ])
    assert drain() == 5
    assert record(a1)["s"] == "QUEUED" and "res" not in record(a1)
    # each lane's own results land
    open_queue(alices["results_queue"], consumer="alice-ua").send([lane_seal(LANE, alices["mac_key"],
                                                                             lane_result(ep, a1, 2))])
    bob_stream.send([lane_seal(BOB_LANE, bobs["mac_key"], lane_result(ep, b1, 3))])
    assert drain() == 2
    st_a, st_b = status(api, a1)[a1], status(bob, b1)[b1]
    assert task_outcome(a1, st_a) == (True, 2) and st_a["result_by"] == ep
    assert task_outcome(b1, st_b) == (True, 3)


def test_each_endpoint_has_its_own_results_key_from_its_own_credential(api, other_api):
    _, a = api.call("POST", "/endpoints", {"name": "one"})
    _, b = other_api.call("POST", "/endpoints", {"name": "two"})
    assert a["results_key"] == key_of_credential(a["agent_credential"]) != b["results_key"]


def test_on_sqs_queues_the_same_rule_holds(api, other_api, monkeypatch, unique):
    """The AWS shape: the shared SQS results queue, consumed as the results function's event
    source consumes it. Mallory's forged packs are refused, alice's agent's result lands."""
    from lambdas.config import settings
    from lambdas.results import handler

    monkeypatch.setenv("SKYFN_QUEUE_KIND", "sqs")
    monkeypatch.setenv("SKYFN_SQS_PREFIX", f"q{unique}")
    deps.reset()
    _, fn = api.call("POST", "/functions", {"function": serialize_function(square)})
    _, y = api.call("POST", "/endpoints", {"name": "alice-cloud"})
    _, x = other_api.call("POST", "/endpoints", {"name": "mallory-cloud"})
    assert y["results_queue"]["kind"] == "sqs" and y["results_key"] == key_of_credential(y["agent_credential"])
    _, sub = api.call("POST", "/tasks", {"endpoint_id": y["endpoint_id"], "tasks": [
        {"function_id": fn["function_id"], "payload": pack_args((3,), {})}]})
    [tid] = sub["task_ids"]
    ep_y, xkey = y["endpoint_id"], x["results_key"]

    def pack(named: str, value: int) -> bytes:
        return ResultPack(endpoint_id=named, results=[TaskResult(task_id=tid, state="SUCCEEDED",
                                                                 result=serialize(value))]).model_dump_json().encode()

    results = open_queue(y["results_queue"], consumer="agents")
    results.send([seal(x["endpoint_id"], xkey, pack(ep_y, 666)), seal(x["endpoint_id"], xkey, pack("", 666)),
                  pack(ep_y, 666), seal(ep_y, xkey, pack(ep_y, 666))])

    def consume() -> int:
        reader = open_queue({"kind": "sqs", "name": settings().results_queue_name, "url": y["results_queue"]["url"]},
                            consumer="lambda")
        n = 0
        while messages := reader.receive(max_messages=10, wait_seconds=0):
            event = {"Records": [{"messageId": m.message_id, "receiptHandle": m.receipt, "body": m.body.decode(),
                                  "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {},
                                  "md5OfBody": "", "eventSource": "aws:sqs", "awsRegion": "us-east-1",
                                  "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:results"} for m in messages]}
            assert handler(event, Context()) == {"batchItemFailures": []}
            reader.delete([m.receipt for m in messages])
            n += len(messages)
        return n

    assert consume() == 4
    assert record(tid)["s"] == "QUEUED" and "res" not in record(tid)
    results.send([seal(ep_y, y["results_key"], pack(ep_y, 9))])
    assert consume() == 1
    assert task_outcome(tid, status(api, tid)[tid]) == (True, 9)
