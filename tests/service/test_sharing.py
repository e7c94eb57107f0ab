"""Authorization (lambdas/core/identity/access.py, teams.py) through the real API handler on a real
redis-server and moto: owners share functions, endpoints and endpoint groups with users or
teams with a role (run, manage); a share grants exactly its role; revoking takes effect on
the next request; another user's objects, tasks and results are 404 -- the same answer as
for ids that do not exist, so nothing leaks their existence."""
from __future__ import annotations

import uuid

import pytest

from lambdas.auth import mint_token
from skyfn.protocol import pack_args, serialize_function
from tests.service.conftest import SECRET, Api
from lambdas.adapters.redis_store.connection import redis_client


def inc(x):
    return x + 1


@pytest.fixture
def bob(service_env):
    return Api(mint_token(SECRET, "bob"))


@pytest.fixture
def world(api):
    """alice's function, endpoint and endpoint group."""
    _, fn = api.call("POST", "/functions", {"function": serialize_function(inc)})
    _, ep = api.call("POST", "/endpoints", {"name": "cluster"})
    status, grp = api.call("POST", "/endpoint-groups", {"name": "g", "members": [{"endpoint_id": ep["endpoint_id"]}]})
    assert status == 201
    return {"fn": fn["function_id"], "ep": ep["endpoint_id"], "grp": grp["group_id"]}


def submit(api, fn, ep=None, group=None):
    body = {"tasks": [{"function_id": fn, "payload": pack_args((1,), {})}]}
    body.update({"endpoint_id": ep} if ep else {"group_id": group})
    return api.call("POST", "/tasks", body)


def test_unshared_objects_are_404_like_ids_that_do_not_exist(world, api, other_api):
    missing = str(uuid.uuid4())
    for path in ("/functions/{}", "/endpoints/{}", "/endpoint-groups/{}", "/shares/functions/{}",
                 "/shares/endpoints/{}"):
        theirs = other_api.call("GET", path.format(world["fn"] if "function" in path else
                                                   world["grp"] if "group" in path else world["ep"]))
        nothing = other_api.call("GET", path.format(missing))
        assert theirs[0] == nothing[0] == 404, path
        assert theirs[1]["error"] == nothing[1]["error"] == "not_found"
    status, body = submit(other_api, world["fn"], ep=world["ep"])
    assert status == 404
    status, body = submit(other_api, world["fn"], group=world["grp"])
    assert status == 404
    # heartbeats and credentials of alice's endpoint: as if it did not exist
    assert other_api.call("POST", f"/endpoints/{world['ep']}/heartbeat", {"stats": {}})[0] == 404
    assert other_api.call("POST", f"/endpoints/{world['ep']}/credential")[0] == 404
    assert other_api.call("POST", f"/shares/endpoints/{world['ep']}", {"principal": "user:mallory",
                                                                       "role": "manage"})[0] == 404


def test_tasks_and_results_are_the_submitters_alone(world, api, other_api):
    from lambdas.results import apply_pack
    from skyfn.protocol.messages import ResultPack, TaskResult

    _, sub = submit(api, world["fn"], ep=world["ep"])
    tid = sub["task_ids"][0]
    apply_pack(ResultPack(endpoint_id=world["ep"], results=[TaskResult(task_id=tid, state="SUCCEEDED",
                                                                       result="json 3.11\n2")]))
    for method, path, body in [("GET", f"/tasks/{tid}", None), ("DELETE", f"/tasks/{tid}", None),
                               ("GET", f"/tasks/{tid}/audit", None)]:
        status, answer = other_api.call(method, path, body)
        assert status == 404 and answer["error"] == "not_found", path
    status, st = other_api.call("POST", "/tasks/status", {"task_ids": [tid]})
    assert status == 200 and st["tasks"] == {} and st["unknown"] == [tid]
    status, mine = api.call("GET", f"/tasks/{tid}")
    assert status == 200 and mine["result"] == "json 3.11\n2"


def test_run_share_grants_running_and_reading_only(world, api, bob):
    for kind, key in (("functions", "fn"), ("endpoints", "ep")):
        status, shares = api.call("POST", f"/shares/{kind}/{world[key]}", {"principal": "user:bob", "role": "run"})
        assert status == 200 and shares["shares"] == {"user:bob": "run"} and shares["owner"] == "alice"
    status, body = submit(bob, world["fn"], ep=world["ep"])
    assert status == 202
    tid = body["task_ids"][0]
    status, task = bob.call("GET", f"/tasks/{tid}")
    assert status == 200 and task["owner"] == "bob"  # bob's task, on alice's endpoint
    assert api.call("GET", f"/tasks/{tid}")[0] == 404  # alice does not read bob's results
    assert bob.call("GET", f"/functions/{world['fn']}")[1]["owner"] == "alice"
    assert bob.call("GET", f"/endpoints/{world['ep']}")[1]["owner"] == "alice"
    # run is not manage: no heartbeats, no credentials, no re-sharing, no share list
    for method, path, body in [("POST", f"/endpoints/{world['ep']}/heartbeat", {"stats": {}}),
                               ("POST", f"/endpoints/{world['ep']}/credential", None),
                               ("GET", f"/shares/endpoints/{world['ep']}", None),
                               ("POST", f"/shares/endpoints/{world['ep']}", {"principal": "user:carol",
                                                                             "role": "run"})]:
        status, answer = bob.call(method, path, body)
        assert status == 403 and "'run'" in answer["message"] and "'manage'" in answer["message"], path
    status, incoming = bob.call("GET", "/shares")
    assert sorted((s["kind"], s["role"]) for s in incoming["shares"]) == [("endpoint", "run"), ("function", "run")]


def test_manage_share_grants_run_to_others_but_not_manage(world, api, bob):
    api.call("POST", f"/shares/endpoints/{world['ep']}", {"principal": "user:bob", "role": "manage"})
    assert bob.call("POST", f"/endpoints/{world['ep']}/heartbeat", {"stats": {"workers": 4}})[0] == 200
    status, shares = bob.call("POST", f"/shares/endpoints/{world['ep']}", {"principal": "user:carol", "role": "run"})
    assert status == 200 and shares["shares"] == {"user:bob": "manage", "user:carol": "run"}
    status, body = bob.call("POST", f"/shares/endpoints/{world['ep']}", {"principal": "user:dave", "role": "manage"})
    assert status == 403 and "only its owner" in body["message"]
    status, body = bob.call("DELETE", f"/shares/endpoints/{world['ep']}/user:carol")
    assert status == 200 and body["shares"] == {"user:bob": "manage"}
    assert bob.call("POST", f"/endpoints/{world['ep']}/credential")[0] == 201


def test_revoke_takes_effect_on_the_next_request(world, api, bob):
    api.call("POST", f"/shares/functions/{world['fn']}", {"principal": "user:bob", "role": "run"})
    api.call("POST", f"/shares/endpoints/{world['ep']}", {"principal": "user:bob", "role": "run"})
    assert submit(bob, world["fn"], ep=world["ep"])[0] == 202
    status, body = api.call("DELETE", f"/shares/endpoints/{world['ep']}/user:bob")
    assert status == 200 and body["shares"] == {}
    status, body = submit(bob, world["fn"], ep=world["ep"])
    assert status == 404 and "endpoint" in body["message"]
    assert bob.call("GET", f"/endpoints/{world['ep']}")[0] == 404
    assert api.call("DELETE", f"/shares/endpoints/{world['ep']}/user:bob")[0] == 404  # nothing left to revoke


def test_revoke_holds_when_the_cache_is_lost(world, api, bob):
    """Grants are durable in DynamoDB; the Redis copy is refilled from it, revocations included."""

    api.call("POST", f"/shares/endpoints/{world['ep']}", {"principal": "user:bob", "role": "run"})
    api.call("POST", f"/shares/endpoints/{world['ep']}", {"principal": "user:carol", "role": "run"})
    api.call("DELETE", f"/shares/endpoints/{world['ep']}/user:bob")
    redis_client().delete(f"share:endpoint:{world['ep']}")
    assert bob.call("GET", f"/endpoints/{world['ep']}")[0] == 404
    carol = Api(mint_token(SECRET, "carol"))
    assert carol.call("GET", f"/endpoints/{world['ep']}")[0] == 200


def test_team_shares_follow_membership(world, api, bob):
    status, team = api.call("POST", "/teams", {"name": "lab", "members": ["bob"]})
    assert status == 201 and team["members"] == ["alice", "bob"]
    api.call("POST", f"/shares/endpoint-groups/{world['grp']}", {"principal": f"team:{team['team_id']}",
                                                                  "role": "run"})
    api.call("POST", f"/shares/functions/{world['fn']}", {"principal": f"team:{team['team_id']}", "role": "run"})
    status, body = submit(bob, world["fn"], group=world["grp"])
    assert status == 202  # the group's policy placed it on alice's endpoint for bob
    assert bob.call("GET", f"/teams/{team['team_id']}")[0] == 200
    assert bob.call("PUT", f"/teams/{team['team_id']}/members/eve")[0] == 403  # only the owner edits
    status, team = api.call("DELETE", f"/teams/{team['team_id']}/members/bob")
    assert status == 200 and team["members"] == ["alice"]
    assert submit(bob, world["fn"], group=world["grp"])[0] == 404
    assert bob.call("GET", f"/teams/{team['team_id']}")[0] == 404


@pytest.mark.parametrize("body", [{"principal": "bob", "role": "run"}, {"principal": "user:bob", "role": "admin"},
                                  {"principal": "group:x", "role": "run"}, {"principal": "user:bob"}])
def test_bad_shares_are_422(world, api, body):
    status, answer = api.call("POST", f"/shares/endpoints/{world['ep']}", body)
    assert status == 422 and answer["error"] == "invalid_request"


def test_sharing_with_the_owner_is_refused(world, api):
    status, body = api.call("POST", f"/shares/endpoints/{world['ep']}", {"principal": "user:alice", "role": "run"})
    assert status == 422 and "owns" in body["message"]


def test_task_audit_names_submitter_endpoint_and_every_state(world, api):
    from lambdas import history
    from lambdas.results import apply_pack
    from skyfn.protocol.messages import ResultPack, TaskResult, TaskUpdate

    _, sub = submit(api, world["fn"], ep=world["ep"])
    tid = sub["task_ids"][0]
    apply_pack(ResultPack(endpoint_id=world["ep"], updates=[TaskUpdate(task_id=tid, state="RUNNING", ts=1.0)]))
    apply_pack(ResultPack(endpoint_id=world["ep"], results=[TaskResult(task_id=tid, state="FAILED", reason="boom")]))
    status, audit = api.call("GET", f"/tasks/{tid}/audit")
    assert status == 200
    assert (audit["submitter"], audit["endpoint_id"], audit["function_id"]) == ("alice", world["ep"], world["fn"])
    assert [e[0] for e in audit["events"]] == ["CREATED", "QUEUED", "RUNNING", "FAILED", "STORED"]
    assert audit["reason"] == "boom" and "result" not in audit
    # once purged from Redis, the durable history answers the same
    history.flush()
    redis_client().delete(f"t:{tid}")
    status, durable = api.call("GET", f"/tasks/{tid}/audit")
    assert status == 200 and durable["events"] == audit["events"] and durable["submitter"] == "alice"


def test_a_group_built_on_a_shared_endpoint_stops_using_it_once_revoked(world, api, bob):
    """bob groups alice's endpoint (shared with him) with one of his own; after alice revokes,
    bob's group no longer places anything on her endpoint."""
    api.call("POST", f"/shares/endpoints/{world['ep']}", {"principal": "user:bob", "role": "run"})
    _, fn = bob.call("POST", "/functions", {"function": serialize_function(inc)})
    _, own = bob.call("POST", "/endpoints", {"name": "bobs"})
    policy = "default:\n  - workers: [alices]\n    strategy: any\n  - workers: [bobs]\n    strategy: any\n"
    status, grp = bob.call("POST", "/endpoint-groups", {"name": "mixed", "policy": policy, "members": [
        {"endpoint_id": world["ep"], "name": "alices"}, {"endpoint_id": own["endpoint_id"], "name": "bobs"}]})
    assert status == 201
    _, sub = submit(bob, fn["function_id"], group=grp["group_id"])
    assert bob.call("GET", f"/tasks/{sub['task_ids'][0]}")[1]["endpoint_id"] == world["ep"]
    api.call("DELETE", f"/shares/endpoints/{world['ep']}/user:bob")
    _, sub = submit(bob, fn["function_id"], group=grp["group_id"])
    assert bob.call("GET", f"/tasks/{sub['task_ids'][0]}")[1]["endpoint_id"] == own["endpoint_id"]
