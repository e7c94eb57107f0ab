"""Every route of the REST API, with good and bad input: bad input is a 4xx with a
reason, never a 5xx, and never changes state."""
from __future__ import annotations

import time

import pytest

from lambdas.auth import mint_token
from skyfn.protocol import pack_args, serialize_function
from skyfn.protocol.api import MAX_REQUEST_BYTES
from tests.service.conftest import SECRET
from lambdas.adapters.redis_store.connection import redis_client


def double(x):
    return 2 * x


@pytest.fixture
def fn_id(api):
    status, body = api.call("POST", "/functions", {"function": serialize_function(double), "name": "double"})
    assert status == 201
    return body["function_id"]


@pytest.fixture
def ep_id(api):
    status, body = api.call("POST", "/endpoints", {"name": "laptop"})
    assert status == 201
    return body["endpoint_id"]


def test_register_and_get_function(api, fn_id):
    status, body = api.call("GET", f"/functions/{fn_id}")
    assert status == 200
    assert body["name"] == "double" and body["owner"] == "alice"
    assert body["function"].startswith("source ")


def test_unknown_function_is_404(api):
    status, body = api.call("GET", "/functions/6a0e0a57-8d6a-4e43-9a8c-4b2a1e1f0000")
    assert status == 404 and "not found" in body["message"]


def test_endpoint_registration_is_idempotent_by_name(api, ep_id):
    status, body = api.call("POST", "/endpoints", {"name": "laptop"})
    assert status == 200 and body["endpoint_id"] == ep_id
    assert body["task_queue"]["kind"] == "redis" and body["task_queue"]["name"] == f"tasks:{ep_id}"
    assert body["results_queue"]["name"] == "results"
    status, body = api.call("GET", "/endpoints")
    assert status == 200 and [e["endpoint_id"] for e in body["endpoints"]] == [ep_id]
    assert body["endpoints"][0]["status"] == "new"


def test_heartbeat_marks_online(api, ep_id):
    status, body = api.call("POST", f"/endpoints/{ep_id}/heartbeat", {"stats": {"workers": 2}})
    assert status == 200 and body["status"] == "online" and body["last_heartbeat"] <= time.time()
    status, body = api.call("GET", f"/endpoints/{ep_id}")
    assert status == 200 and body["status"] == "online"


def test_submit_status_cancel_flow(api, fn_id, ep_id):
    payload = pack_args((21,), {})
    status, body = api.call("POST", "/tasks", {"endpoint_id": ep_id, "tasks": [{"function_id": fn_id, "payload": payload}]})
    assert status == 202 and len(body["task_ids"]) == 1
    tid = body["task_ids"][0]
    status, info = api.call("GET", f"/tasks/{tid}")
    assert status == 200 and info["state"] == "QUEUED" and info["endpoint_id"] == ep_id
    assert [e[0] for e in info["events"]] == ["CREATED", "QUEUED"]
    status, st = api.call("POST", "/tasks/status", {"task_ids": [tid, "nope"]})
    assert status == 200 and st["tasks"][tid]["state"] == "QUEUED" and st["unknown"] == ["nope"]
    status, c = api.call("DELETE", f"/tasks/{tid}")
    assert status == 200 and c["state"] == "CANCELLED"
    status, c = api.call("DELETE", f"/tasks/{tid}")  # a retried cancel is answered the same
    assert status == 200 and c["state"] == "CANCELLED"
    from lambdas.results import apply_pack
    from skyfn.protocol.messages import ResultPack, TaskResult

    _, body = api.call("POST", "/tasks", {"endpoint_id": ep_id, "tasks": [{"function_id": fn_id, "payload": payload}]})
    done = body["task_ids"][0]
    apply_pack(ResultPack(endpoint_id=ep_id, results=[TaskResult(task_id=done, state="SUCCEEDED", result="json 3.11\n1")]))
    status, c = api.call("DELETE", f"/tasks/{done}")
    assert status == 409 and "already SUCCEEDED" in c["message"]


def test_batch_of_10000_in_one_request(api, fn_id, ep_id):
    payload = pack_args((1,), {})
    tasks = [{"function_id": fn_id, "payload": payload}] * 10_000
    status, body = api.call("POST", "/tasks", {"endpoint_id": ep_id, "tasks": tasks})
    assert status == 202 and len(set(body["task_ids"])) == 10_000
    status, st = api.call("POST", "/tasks/status", {"task_ids": body["task_ids"]})
    assert status == 200 and {t["state"] for t in st["tasks"].values()} == {"QUEUED"}


def test_idempotency_key_creates_nothing_twice(api, fn_id, ep_id):
    req = {"endpoint_id": ep_id, "idempotency_key": "req-1",
           "tasks": [{"function_id": fn_id, "payload": pack_args((i,), {})} for i in range(5)]}
    s1, b1 = api.call("POST", "/tasks", req)
    s2, b2 = api.call("POST", "/tasks", req)
    assert (s1, s2) == (202, 200)
    assert b1["task_ids"] == b2["task_ids"] and b2["replayed"] is True
    from lambdas.core import deps

    assert redis_client().xlen(f"tasks:{ep_id}") == 1  # one pack, sent once


def test_status_long_poll_returns_when_a_result_lands(api, fn_id, ep_id):
    import threading

    from lambdas.results import apply_pack
    from skyfn.protocol.messages import ResultPack, TaskResult

    _, body = api.call("POST", "/tasks", {"endpoint_id": ep_id, "tasks": [{"function_id": fn_id, "payload": pack_args((1,), {})}]})
    tid = body["task_ids"][0]
    pack = ResultPack(endpoint_id=ep_id, results=[TaskResult(task_id=tid, state="SUCCEEDED", result="json 3.11\n2")])
    threading.Timer(0.3, apply_pack, args=(pack,)).start()
    t0 = time.monotonic()
    status, st = api.call("POST", "/tasks/status", {"task_ids": [tid], "wait": 5})
    waited = time.monotonic() - t0
    assert status == 200 and st["tasks"][tid]["state"] == "SUCCEEDED" and st["tasks"][tid]["result"] == "json 3.11\n2"
    assert 0.2 < waited < 4


# --- bad input: 4xx with a reason, never 5xx ------------------------------------------
def test_no_token_is_401(api):
    status, body = api.call("GET", "/endpoints", token=None)
    assert status == 401 and "Authorization" in body["message"]


def test_forged_and_expired_tokens_are_401(api):
    forged = mint_token("another-secret-" + "y" * 32, "alice")
    status, body = api.call("GET", "/endpoints", token=forged)
    assert status == 401 and "signature does not verify" in body["message"]
    expired = mint_token(SECRET, "alice", ttl_seconds=-120)  # beyond the 30 s clock leeway
    status, body = api.call("GET", "/endpoints", token=expired)
    assert status == 401 and "expired" in body["message"]


@pytest.mark.parametrize("raw", ["{not json", "[1,2", "", "null", "42"])
def test_malformed_json_is_4xx(api, raw):
    status, body = api.call("POST", "/tasks", raw=raw)
    assert 400 <= status < 500, body
    assert body["message"]


def test_oversized_body_is_413(api):
    status, body = api.call("POST", "/functions", raw="x" * (MAX_REQUEST_BYTES + 1))
    assert status == 413 and "exceeds the limit" in body["message"]


def test_invalid_batches_are_422_and_store_nothing(api, fn_id, ep_id):
    from lambdas.core import deps

    cases = [
        {"endpoint_id": ep_id, "tasks": []},
        {"endpoint_id": ep_id, "tasks": [{"function_id": fn_id}]},
        {"endpoint_id": ep_id, "tasks": [{"function_id": fn_id, "payload": "x", "bogus": 1}]},
        {"endpoint_id": ep_id, "tasks": [{"function_id": fn_id, "payload": "x"}] * 20_001},
        {"endpoint_id": ep_id, "max_retries": -1, "tasks": [{"function_id": fn_id, "payload": "x"}]},
    ]
    for req in cases:
        status, body = api.call("POST", "/tasks", req)
        assert status == 422, (status, body)
        assert body["error"] == "invalid_request" and body["message"]
    assert redis_client().xlen(f"tasks:{ep_id}") == 0


def test_unknown_ids_in_a_batch_are_404_and_store_nothing(api, fn_id, ep_id):
    from lambdas.core import deps

    status, body = api.call("POST", "/tasks", {"endpoint_id": ep_id, "tasks": [{"function_id": "f-missing", "payload": "x"}]})
    assert status == 404 and "function f-missing not found" in body["message"]
    status, body = api.call("POST", "/tasks", {"endpoint_id": "e-missing", "tasks": [{"function_id": fn_id, "payload": "x"}]})
    assert status == 404 and "endpoint e-missing not found" in body["message"]
    status, body = api.call("POST", "/tasks", {"tasks": [{"function_id": fn_id, "payload": "x"}]})
    assert status == 404 and "no endpoint" in body["message"]
    assert redis_client().xlen(f"tasks:{ep_id}") == 0


def test_unknown_ids_and_routes(api):
    assert api.call("GET", "/tasks/6a0e0a57-8d6a-4e43-9a8c-4b2a1e1f0000")[0] == 404
    assert api.call("DELETE", "/tasks/unknown")[0] == 404
    assert api.call("GET", "/endpoints/6a0e0a57-8d6a-4e43-9a8c-4b2a1e1f0000")[0] == 404
    assert api.call("POST", "/endpoints/unknown/heartbeat", {})[0] == 404
    assert api.call("GET", "/nowhere")[0] == 404
    assert api.call("GET", "/tasks/bad%20id")[0] == 422
    status, body = api.call("POST", "/endpoints", {"name": "bad name!"})
    assert status == 422 and "name" in body["message"]
    status, body = api.call("POST", "/tasks/status", {"task_ids": []})
    assert status == 422


def test_other_users_see_nothing(api, other_api, fn_id, ep_id):
    _, body = api.call("POST", "/tasks", {"endpoint_id": ep_id, "tasks": [{"function_id": fn_id, "payload": pack_args((1,), {})}]})
    tid = body["task_ids"][0]
    assert other_api.call("GET", f"/functions/{fn_id}")[0] == 404
    assert other_api.call("GET", f"/endpoints/{ep_id}")[0] == 404
    assert other_api.call("GET", f"/tasks/{tid}")[0] == 404
    assert other_api.call("DELETE", f"/tasks/{tid}")[0] == 404
    status, st = other_api.call("POST", "/tasks/status", {"task_ids": [tid]})
    assert status == 200 and st["tasks"] == {} and st["unknown"] == [tid]
    status, body = other_api.call("POST", "/tasks", {"endpoint_id": ep_id, "tasks": [{"function_id": fn_id, "payload": "x"}]})
    assert status == 404
    assert other_api.call("GET", "/endpoints")[1] == {"endpoints": []}


def test_openapi_document(api):
    status, doc = api.call("GET", "/openapi.json", token=None)
    assert status == 200 and doc["openapi"].startswith("3.")
    for path in ["/functions", "/functions/{function_id}", "/endpoints", "/endpoints/{endpoint_id}",
                 "/endpoints/{endpoint_id}/heartbeat", "/tasks", "/tasks/{task_id}", "/tasks/status"]:
        assert path in doc["paths"], path
    assert "SubmitTasks" in doc["components"]["schemas"]


def test_status_cursor_returns_only_newly_finished(api, fn_id, ep_id):
    from lambdas.results import apply_pack
    from skyfn.protocol.messages import ResultPack, TaskResult

    _, body = api.call("POST", "/tasks", {"endpoint_id": ep_id, "tasks": [{"function_id": fn_id, "payload": pack_args((i,), {})} for i in range(3)]})
    a, b, c = body["task_ids"]
    apply_pack(ResultPack(endpoint_id=ep_id, results=[TaskResult(task_id=a, state="SUCCEEDED", result="json 3.11\n1")]))
    status, st = api.call("POST", "/tasks/status", {"task_ids": [a, b, c]})
    assert status == 200 and st["tasks"][a]["state"] == "SUCCEEDED" and st["tasks"][b]["state"] == "QUEUED"
    cursor = st["cursor"]
    status, st = api.call("POST", "/tasks/status", {"task_ids": [b, c], "cursor": cursor})
    assert status == 200 and st["tasks"] == {}
    apply_pack(ResultPack(endpoint_id=ep_id, results=[TaskResult(task_id=c, state="FAILED", reason="x")]))
    status, st = api.call("POST", "/tasks/status", {"task_ids": [b, c], "cursor": cursor, "wait": 2})
    assert status == 200 and list(st["tasks"]) == [c] and st["tasks"][c]["state"] == "FAILED"
    assert st["cursor"] != cursor
    status, st = api.call("POST", "/tasks/status", {"task_ids": [b], "cursor": "1-0"})  # trimmed away: full read
    assert status == 200 and st["tasks"][b]["state"] == "QUEUED"


def test_endpoint_keeps_its_id_when_the_registry_lost_its_data(api, ep_id, monkeypatch, unique):
    """The embedded runtime's moto restarts empty: re-registration must keep the id (and queue)."""
    from lambdas.bootstrap import ensure_resources
    from lambdas.core import deps

    monkeypatch.setenv("SKYFN_TABLE_PREFIX", f"fresh{unique}")
    deps.dynamo.cache_clear()
    deps.settings.cache_clear()
    ensure_resources()
    status, body = api.call("POST", "/endpoints", {"name": "laptop"})
    assert status == 200 and body["endpoint_id"] == ep_id
    assert [e["endpoint_id"] for e in api.call("GET", "/endpoints")[1]["endpoints"]] == [ep_id]
    assert deps.dynamo().get_endpoint(ep_id)["name"] == "laptop"


def test_status_long_poll_without_cursor_answers_every_id(api, fn_id, ep_id):
    import threading

    from lambdas.results import apply_pack
    from skyfn.protocol.messages import ResultPack, TaskResult

    _, body = api.call("POST", "/tasks", {"endpoint_id": ep_id, "tasks": [{"function_id": fn_id, "payload": pack_args((i,), {})} for i in range(2)]})
    a, b = body["task_ids"]
    pack = ResultPack(endpoint_id=ep_id, results=[TaskResult(task_id=a, state="SUCCEEDED", result="json 3.11\n1")])
    threading.Timer(0.2, apply_pack, args=(pack,)).start()
    status, st = api.call("POST", "/tasks/status", {"task_ids": [a, b], "wait": 5})
    assert status == 200 and st["tasks"][a]["state"] == "SUCCEEDED" and st["tasks"][b]["state"] == "QUEUED"


def test_status_long_poll_longer_than_redis_pys_default_socket_timeout(api, fn_id, ep_id):
    """A long poll on a task nobody runs blocks on Redis in 5 s steps (redis-py 8's default
    socket timeout is also 5 s): it must answer 200 with the task still QUEUED, not a 5xx."""
    _, body = api.call("POST", "/tasks", {"endpoint_id": ep_id, "tasks": [{"function_id": fn_id,
                                                                          "payload": pack_args((1,), {})}]})
    tid = body["task_ids"][0]
    t0 = time.monotonic()
    status, st = api.call("POST", "/tasks/status", {"task_ids": [tid], "wait": 11})
    assert status == 200 and st["tasks"][tid]["state"] == "QUEUED"
    assert time.monotonic() - t0 >= 10.5


def test_integer_fields_take_json_numbers_with_a_zero_fraction(api, fn_id, ep_id):
    """The OpenAPI document (3.1: JSON Schema) says "integer", which 2.0 is; strictness
    still refuses 2.5, "2" and true. (test_fuzz found POST /tasks refusing most of the
    bodies its own document allows: every integer-valued float was a 422.)"""
    import json

    from lambdas.core import deps

    task = {"function_id": fn_id, "payload": pack_args((1,), {}), "max_retries": 1.0,
            "resources": {"cores": 2.0, "gpus": 0.0}, "data_locations": {ep_id: 1024.0, "other": 2 ** 53}}
    status, body = api.call("POST", "/tasks", {"endpoint_id": ep_id, "max_retries": 2.0, "tasks": [task]})
    assert status == 202, body
    (_, fields), = redis_client().xrange(f"tasks:{ep_id}")
    resources = json.loads(fields[b"b"])["tasks"][0]["resources"]
    assert resources == {"cores": 2, "gpus": 0} and all(type(v) is int for v in resources.values())

    bad = [({"max_retries": 2.5}, "max_retries"), ({"max_retries": "2"}, "max_retries"),
           ({"max_retries": True}, "max_retries"), ({"resources": {"cores": 2.5}}, "resources.cores"),
           ({"data_locations": {ep_id: 1.5}}, "data_locations"),
           ({"data_locations": {ep_id: 2 ** 53 + 2}}, "less than or equal to 9007199254740992")]
    for extra, named in bad:
        status, body = api.call("POST", "/tasks", {"endpoint_id": ep_id, "tasks": [{**task, **extra}]})
        assert status == 422 and named in body["message"], (extra, status, body)
    assert redis_client().xlen(f"tasks:{ep_id}") == 1
