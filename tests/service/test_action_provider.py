"""The Globus Flows action provider (/flows-ap) at the service, with real redis-server and
moto: every route's request and response is validated with globus-action-provider-tools'
schemas (ap_schemas.py, in its own virtualenv); run -> ACTIVE -> SUCCEEDED with the
function's result (the agent's side played by result packs, as the results queue delivers
them); cancel and release; repeats of a request_id; another user's action is a 404;
the service's own checks (allowlists, unknown functions) pass through."""
from __future__ import annotations

import pytest

from lambdas.core.runs.actions import principal
from lambdas.results import apply_pack
from skyfn.protocol import serialize, serialize_function
from skyfn.protocol.messages import ResultPack, TaskResult, TaskUpdate
from skyfn.protocol.states import now
from tests.service import ap_schemas
from lambdas.adapters.redis_store.connection import redis_client


def square(x):
    return x * x


class Recorder:
    """Calls the API and keeps every Action Provider document exchanged, for validation."""

    def __init__(self, api):
        self.api = api
        self.documents: list[dict] = []

    def call(self, method, path, body=None, kind=None, token="default"):
        if "?" in path:  # query parameters, as API Gateway hands them over
            status, answer = self._with_query(method, path, body)
        else:
            status, answer = self.api.call(method, path, body, token=token)
        where = f"{method} {path} -> {status}"
        if body is not None and path.endswith(("/run", "/actions")) and method == "POST":
            self.documents.append({"kind": "ActionRequest", "where": where, "doc": body})
        if kind and 200 <= status < 300:
            self.documents.append({"kind": kind, "where": where, "doc": answer})
        return status, answer


    def _with_query(self, method, path, body):
        import json
        from urllib.parse import parse_qs

        from lambdas.api import handler
        from tests.service.conftest import Context, api_event

        path, _, query = path.partition("?")
        multi = parse_qs(query)
        event = api_event(method, path, body, self.api.token)
        event["queryStringParameters"] = {k: v[-1] for k, v in multi.items()}
        event["multiValueQueryStringParameters"] = multi
        resp = handler(event, Context())
        return resp["statusCode"], json.loads(resp["body"])


@pytest.fixture
def rec(api):
    return Recorder(api)


@pytest.fixture
def world(api):
    status, fn = api.call("POST", "/functions", {"function": serialize_function(square), "name": "square"})
    assert status == 201
    status, ep = api.call("POST", "/endpoints", {"name": "ap-ep"})
    assert status == 201
    return {"fid": fn["function_id"], "ep": ep["endpoint_id"]}


def request(world, request_id="req-1", args=(7,), **extra):
    return {"request_id": request_id, "body": {"function_id": world["fid"], "endpoint_id": world["ep"],
                                               "args": list(args)}, **extra}


def task_of(rec, action_id):
    status, st = rec.call("GET", f"/flows-ap/{action_id}/status", kind="ActionStatus")
    assert status == 200
    return st["details"]["task_id"]


def finish(ep, task_id, value=None, state="SUCCEEDED", reason=None):
    apply_pack(ResultPack(endpoint_id=ep, results=[TaskResult(
        task_id=task_id, state=state, result=serialize(value) if state == "SUCCEEDED" else None, reason=reason)]))


def test_routes_validate_and_run_to_success(rec, world, api):
    status, desc = rec.call("GET", "/flows-ap", kind="ActionProviderDescription")
    assert status == 200 and desc["types"] == ["ACTION"] and desc["synchronous"] is False
    assert desc["input_schema"]["required"] == ["function_id", "endpoint_id"]

    status, st = rec.call("POST", "/flows-ap/run", request(world, label="square seven"), kind="ActionStatus")
    assert status == 202, st
    assert st["status"] == "ACTIVE" and st["display_status"] == "Queued" and st["label"] == "square seven"
    assert st["creator_id"] == principal("alice") and "completion_time" not in st
    action_id, task_id = st["action_id"], st["details"]["task_id"]

    apply_pack(ResultPack(endpoint_id=world["ep"], updates=[TaskUpdate(task_id=task_id, state="RUNNING", ts=now())]))
    status, st = rec.call("GET", f"/flows-ap/{action_id}/status", kind="ActionStatus")
    assert st["status"] == "ACTIVE" and st["display_status"] == "Running"

    finish(world["ep"], task_id, 49)
    for path in (f"/flows-ap/{action_id}/status", f"/flows-ap/actions/{action_id}"):
        status, st = rec.call("GET", path, kind="ActionStatus")
        assert status == 200 and st["status"] == "SUCCEEDED" and st["details"]["result"] == 49, st
        assert st["completion_time"] >= st["start_time"]

    for path in (f"/flows-ap/{action_id}/log", f"/flows-ap/actions/{action_id}/log"):
        status, lg = rec.call("GET", path, kind="ActionLogReturn")
        assert status == 200 and [e["code"] for e in lg["entries"]][0] == "CREATED"
        assert lg["entries"][-1]["code"] in ("SUCCEEDED", "STORED") and lg["has_next_page"] is False
    # paging: limit 1 walks the entries one by one; reverse_order starts from the newest
    seen, marker = [], None
    while True:
        q = "?limit=1" + (f"&marker={marker}" if marker else "")
        status, page = rec.call("GET", f"/flows-ap/{action_id}/log{q}", kind="ActionLogReturn")
        assert status == 200 and len(page["entries"]) == 1
        seen.append(page["entries"][0]["code"])
        if not page["has_next_page"]:
            break
        marker = page["marker"]
    assert seen == [e["code"] for e in lg["entries"]]
    status, rev = rec.call("GET", f"/flows-ap/{action_id}/log?reverse_order=true&limit=100", kind="ActionLogReturn")
    assert [e["code"] for e in rev["entries"]] == seen[::-1]

    # release: the last status once more, then the action is gone
    status, st = rec.call("POST", f"/flows-ap/{action_id}/release", kind="ActionStatus")
    assert status == 200 and st["status"] == "SUCCEEDED"
    status, err = rec.call("GET", f"/flows-ap/{action_id}/status")
    assert status == 404 and action_id in err["message"]

    report = ap_schemas.validate(rec.documents)
    assert report["errors"] == [], report["errors"]
    assert set(report["by_kind"]) == {"ActionProviderDescription", "ActionRequest", "ActionStatus",
                                      "ActionLogReturn"}, report


def test_new_style_paths_cancel_and_failures(rec, world):
    status, st = rec.call("POST", "/flows-ap/actions", request(world, "req-cancel"), kind="ActionStatus")
    assert status == 202
    action_id = st["action_id"]
    status, err = rec.call("DELETE", f"/flows-ap/actions/{action_id}")  # release while ACTIVE
    assert status == 409 and "still ACTIVE" in err["message"]
    status, st = rec.call("POST", f"/flows-ap/actions/{action_id}/cancel", kind="ActionStatus")
    assert status == 200 and st["status"] == "FAILED" and st["details"]["code"] == "Cancelled", st
    status, again = rec.call("POST", f"/flows-ap/{action_id}/cancel", kind="ActionStatus")  # idempotent
    assert status == 200 and again["status"] == "FAILED"
    status, st = rec.call("DELETE", f"/flows-ap/actions/{action_id}", kind="ActionStatus")
    assert status == 200

    status, st = rec.call("POST", "/flows-ap/run", request(world, "req-fail"), kind="ActionStatus")
    finish(world["ep"], st["details"]["task_id"], state="FAILED", reason="worker lost (1 time; no retries left)")
    status, st = rec.call("GET", f"/flows-ap/{st['action_id']}/status", kind="ActionStatus")
    assert st["status"] == "FAILED" and st["details"]["code"] == "TaskFailed"
    assert st["details"]["description"] == "worker lost (1 time; no retries left)"

    report = ap_schemas.validate(rec.documents)
    assert report["errors"] == [], report["errors"]


def test_request_id_repeats_return_the_same_action(rec, world):
    status, first = rec.call("POST", "/flows-ap/run", request(world, "req-same"), kind="ActionStatus")
    assert status == 202
    status, again = rec.call("POST", "/flows-ap/run", request(world, "req-same"), kind="ActionStatus")
    assert status == 200 and again["action_id"] == first["action_id"]
    assert again["details"]["task_id"] == first["details"]["task_id"]
    status, err = rec.call("POST", "/flows-ap/run", request(world, "req-same", args=(8,)))
    assert status == 409 and "req-same" in err["message"] and "new request_id" in err["message"]


def test_another_users_action_is_404_unless_listed(rec, world, other_api):
    mallory = principal("mallory")
    status, st = rec.call("POST", "/flows-ap/run", request(world, "req-private"), kind="ActionStatus")
    private = st["action_id"]
    status, st = rec.call("POST", "/flows-ap/run", request(world, "req-shared", monitor_by=[mallory]),
                          kind="ActionStatus")
    shared = st["action_id"]
    for method, path in (("GET", "{}/status"), ("GET", "actions/{}"), ("POST", "{}/cancel"),
                         ("POST", "{}/release"), ("GET", "{}/log"), ("DELETE", "actions/{}")):
        status, err = other_api.call(method, "/flows-ap/" + path.format(private))
        assert status == 404 and err["error"] == "not_found", (method, path, status)
    # monitor_by lets mallory read, not manage
    status, st = other_api.call("GET", f"/flows-ap/{shared}/status")
    assert status == 200 and st["action_id"] == shared
    assert other_api.call("GET", f"/flows-ap/{shared}/log")[0] == 200
    assert other_api.call("POST", f"/flows-ap/{shared}/cancel")[0] == 404
    # mallory's own request with the same request_id is a different action
    status, mine = other_api.call("POST", "/flows-ap/run", request(world, "req-private"))
    assert status == 404  # alice's function and endpoint are not shared with mallory


def test_service_checks_pass_through(rec, world, api):
    status, err = rec.call("POST", "/flows-ap/run", {**request(world, "req-x"),
                                                       "body": {"function_id": "0f8fad5b-d9cb-469f-a165-70867728950e",
                                                                "endpoint_id": world["ep"]}})
    assert status == 404 and "register it first" in err["message"]
    status, locked = api.call("POST", "/endpoints", {"name": "ap-locked", "allowed_functions": []})
    status, err = rec.call("POST", "/flows-ap/run", {**request(world, "req-y"),
                                                       "body": {"function_id": world["fid"],
                                                                "endpoint_id": locked["endpoint_id"]}})
    assert status == 403 and err["message"].startswith("function not allowed on this endpoint")
    status, err = rec.call("POST", "/flows-ap/run", request(world, "req-z", release_after="P400D"))
    assert status == 422 and "release_after" in err["message"]
    status, err = rec.call("POST", "/flows-ap/run", request(world, "req-w", deadline="2001-01-01T00:00:00Z"))
    assert status == 422 and "deadline" in err["message"]
    status, err = rec.call("POST", "/flows-ap/run", {**request(world, "req-v"), "colour": "red"})
    assert status == 422 and "colour" in err["message"]
    status, err = rec.call("GET", "/flows-ap", token=None)
    assert status == 401


def test_a_task_waiting_for_inputs_is_an_active_action(rec, world):
    """A flow step's task has no inputs, but should one be WAITING (issue 26) its action is
    ACTIVE, never reported FAILED."""

    status, st = rec.call("POST", "/flows-ap/run", request(world, request_id="req-waiting"), kind="ActionStatus")
    assert status == 202, st
    redis_client().hset(f"t:{st['details']['task_id']}", "s", "WAITING")
    status, st = rec.call("GET", f"/flows-ap/{st['action_id']}/status", kind="ActionStatus")
    assert status == 200 and st["status"] == "ACTIVE" and st["display_status"] == "Waiting for its inputs", st
