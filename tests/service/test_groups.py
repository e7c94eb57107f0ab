"""Endpoint groups at the service: POST/GET /endpoint-groups, tasks submitted to a group
placed by its aAPP policy against the live load of its members (real Redis, moto)."""
from __future__ import annotations

import textwrap

import pytest

from skyfn.protocol import pack_args, serialize_function
from lambdas.adapters.redis_store.connection import redis_client


def work(x):
    return x


@pytest.fixture
def eps(api):
    ids = {}
    for name in ("alpha", "beta", "gamma"):
        status, body = api.call("POST", "/endpoints", {"name": name})
        assert status == 201
        ids[name] = body["endpoint_id"]
    return ids


def fn(api, tag=None):
    body = {"function": serialize_function(work), "name": f"work-{tag}"}
    if tag:
        body["tag"] = tag
    status, answer = api.call("POST", "/functions", body)
    assert status == 201
    return answer["function_id"]


def group(api, eps, policy=None, names=("alpha", "beta", "gamma"), expect=201):
    body = {"name": "sites", "members": [{"endpoint_id": eps[n]} for n in names]}
    if policy is not None:
        body["policy"] = textwrap.dedent(policy)
    status, answer = api.call("POST", "/endpoint-groups", body)
    assert status == expect, answer
    return answer


def submit(api, fid, n=1, **target):
    status, body = api.call("POST", "/tasks", {**target, "tasks": [{"function_id": fid, "payload": pack_args((1,), {})}
                                                                   for _ in range(n)]})
    assert status == 202, body
    return body["task_ids"]


def where(api, task_ids):
    out = []
    for tid in task_ids:
        status, body = api.call("GET", f"/tasks/{tid}")
        assert status == 200
        out.append(body["endpoint_id"])
    return out


def load(ep_id):
    from lambdas.core import deps

    return {k.decode(): int(v) for k, v in redis_client().hgetall(f"load:{ep_id}").items()}


# --- create / read ----------------------------------------------------------------------
def test_create_and_get_a_group_with_live_member_state(api, eps):
    g = group(api, eps, """
        heavy:
          - workers: [alpha, beta]
            affinity: "!light, !ghost"
        light:
          - workers: "*"
        """)
    assert g["name"] == "sites" and g["owner"] == "alice"
    assert [(m["name"], m["endpoint_id"]) for m in g["members"]] == [(n, eps[n]) for n in ("alpha", "beta", "gamma")]
    assert g["members"][0] == {"name": "alpha", "endpoint_id": eps["alpha"], "status": "new", "capacity": 0,
                               "backlog": 0, "tags": {}}
    (warning,) = g["warnings"]
    assert warning["line"] == 4 and "'ghost', which this policy does not define" in warning["reason"]
    heavy = fn(api, "heavy")
    submit(api, heavy, 2, endpoint_id=eps["gamma"])
    api.call("POST", f"/endpoints/{eps['gamma']}/heartbeat", {"stats": {"workers": 4}})
    status, got = api.call("GET", f"/endpoint-groups/{g['group_id']}")
    assert status == 200 and got["policy"] == g["policy"]
    assert got["members"][2] == {"name": "gamma", "endpoint_id": eps["gamma"], "status": "online", "capacity": 4,
                                 "backlog": 2, "tags": {"heavy": 2}}


def test_default_policy_is_shortest_backlog(api, eps):
    g = group(api, eps)
    assert "shortest_backlog" in g["policy"] and g["warnings"] == []


def test_invalid_policy_is_422_with_line_key_and_reason(api, eps):
    status, body = api.call("POST", "/endpoint-groups", {
        "name": "g", "members": [{"endpoint_id": eps["alpha"]}],
        "policy": "t:\n  - workers: [alpha]\n    strategy: fastest\n  - workers: '*'\n    invalidate: capacity_used 200%\n"})
    assert status == 422 and body["error"] == "invalid_policy"
    assert body["details"] == [
        {"line": 3, "key": "t[1].strategy",
         "reason": "unknown strategy 'fastest' (expected one of: any, best_first, warm_first, shortest_backlog, "
                   "round_robin, data_local)"},
        {"line": 5, "key": "t[2].invalidate.capacity_used",
         "reason": "bad percentage '200%': give a number above 0 and at most 100, e.g. 50%"}]
    assert body["message"].startswith("policy rejected: line 3: t[1].strategy: unknown strategy 'fastest'")


def test_policy_naming_a_non_member_is_422(api, eps):
    status, body = api.call("POST", "/endpoint-groups", {
        "name": "g", "members": [{"endpoint_id": eps["alpha"], "name": "fast"}, {"endpoint_id": eps["beta"]}],
        "policy": "t:\n  - workers: [fast, alpha]\n"})
    assert status == 422 and body["error"] == "invalid_policy"
    assert body["details"] == [{"line": 2, "key": "workers",
                                "reason": "worker 'alpha' is not one of the known workers (beta, fast)"}]


@pytest.mark.parametrize("members, message", [
    ([{"endpoint_id": "6a0e0a57-8d6a-4e43-9a8c-4b2a1e1f0000"}], "members[0]: endpoint 6a0e0a57"),
    ([{"endpoint_id": "ALPHA"}, {"endpoint_id": "ALPHA"}], "members[1]: endpoint ALPHA_ID is listed twice"),
    ([{"endpoint_id": "ALPHA", "name": "x"}, {"endpoint_id": "BETA", "name": "x"}],
     "members[1]: the name 'x' is taken by members[0]"),
])
def test_bad_members_are_422(api, eps, members, message):
    for m in members:
        m["endpoint_id"] = eps.get(m["endpoint_id"].lower(), m["endpoint_id"])
    status, body = api.call("POST", "/endpoint-groups", {"name": "g", "members": members})
    message = message.replace("ALPHA_ID", eps["alpha"])
    assert status == 422 and body["error"] == "invalid_group" and body["message"].startswith(message)


def test_request_shape_errors_are_422(api, eps):
    for bad in ({"name": "g", "members": []}, {"name": "g"}, {"name": "bad name", "members": [{"endpoint_id": "x"}]},
                {"name": "g", "members": [{"endpoint_id": eps["alpha"]}], "colour": 1}):
        status, body = api.call("POST", "/endpoint-groups", bad)
        assert status == 422 and body["error"] == "invalid_request", bad


def test_groups_are_private_and_unknown_ids_404(api, other_api, eps):
    g = group(api, eps)
    status, body = other_api.call("GET", f"/endpoint-groups/{g['group_id']}")
    assert status == 404 and "not found" in body["message"]
    status, _ = api.call("GET", "/endpoint-groups/6a0e0a57-8d6a-4e43-9a8c-4b2a1e1f0000")
    assert status == 404
    # someone else's endpoint cannot be a member
    status, body = other_api.call("POST", "/endpoint-groups", {"name": "g", "members": [{"endpoint_id": eps["alpha"]}]})
    assert status == 422 and "members[0]: endpoint" in body["message"]
    # nor can someone else's group be submitted to
    fid = fn(other_api)
    status, body = other_api.call("POST", "/tasks", {"group_id": g["group_id"], "tasks": [
        {"function_id": fid, "payload": pack_args((1,), {})}]})
    assert status == 404 and f"endpoint group {g['group_id']} not found" in body["message"]


# --- placement at submission ------------------------------------------------------------
def test_shortest_backlog_fills_the_least_loaded_members(api, eps):
    from lambdas.core import deps

    g = group(api, eps, names=("alpha", "beta"))
    f = fn(api)
    submit(api, f, 5, endpoint_id=eps["alpha"])
    ids = submit(api, f, 7, group_id=g["group_id"])
    got = where(api, ids)
    # beta until it has alpha's 5; at a tie the earlier member (alpha); then beta again
    assert got == [eps["beta"]] * 5 + [eps["alpha"], eps["beta"]]
    assert load(eps["alpha"]) == {"_": 6} and load(eps["beta"]) == {"_": 6}
    r = redis_client()
    assert r.xlen(f"tasks:{eps['beta']}") >= 1  # queued on the chosen endpoint's own queue


def test_affinity_and_anti_affinity_by_function_tag(api, eps):
    g = group(api, eps, """
        divide:
          - workers: *
            affinity: impera, !heavy
          - workers: *
            affinity: !heavy
          - followup: fail
        """)
    heavy, impera, divide = fn(api, "heavy"), fn(api, "impera"), fn(api, "divide")
    submit(api, heavy, 1, endpoint_id=eps["alpha"])
    submit(api, impera, 1, endpoint_id=eps["alpha"])
    submit(api, impera, 1, endpoint_id=eps["gamma"])
    ids = submit(api, divide, 4, group_id=g["group_id"])
    assert set(where(api, ids)) == {eps["gamma"]}  # runs impera, not heavy
    assert load(eps["gamma"]) == {"impera": 1, "divide": 4}


def test_followup_fail_fails_the_task_with_the_reason_and_the_rest_runs(api, eps):
    g = group(api, eps, """
        fussy:
          - workers: [alpha]
            affinity: partner
          - followup: fail
        """, names=("alpha", "beta"))
    fussy, other = fn(api, "fussy"), fn(api)
    status, body = api.call("POST", "/tasks", {"group_id": g["group_id"], "tasks": [
        {"function_id": fussy, "payload": pack_args((1,), {})},
        {"function_id": other, "payload": pack_args((2,), {})}]})
    assert status == 202
    bad, good = body["task_ids"]
    status, answer = api.call("POST", "/tasks/status", {"task_ids": [bad, good]})
    assert answer["tasks"][bad]["state"] == "FAILED"
    assert answer["tasks"][bad]["reason"] == (
        "placement in endpoint group 'sites': no valid worker for tag 'fussy': 'fussy' block 1 (line 3): "
        "alpha runs no 'partner' function (affinity partner) (followup: fail)")
    assert answer["tasks"][good]["state"] == "QUEUED"
    assert where(api, [good])[0] in (eps["alpha"], eps["beta"])
    assert load(eps["alpha"]).get("fussy") is None and load(eps["beta"]).get("fussy") is None


def test_round_robin_carries_across_requests(api, eps):
    g = group(api, eps, """
        default:
          - workers: "*"
            strategy: round_robin
        """)
    f = fn(api)
    ids = [submit(api, f, 1, group_id=g["group_id"])[0] for _ in range(5)]
    assert where(api, ids) == [eps[n] for n in ("alpha", "beta", "gamma", "alpha", "beta")]


def test_offline_members_are_skipped(api, eps):
    from lambdas.core import deps

    g = group(api, eps, """
        default:
          - workers: [alpha, beta]
            strategy: best_first
        """)
    f = fn(api)
    assert where(api, submit(api, f, 1, group_id=g["group_id"])) == [eps["alpha"]]
    redis_client().hset(f"ep:{eps['alpha']}", "st", "offline")  # what the reaper does to a silent endpoint
    assert where(api, submit(api, f, 2, group_id=g["group_id"])) == [eps["beta"]] * 2


def test_capacity_from_heartbeat_drives_capacity_used(api, eps):
    g = group(api, eps, """
        default:
          - workers: [alpha]
            invalidate: capacity_used 50%
          - workers: [beta]
        """, names=("alpha", "beta"))
    api.call("POST", f"/endpoints/{eps['alpha']}/heartbeat", {"stats": {"workers": 4}})
    f = fn(api)
    ids = submit(api, f, 4, group_id=g["group_id"])
    assert where(api, ids) == [eps["alpha"]] * 2 + [eps["beta"]] * 2


def test_load_counters_return_to_zero_when_tasks_end(api, eps):
    from lambdas.core import deps

    g = group(api, eps, names=("alpha",))
    f = fn(api, "t")
    ids = submit(api, f, 3, group_id=g["group_id"])
    assert load(eps["alpha"]) == {"t": 3}
    store = deps.store()
    store.progress([[ids[0], "RUNNING", 1.0, 60]])
    assert load(eps["alpha"]) == {"t": 3}  # running still counts
    store.finish([[ids[0], "SUCCEEDED", "r", None, None, ""]])
    store.finish([[ids[0], "SUCCEEDED", "r", None, None, ""]])  # a duplicate result changes nothing
    assert load(eps["alpha"]) == {"t": 2}
    status, _ = api.call("DELETE", f"/tasks/{ids[1]}")
    assert status == 200 and load(eps["alpha"]) == {"t": 1}
    redis_client().hset(f"t:{ids[2]}", "mr", 0)
    store.progress([[ids[2], "DISPATCHED", 1.0, -10]])  # lease already expired
    assert store.expire_leases()[:2] == (0, 1)          # past its retries: FAILED
    assert load(eps["alpha"]) == {}


def test_task_level_group_overrides_the_batch_endpoint(api, eps):
    g = group(api, eps, """
        default:
          - workers: [gamma]
        """)
    f = fn(api)
    status, body = api.call("POST", "/tasks", {"endpoint_id": eps["alpha"], "tasks": [
        {"function_id": f, "payload": pack_args((1,), {})},
        {"function_id": f, "payload": pack_args((1,), {}), "group_id": g["group_id"]}]})
    assert status == 202
    assert where(api, body["task_ids"]) == [eps["alpha"], eps["gamma"]]


def test_bad_targets(api, eps):
    g = group(api, eps)
    f = fn(api)
    task = {"function_id": f, "payload": pack_args((1,), {})}
    status, body = api.call("POST", "/tasks", {"endpoint_id": eps["alpha"], "group_id": g["group_id"], "tasks": [task]})
    assert status == 422 and body["message"] == "give the batch an endpoint_id or a group_id, not both"
    status, body = api.call("POST", "/tasks", {"tasks": [{**task, "endpoint_id": eps["alpha"], "group_id": g["group_id"]}]})
    assert status == 422 and body["message"] == "task 0 has both endpoint_id and group_id: give one"
    status, body = api.call("POST", "/tasks", {"group_id": "no-such-group", "tasks": [task]})
    assert status == 404 and "endpoint group no-such-group not found" in body["message"]
    status, body = api.call("POST", "/tasks", {"tasks": [task]})
    assert status == 404 and "has no endpoint: give endpoint_id or group_id" in body["message"]


# --- data-aware placement (issue 12) -----------------------------------------------------
def test_a_task_goes_where_its_data_lives(api, eps):
    g = group(api, eps, """
        default:
          - workers: "*"
            strategy: data_local
        """)
    fid = fn(api)
    task = {"function_id": fid, "payload": pack_args((1,), {})}
    status, body = api.call("POST", "/tasks", {"group_id": g["group_id"], "tasks": [
        {**task, "data_locations": {eps["gamma"]: 100 << 20, eps["alpha"]: 10}},
        {**task, "data_locations": {eps["beta"]: 1}},
        {**task, "data_locations": {"not-a-member": 5}},  # data elsewhere: shortest backlog
    ]})
    assert status == 202, body
    placed = where(api, body["task_ids"])
    assert placed[:2] == [eps["gamma"], eps["beta"]]
    assert placed[2] in eps.values()


def test_data_locations_are_validated(api, eps):
    fid = fn(api)
    status, body = api.call("POST", "/tasks", {"endpoint_id": eps["alpha"], "tasks": [
        {"function_id": fid, "payload": pack_args((1,), {}), "data_locations": {eps["beta"]: -1}}]})
    assert status == 422 and "data_locations" in str(body)


def test_a_dependent_goes_where_its_inputs_are(api, eps):
    """Dataflow (issue 26): a task's inputs count as its data, whether named by id or as an
    earlier task of the same request placed by the group itself."""
    from skyfn.protocol.dataflow import Input

    g = group(api, eps, """
        default:
          - workers: "*"
            strategy: data_local
        """)
    fid = fn(api)
    status, body = api.call("POST", "/tasks", {"endpoint_id": eps["gamma"], "tasks": [
        {"function_id": fid, "payload": pack_args((1,), {})}]})
    (on_gamma,) = body["task_ids"]
    dependent = {"function_id": fid, "payload": pack_args((Input(0),), {})}
    for _ in range(3):  # never by chance: each time on gamma
        status, body = api.call("POST", "/tasks", {"group_id": g["group_id"], "tasks": [
            {**dependent, "inputs": [on_gamma]}]})
        assert status == 202, body
        assert where(api, body["task_ids"]) == [eps["gamma"]]
    status, body = api.call("POST", "/tasks", {"group_id": g["group_id"], "tasks": [
        {"function_id": fid, "payload": pack_args((1,), {})}, {**dependent, "inputs": ["#0"]},
        {**dependent, "inputs": ["#1"]}]})
    assert status == 202, body
    placed = where(api, body["task_ids"])
    assert placed[1] == placed[2] == placed[0]
