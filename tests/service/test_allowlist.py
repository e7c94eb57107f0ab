"""Endpoint allowlists at the service: the agent's `allowed_functions` (reported when it
registers and with heartbeats) make a submission of any other function a 403 naming the
endpoint and the function; listed functions (by id, or by owner and name) are queued with
their owner and name in the pack; the list survives a hot store that lost it."""
from __future__ import annotations

import pytest

from skyfn.protocol import pack_args, serialize_function
from skyfn.protocol.allowlist import REFUSED
from skyfn.protocol.messages import TaskPack
from lambdas.adapters.redis_store.connection import redis_client


def simulate(n):
    return n


def other(n):
    return -n


def register_fn(api, fn):
    status, body = api.call("POST", "/functions", {"function": serialize_function(fn), "name": fn.__name__})
    assert status == 201, body
    return body["function_id"]


def register_ep(api, name, allowed):
    status, body = api.call("POST", "/endpoints", {"name": name, "metadata": {}, "allowed_functions": allowed})
    assert status in (200, 201), body
    return body


def submit(api, ep, fid):
    return api.call("POST", "/tasks", {"endpoint_id": ep["endpoint_id"],
                                       "tasks": [{"function_id": fid, "payload": pack_args((1,), {})}]})


def queued_packs(ep) -> list[TaskPack]:
    entries = redis_client().xrange(ep["task_queue"]["name"])
    return [TaskPack.model_validate_json(fields[b"b"]) for _, fields in entries]


@pytest.fixture
def fns(api):
    return register_fn(api, simulate), register_fn(api, other)


def test_unlisted_function_is_refused_with_403_naming_endpoint_and_function(api, fns):
    listed, unlisted = fns
    ep = register_ep(api, "locked", [{"function_id": listed}])
    status, body = submit(api, ep, unlisted)
    assert status == 403, body
    assert body["error"] == "forbidden" and body["message"].startswith(REFUSED)
    assert ep["endpoint_id"] in body["message"] and "(locked)" in body["message"] and unlisted in body["message"]
    assert "allowed_functions" in body["message"] and "config.yaml" in body["message"]  # and how to fix it
    assert body["details"] == {"endpoint_id": ep["endpoint_id"], "function_id": unlisted,
                               "reason": "function_not_allowed"}
    assert queued_packs(ep) == []  # nothing was stored or queued

    status, body = submit(api, ep, listed)
    assert status == 202, body
    (pack,) = queued_packs(ep)
    assert pack.function_meta == {listed: {"owner": "alice", "name": "simulate"}}


def test_a_mixed_submission_is_refused_whole(api, fns):
    listed, unlisted = fns
    ep = register_ep(api, "locked", [{"function_id": listed}])
    status, body = api.call("POST", "/tasks", {"endpoint_id": ep["endpoint_id"], "tasks": [
        {"function_id": listed, "payload": pack_args((1,), {})},
        {"function_id": unlisted, "payload": pack_args((2,), {})}]})
    assert status == 403 and unlisted in body["message"]
    assert queued_packs(ep) == []


def test_owner_and_name_entries(api, other_api, fns):
    listed, unlisted = fns
    ep = register_ep(api, "by-name", [{"owner": "alice", "name": "simulate"}])
    assert submit(api, ep, listed)[0] == 202
    assert submit(api, ep, register_fn(api, simulate))[0] == 202  # a new version under the same name
    status, body = submit(api, ep, unlisted)
    assert status == 403 and "(alice/other)" in body["message"]
    # mallory's function of the same name is not alice's: shared endpoint, still refused
    status, _ = api.call("POST", f"/shares/endpoints/{ep['endpoint_id']}", {"principal": "user:mallory",
                                                                             "role": "run"})
    assert status == 200
    mallory_fn = register_fn(other_api, simulate)
    status, body = submit(other_api, ep, mallory_fn)
    assert status == 403 and "(mallory/simulate)" in body["message"], body


def test_heartbeats_change_the_list_and_absent_leaves_it(api, fns):
    listed, unlisted = fns
    ep = register_ep(api, "hb", [{"function_id": listed}])
    path = f"/endpoints/{ep['endpoint_id']}/heartbeat"
    assert api.call("POST", path, {"stats": {}})[0] == 200  # no allowed_functions key: unchanged
    assert submit(api, ep, unlisted)[0] == 403
    assert api.call("POST", path, {"stats": {}, "allowed_functions": [{"function_id": unlisted}]})[0] == 200
    assert submit(api, ep, unlisted)[0] == 202 and submit(api, ep, listed)[0] == 403
    assert api.call("POST", path, {"stats": {}, "allowed_functions": None})[0] == 200  # null: any function
    assert submit(api, ep, listed)[0] == 202
    assert api.call("POST", path, {"stats": {}, "allowed_functions": []})[0] == 200  # empty: none
    assert submit(api, ep, unlisted)[0] == 403


def test_the_list_survives_a_hot_store_that_lost_it(api, fns):
    listed, unlisted = fns
    ep = register_ep(api, "durable", [{"function_id": listed}])
    redis_client().delete(f"ep:{ep['endpoint_id']}")  # rebuilt from DynamoDB on the next read
    status, body = submit(api, ep, unlisted)
    assert status == 403, body
    # re-registering without the key (a user's own call) keeps it; with null clears it
    assert api.call("POST", "/endpoints", {"name": "durable"})[0] == 200
    assert submit(api, ep, unlisted)[0] == 403
    register_ep(api, "durable", None)
    assert submit(api, ep, unlisted)[0] == 202


@pytest.mark.parametrize("entry, problem", [
    ({"function_id": "not-a-uuid"}, "function_id"),
    ({"owner": "alice"}, "needs both owner and name"),
    ({"function_id": "0f8fad5b-d9cb-469f-a165-70867728950e", "name": "x"}, "not both"),
    ({"fn": "x"}, "fn"),
])
def test_a_bad_list_is_a_422(api, entry, problem):
    status, body = api.call("POST", "/endpoints", {"name": "bad", "allowed_functions": [entry]})
    assert status == 422 and problem in body["message"], body
