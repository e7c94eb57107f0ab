"""Lanes of a multi-user endpoint at the service (lambdas/core/identity/lanes.py), on a real
redis-server and moto: binding (POST /endpoints/<id>/lanes) with the endpoint's credential
only; the lane's queue login reaches its own queue and the results stream (write-only) and
nothing else, as Redis itself decides; submissions of a bound (identity, config key) go to
the lane, others to the endpoint's queue; sealed results are applied only with the lane's MAC
and only to tasks of identities bound to the lane; closing (or revoking the credential)
unbinds everything and ends the lane's login; the reaper fails a lane queue's dead letters;
on SQS task queues the service answers 409 lanes_unavailable.
"""
from __future__ import annotations

import json

import pytest
import redis

from lambdas.auth import mint_token
from skyfn.protocol import pack_args, serialize_function
from skyfn.protocol.lanes import lane_name, seal
from skyfn.protocol.messages import ResultPack, TaskResult
from skyfn.protocol.queues import open_queue
from skyfn.protocol.user_config import config_key
from tests.service.conftest import SECRET, Api, Context
from tests.service.sealing import sealed
from lambdas.adapters.redis_store.connection import redis_client

LANE = lane_name("alice-0123456789ab")
OTHER_LANE = lane_name("carol-0123456789ab")
ALICE_CONFIG = {"account": "proj1", "cores": 4}


def double(x):
    return 2 * x


@pytest.fixture
def site(api):
    """A multi-user endpoint of alice's, shared with bob, its agent's API client, and a function
    bob may run."""
    status, reg = api.call("POST", "/endpoints", {"name": "hpc", "metadata": {"multi_user": True}})
    assert status == 201 and reg["agent_credential"]
    ep = reg["endpoint_id"]
    _, fn = api.call("POST", "/functions", {"function": serialize_function(double)})
    for kind, obj in (("endpoints", ep), ("functions", fn["function_id"])):
        status, _ = api.call("POST", f"/shares/{kind}/{obj}", {"principal": "user:bob", "role": "run"})
        assert status == 200
    return {"ep": ep, "reg": reg, "agent": Api(reg["agent_credential"]), "fn": fn["function_id"]}


def bind(site, lane=LANE, identity="alice", user_config=ALICE_CONFIG):
    status, granted = site["agent"].call("POST", f"/endpoints/{site['ep']}/lanes",
                                         {"lane": lane, "identity_id": identity, "config_key": config_key(user_config)})
    assert status == 200, granted
    return granted


def submit(api, site, user_config=ALICE_CONFIG, n=1):
    body = {"endpoint_id": site["ep"], "tasks": [{"function_id": site["fn"], "payload": pack_args((i,), {})}
                                                 for i in range(n)]}
    if user_config is not None:
        body["user_config"] = user_config
    status, sub = api.call("POST", "/tasks", body)
    assert status == 202, sub
    return sub["task_ids"]


def queued(name: str) -> list[str]:
    """Task ids of the packs waiting in a stream (read as the service, nothing taken)."""
    from lambdas.core import deps

    return [t["task_id"] for _, fields in redis_client().xrange(name)
            for t in json.loads(fields[b"b"])["tasks"]]


def deliver(*bodies: bytes) -> dict:
    """The results handler, fed an SQS-shaped batch."""
    from lambdas.results import handler

    event = {"Records": [{"messageId": f"m{i}", "receiptHandle": f"r{i}", "body": b.decode(),
                          "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {}, "md5OfBody": "",
                          "eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:results",
                          "awsRegion": "us-east-1"} for i, b in enumerate(bodies)]}
    return handler(event, Context())


def result_pack(ep: str, *task_ids: str, value: int = 42) -> bytes:
    return ResultPack(endpoint_id=ep, results=[TaskResult(task_id=t, state="SUCCEEDED", result=f"json 3.11\n{value}")
                                               for t in task_ids]).model_dump_json().encode()


def task(api, tid):
    status, answer = api.call("POST", "/tasks/status", {"task_ids": [tid], "peek": True})
    assert status == 200, answer
    return answer["tasks"][tid]


# --- binding ------------------------------------------------------------------------------
def test_bind_answers_the_lane_queue_logins_and_is_idempotent(site):
    ep = site["ep"]
    granted = bind(site)
    assert granted["lane"] == LANE and granted["endpoint_id"] == ep and granted["identities"] == ["alice"]
    assert len(granted["mac_key"]) == 64 and int(granted["mac_key"], 16) >= 0
    task_q, results_q = granted["task_queue"], granted["results_queue"]
    assert task_q["kind"] == results_q["kind"] == "redis"
    assert task_q["name"] == f"tasks:{ep}:l:{LANE}" and results_q["name"] == "results"
    assert task_q["url"] == results_q["url"] and f"ln-{ep}-{LANE}:" in task_q["url"]
    # bound again (the endpoint restarted; another identity): the same login and key
    again = bind(site, identity="bob", user_config=None)
    assert again["task_queue"] == task_q and again["mac_key"] == granted["mac_key"]
    assert again["identities"] == ["alice", "bob"]
    from lambdas.core import deps

    r = redis_client()
    assert r.hgetall(f"lanes:{ep}") == {f"alice {config_key(ALICE_CONFIG)}".encode(): LANE.encode(),
                                        b"bob none": LANE.encode()}
    assert r.smembers(f"lane:{ep}:{LANE}:ids") == {b"alice", b"bob"}
    assert set(r.hgetall(f"lane:{ep}:{LANE}")) == {b"mac_key", b"password", b"created"}


def test_the_lane_login_reaches_its_own_queue_and_results_only(site, api):
    ep = site["ep"]
    granted = bind(site)
    other = bind(site, lane=OTHER_LANE, identity="carol")
    # the endpoint's own login hands the lane a pack (the first tasks of a new binding)
    as_endpoint = open_queue({**site["reg"]["task_queue"], "name": granted["task_queue"]["name"]}, consumer="router")
    as_endpoint.send([b'{"pack_id": "p1", "tasks": []}'])
    lane_q = open_queue(granted["task_queue"], consumer="user-agent", visibility_timeout=30)
    [msg] = lane_q.receive(max_messages=10)
    assert json.loads(msg.body)["pack_id"] == "p1"
    lane_q.delete([msg.receipt])
    assert lane_q.depth() == 0
    open_queue(granted["results_queue"], consumer="user-agent").send([b"{}"])  # write-only results
    [tid] = submit(api, site, user_config=None)
    r = redis.Redis.from_url(granted["task_queue"]["url"])
    assert r.ping()
    refused = [lambda: r.xrange(site["reg"]["task_queue"]["name"]),           # the endpoint's queue
               lambda: r.xadd(site["reg"]["task_queue"]["name"], {"b": "x"}),
               lambda: r.xrange(site["reg"]["control_queue"]["name"]),
               lambda: r.xrange(other["task_queue"]["name"]),                  # another lane's queue
               lambda: r.xadd(other["task_queue"]["name"], {"b": "x"}),
               lambda: r.xrange("results"),                                    # others' results
               lambda: r.hgetall(f"t:{tid}"),                                  # task records
               lambda: r.hgetall(f"lane:{ep}:{LANE}"),                         # its own secrets
               lambda: r.hgetall(f"lanes:{ep}"),
               lambda: r.keys("*"), lambda: r.scan(), lambda: r.execute_command("ACL", "LIST")]
    for call in refused:
        with pytest.raises(redis.exceptions.NoPermissionError):
            call()
    stolen = open_queue({**granted["task_queue"], "name": other["task_queue"]["name"]}, consumer="thief")
    with pytest.raises(redis.exceptions.NoPermissionError):
        stolen.receive(max_messages=10)


def test_only_the_endpoints_own_agent_binds_and_closes(site, api):
    ep, body = site["ep"], {"lane": LANE, "identity_id": "alice", "config_key": "none"}
    status, err = api.call("POST", f"/endpoints/{ep}/lanes", body)  # its owner's token
    assert status == 403 and err["error"] == "forbidden" and "endpoint credential" in err["message"]
    status, err = Api(mint_token(SECRET, "bob")).call("POST", f"/endpoints/{ep}/lanes", body)
    assert status == 403
    _, other = api.call("POST", "/endpoints", {"name": "other", "metadata": {"multi_user": True}})
    status, err = Api(other["agent_credential"]).call("POST", f"/endpoints/{ep}/lanes", body)
    assert status == 403 and err["error"] == "forbidden"
    bind(site)
    for caller in (api, Api(other["agent_credential"])):
        status, err = caller.call("DELETE", f"/endpoints/{ep}/lanes/{LANE}")
        assert status == 403, err
    from lambdas.core import deps

    assert redis_client().hget(f"lanes:{ep}", "alice none") is None
    assert redis_client().exists(f"lane:{ep}:{LANE}") == 1  # still open


def test_bad_bodies_and_ordinary_endpoints_are_refused(site, api):
    ep, agent = site["ep"], site["agent"]
    for bad in ({"lane": "NOT-A-LANE", "identity_id": "alice", "config_key": "none"},
                {"lane": LANE, "identity_id": "", "config_key": "none"},
                {"lane": LANE, "identity_id": "alice", "config_key": "proj1"},
                {"lane": LANE, "identity_id": "alice", "config_key": "none", "extra": 1},
                {"lane": LANE, "identity_id": 7, "config_key": "none"}):
        status, err = agent.call("POST", f"/endpoints/{ep}/lanes", bad)
        assert status == 422 and err["error"] == "invalid_request", (bad, err)
    status, err = agent.call("DELETE", f"/endpoints/{ep}/lanes/UPPER")
    assert status == 422
    status, err = agent.call("DELETE", f"/endpoints/{ep}/lanes/{LANE}")
    assert status == 404 and err["error"] == "not_found" and LANE in err["message"]
    _, plain = api.call("POST", "/endpoints", {"name": "plain"})
    body = {"lane": LANE, "identity_id": "alice", "config_key": "none"}
    status, err = Api(plain["agent_credential"]).call("POST", f"/endpoints/{plain['endpoint_id']}/lanes", body)
    assert status == 409 and err["error"] == "not_multi_user" and '"multi_user": true' in err["message"]


# --- dispatch -----------------------------------------------------------------------------
def test_a_bound_submitters_tasks_go_to_the_lane(site, api):
    ep = site["ep"]
    granted = bind(site)
    lane_queue, ep_queue = granted["task_queue"]["name"], site["reg"]["task_queue"]["name"]
    to_lane = submit(api, site, n=3)
    # the same user_config written in another key order is the same config key
    to_lane += submit(api, site, user_config={"cores": 4, "account": "proj1"})
    other_config = submit(api, site, user_config={"account": "proj2", "cores": 4})
    no_config = submit(api, site, user_config=None)
    bob = submit(Api(mint_token(SECRET, "bob")), site)  # another user, the same user_config
    assert sorted(queued(lane_queue)) == sorted(to_lane)
    assert sorted(queued(ep_queue)) == sorted(other_config + no_config + bob)
    # the pack in the lane is the pack the endpoint would have got
    from lambdas.core import deps

    _, fields = redis_client().xrange(lane_queue)[0]
    pack = json.loads(fields[b"b"])
    assert pack["endpoint_id"] == ep and pack["identity"]["id"] == "alice" and pack["user_config"] == ALICE_CONFIG
    assert {task(api, t)["state"] for t in to_lane} == {"QUEUED"}


def test_a_task_placed_through_an_endpoint_group_goes_to_the_lane(site, api):
    bind(site)
    status, group = api.call("POST", "/endpoint-groups", {"name": "sites", "members": [{"endpoint_id": site["ep"]}]})
    assert status == 201, group
    status, sub = api.call("POST", "/tasks", {"group_id": group["group_id"], "user_config": ALICE_CONFIG, "tasks": [
        {"function_id": site["fn"], "payload": pack_args((1,), {})}]})
    assert status == 202, sub
    assert queued(f"tasks:{site['ep']}:l:{LANE}") == sub["task_ids"]


# --- sealed results -------------------------------------------------------------------------
def test_sealed_results_apply_only_with_the_lanes_key_to_its_identities_tasks(site, api):
    ep = site["ep"]
    granted = bind(site)
    mac_key = granted["mac_key"]
    a1, a2, a3 = submit(api, site, n=3)
    bob = Api(mint_token(SECRET, "bob"))
    [b1] = submit(bob, site)  # bob is not bound to the lane
    # a sealed result of a bound identity's task, through the results stream as the lane sends it
    open_queue(granted["results_queue"], consumer="ua").send([seal(LANE, mac_key, result_pack(ep, a1, value=2))])
    from lambdas.core import deps

    [(_, fields)] = redis_client().xrange("results")
    assert deliver(fields[b"b"]) == {"batchItemFailures": []}
    assert task(api, a1)["state"] == "SUCCEEDED" and task(api, a1)["result"] == "json 3.11\n2"
    # a wrong MAC, another lane's key, an unknown lane, garbage: dropped, never retried
    wrong = "0" * 64
    forged = [seal(LANE, wrong, result_pack(ep, a2)),
              seal(OTHER_LANE, mac_key, result_pack(ep, a2)),
              seal(LANE, mac_key, result_pack(ep, a2))[:-2] + b"x}",
              json.dumps({"lane": LANE, "mac": "é" * 64, "pack": result_pack(ep, a2).decode()}).encode(),
              seal(LANE, mac_key, b'{"endpoint_id": "' + ep.encode() + b'", "results": "no"}')]
    assert deliver(*forged) == {"batchItemFailures": []}
    assert task(api, a2)["state"] == "QUEUED"
    # the right key, but a task of an identity not bound to the lane: that one is not applied
    assert deliver(seal(LANE, mac_key, result_pack(ep, b1, a3, value=9))) == {"batchItemFailures": []}
    assert task(bob, b1)["state"] == "QUEUED"
    assert task(api, a3)["state"] == "SUCCEEDED" and task(api, a3)["result"] == "json 3.11\n9"
    # a pack that names another endpoint is checked against that endpoint's lane: none there
    _, other = api.call("POST", "/endpoints", {"name": "elsewhere"})
    [o1] = submit(api, {**site, "ep": other["endpoint_id"]}, user_config=None)
    assert deliver(seal(LANE, mac_key, result_pack(other["endpoint_id"], o1))) == {"batchItemFailures": []}
    assert task(api, o1)["state"] == "QUEUED"
    # an unsealed pack naming the multi-user endpoint is refused (the results stream is
    # shared: it says nothing of who sent it); sealed with the endpoint's own credential's
    # key (its privileged process) it is applied
    assert deliver(result_pack(ep, a2, value=4)) == {"batchItemFailures": []}
    assert task(api, a2)["state"] == "QUEUED"
    assert deliver(sealed(ep, result_pack(ep, a2, value=5)).encode()) == {"batchItemFailures": []}
    assert task(api, a2)["result"] == "json 3.11\n5"


def test_sealed_progress_updates_move_only_bound_identities_tasks(site, api):
    from lambdas.results import lane_pack
    from skyfn.protocol.messages import TaskUpdate

    ep = site["ep"]
    granted = bind(site)
    [a] = submit(api, site)
    bob = Api(mint_token(SECRET, "bob"))
    [b] = submit(bob, site)
    body = ResultPack(endpoint_id=ep, updates=[TaskUpdate(task_id=a, state="RUNNING", ts=1.0),
                                               TaskUpdate(task_id=b, state="RUNNING", ts=1.0)]).model_dump_json()
    pack, refused = lane_pack(seal(LANE, granted["mac_key"], body.encode()).decode())
    assert [u.task_id for u in pack.updates] == [a] and refused == 1
    assert deliver(seal(LANE, granted["mac_key"], body.encode())) == {"batchItemFailures": []}
    assert task(api, a)["state"] == "RUNNING" and task(bob, b)["state"] == "QUEUED"


# --- closing --------------------------------------------------------------------------------
def test_close_unbinds_ends_the_login_and_submissions_go_to_the_endpoint(site, api):
    ep, agent = site["ep"], site["agent"]
    granted = bind(site)
    bind(site, identity="bob", user_config=None)
    bind(site, lane=OTHER_LANE, identity="carol")
    live = redis.Redis.from_url(granted["task_queue"]["url"])
    assert live.xlen(granted["task_queue"]["name"]) == 0
    [left] = submit(api, site)  # waits in the lane when it closes
    status, closed = agent.call("DELETE", f"/endpoints/{ep}/lanes/{LANE}")
    assert status == 200 and closed == {"lane": LANE, "unbound": 2}
    from lambdas.core import deps

    r = redis_client()
    assert r.hgetall(f"lanes:{ep}") == {f"carol {config_key(ALICE_CONFIG)}".encode(): OTHER_LANE.encode()}
    assert not r.exists(f"lane:{ep}:{LANE}", f"lane:{ep}:{LANE}:ids")
    with pytest.raises((redis.exceptions.ConnectionError, redis.exceptions.AuthenticationError)):
        live.xlen(granted["task_queue"]["name"])  # its open connection was cut
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis.from_url(granted["task_queue"]["url"]).ping()
    # the lane's queue stays for the endpoint to take back; new tasks go to the endpoint
    assert queued(granted["task_queue"]["name"]) == [left]
    [after] = submit(api, site)
    assert queued(site["reg"]["task_queue"]["name"]) == [after]
    # its results are no longer applied
    assert deliver(seal(LANE, granted["mac_key"], result_pack(ep, left))) == {"batchItemFailures": []}
    assert task(api, left)["state"] == "QUEUED"
    status, err = agent.call("DELETE", f"/endpoints/{ep}/lanes/{LANE}")
    assert status == 404 and err["error"] == "not_found"


def test_revoking_the_credential_closes_every_lane(site, api):
    ep = site["ep"]
    granted, other = bind(site), bind(site, lane=OTHER_LANE, identity="carol")
    assert api.call("DELETE", f"/endpoints/{ep}/credential")[0] == 200
    for g in (granted, other):
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis.from_url(g["task_queue"]["url"]).ping()
    from lambdas.core import deps

    r = redis_client()
    assert r.hgetall(f"lanes:{ep}") == {}
    assert not r.exists(f"lane:{ep}:{LANE}", f"lane:{ep}:{OTHER_LANE}")
    [tid] = submit(api, site)
    assert queued(site["reg"]["task_queue"]["name"]) == [tid]


# --- the reaper -----------------------------------------------------------------------------
def test_the_reaper_fails_a_lane_queues_dead_letters_and_forgets_a_drained_closed_lane(site, api):
    from lambdas.core import deps
    from lambdas.reaper import reap

    ep = site["ep"]
    granted = bind(site)
    [tid] = submit(api, site)
    lane_q = open_queue(granted["task_queue"], consumer="ua", visibility_timeout=0, max_deliveries=1)
    assert len(lane_q.receive(max_messages=10)) == 1
    assert lane_q.receive(max_messages=10) == []  # its lease expired past max_deliveries: dead-lettered
    assert reap()["dead_lettered"] == 1
    info = task(api, tid)
    assert info["state"] == "FAILED" and f"dead-lettered after 1 deliveries to endpoint {ep}" in info["reason"]
    r = redis_client()
    assert r.smembers(f"lanes:{ep}:queues") == {LANE.encode()}  # open: still watched
    assert site["agent"].call("DELETE", f"/endpoints/{ep}/lanes/{LANE}")[0] == 200
    reap()
    assert r.smembers(f"lanes:{ep}:queues") == set()  # closed and empty: forgotten


def test_a_lanes_dead_letter_naming_another_users_task_fails_only_the_lanes_own(site, api):
    """The lane's login may add to its own dead-letter stream (its receive dead-letters there):
    a dead letter it writes itself naming bob's task (bob is not bound to the lane) leaves
    bob's task alone; alice's task in the same forged letter is hers to fail."""
    from lambdas.reaper import reap

    ep = site["ep"]
    granted = bind(site)
    [mine] = submit(api, site)
    bob = Api(mint_token(SECRET, "bob"))
    [theirs] = submit(bob, site)
    lane_q = open_queue(granted["task_queue"], consumer="ua")
    forged = json.dumps({"tasks": [{"task_id": theirs}, {"task_id": mine}]})
    lane_q._client.xadd(f"{granted['task_queue']['name']}:dlq", {"id": "0-1", "b": forged, "n": 9})
    assert reap()["dead_lettered"] == 1
    assert task(bob, theirs)["state"] == "QUEUED"
    info = task(api, mine)
    assert info["state"] == "FAILED" and "dead-lettered after 9 deliveries" in info["reason"]


# --- where lanes cannot be -------------------------------------------------------------------
def test_sqs_task_queues_have_no_lanes(site, monkeypatch, unique):
    from lambdas.core import deps

    monkeypatch.setenv("SKYFN_QUEUE_KIND", "sqs")
    monkeypatch.setenv("SKYFN_SQS_PREFIX", f"q{unique}")
    deps.reset()
    ep, agent = site["ep"], site["agent"]
    status, err = agent.call("POST", f"/endpoints/{ep}/lanes", {"lane": LANE, "identity_id": "alice",
                                                                "config_key": "none"})
    assert status == 409 and err["error"] == "lanes_unavailable"
    assert "Redis Streams" in err["message"] and "routes its tasks itself" in err["message"]
    status, err = agent.call("DELETE", f"/endpoints/{ep}/lanes/{LANE}")
    assert status == 409 and err["error"] == "lanes_unavailable"
