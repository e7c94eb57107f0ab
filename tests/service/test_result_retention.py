"""How long results are kept, through the real handlers on a real redis-server and moto:
a status read that peeks leaves a finished task's result unretrieved while a plain read
starts the SKYFN_RESULT_TTL clock; once the real history flush has archived them, Redis
expires the one that was read SKYFN_RESULT_TTL after the read and keeps the others
SKYFN_UNRETRIEVED_TTL; a SUCCEEDED task read from the history says its result expired
(never a silent null), and the SDK turns that answer into ResultExpired."""
from __future__ import annotations

import re
import time

import pytest

from skyfn.protocol import pack_args, serialize_function
from skyfn.protocol.messages import ResultPack, TaskResult
from lambdas.adapters.redis_store.connection import redis_client

RESULT_TTL = 1.0
UNRETRIEVED_TTL = 7 * 86400.0


def inc(x):
    return x + 1


@pytest.fixture
def short_ttl(api, monkeypatch):
    from lambdas.core import deps

    monkeypatch.setenv("SKYFN_RESULT_TTL", str(RESULT_TTL))
    deps.reset()  # settings are read once: read them again with the short TTL
    yield api
    deps.reset()


@pytest.fixture
def finished(short_ttl):
    """Three tasks SUCCEEDED through the results path; (ids, when they finished)."""
    from lambdas.results import apply_pack

    api = short_ttl
    _, f = api.call("POST", "/functions", {"function": serialize_function(inc)})
    _, e = api.call("POST", "/endpoints", {"name": "hpc"})
    _, s = api.call("POST", "/tasks", {"endpoint_id": e["endpoint_id"], "tasks": [
        {"function_id": f["function_id"], "payload": pack_args((i,), {})} for i in range(3)]})
    ids = s["task_ids"]
    done = time.time()
    apply_pack(ResultPack(endpoint_id=e["endpoint_id"], results=[
        TaskResult(task_id=t, state="SUCCEEDED", result=f"json 3.11\n{i + 1}") for i, t in enumerate(ids)]))
    return ids, done


def status(api, ids, **extra):
    code, body = api.call("POST", "/tasks/status", {"task_ids": ids, **extra})
    assert code == 200, body
    return body["tasks"]


def kept(task_id):
    """(retrieved-at mark, when Redis expires the record: None while it has no expiry)."""
    from lambdas.core import deps

    r = redis_client()
    at = r.pexpiretime(f"t:{task_id}")
    return r.hget(f"t:{task_id}", "rt"), (at / 1000 if at > 0 else None)


def test_peek_reads_leave_the_result_unread_and_only_the_read_one_expires_after_archival(short_ttl, finished):
    from lambdas.core import deps
    from lambdas.history import flush

    api = short_ttl
    (peeked, read, untouched), done = finished
    for _ in range(2):
        got = status(api, [peeked], peek=True)
        assert got[peeked]["state"] == "SUCCEEDED" and got[peeked]["result"] == "json 3.11\n1"
    lean = status(api, [peeked], peek=True, results=False, include_events=True)[peeked]
    assert lean["state"] == "SUCCEEDED" and "result" not in lean and lean["events"][-1][0] == "STORED"
    assert kept(peeked) == (None, None)

    before = time.time()
    assert status(api, [read])[read]["result"] == "json 3.11\n2"
    rt, expires = kept(read)
    assert rt is not None and before <= float(rt) <= time.time()
    assert expires is None  # not archived yet: nothing leaves Redis before the durable history has it
    status(api, [read], peek=True)  # a later peek changes nothing
    assert kept(read) == (rt, None)

    archived = time.time()
    assert flush()["tasks"] == 3
    assert kept(read) == (rt, pytest.approx(float(rt) + RESULT_TTL, abs=0.01))
    assert kept(peeked) == (None, pytest.approx(archived + UNRETRIEVED_TTL, abs=5))
    time.sleep(RESULT_TTL + 0.2)
    r = redis_client()
    assert not r.exists(f"t:{read}") and r.exists(f"t:{peeked}") and r.exists(f"t:{untouched}")

    got = status(api, [peeked, read, untouched], peek=True)
    assert got[peeked]["result"] == "json 3.11\n1" and got[untouched]["result"] == "json 3.11\n3"
    gone = got[read]
    assert gone["state"] == "SUCCEEDED" and "result" not in gone
    assert gone["result_expired"]["finished"] == pytest.approx(done, abs=5)
    assert {k: v for k, v in gone["result_expired"].items() if k != "finished"} == {
        "result_ttl": RESULT_TTL, "unretrieved_ttl": UNRETRIEVED_TTL}
    assert "result_expired" not in got[peeked]
    code, info = api.call("GET", f"/tasks/{read}")
    assert code == 200 and info["state"] == "SUCCEEDED" and info.get("result") is None
    assert info["result_expired"] == gone["result_expired"]


def test_the_sdk_raises_result_expired_on_the_service_answer(short_ttl, finished):
    from lambdas.core import deps
    from lambdas.history import flush
    from skyfn import ResultExpired
    from skyfn.client import task_outcome

    api = short_ttl
    ids, done = finished
    status(api, ids)
    flush()
    time.sleep(RESULT_TTL + 0.2)
    assert not redis_client().exists(f"t:{ids[0]}")
    answer = status(api, ids)[ids[0]]
    ok, exc = task_outcome(ids[0], answer)
    assert not ok and isinstance(exc, ResultExpired) and isinstance(exc, LookupError)
    assert (exc.task_id, exc.result_ttl, exc.unretrieved_ttl) == (ids[0], RESULT_TTL, UNRETRIEVED_TTL)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(exc.finished))
    message = re.sub(r"\(\d+ s ago\)", "(N s ago)", str(exc))
    assert message == (
        f"task {ids[0]} SUCCEEDED at {stamp} (N s ago), but its result is no longer kept: the service keeps a "
        "result SKYFN_RESULT_TTL=1 s after it is first read (a status read, get_result, an Executor future, or a "
        "push delivered to one of your connections), or SKYFN_UNRETRIEVED_TTL=604800 s (7 days) if it is never "
        "read. Collect results sooner after they finish, or have the function return large or long-lived results "
        "by reference (skyfn.data.default_store().ref(value, ttl=...), or S3) and keep the ref.")


@pytest.mark.parametrize("extra", [{"peek": 1}, {"peek": "true"}, {"peek": None}, {"results": 0},
                                   {"results": "false"}])
def test_peek_and_results_are_booleans(api, extra):
    code, body = api.call("POST", "/tasks/status", {"task_ids": ["a"], **extra})
    assert code == 422, body
    assert next(iter(extra)) in body["message"] or next(iter(extra)) in str(body.get("details"))


def test_failed_tasks_read_from_the_history_are_not_expired_results(short_ttl):
    """Only a success loses something: a failure's error and reason are in the history."""
    from lambdas.core import deps
    from lambdas.history import flush
    from lambdas.results import apply_pack

    api = short_ttl
    _, f = api.call("POST", "/functions", {"function": serialize_function(inc)})
    _, e = api.call("POST", "/endpoints", {"name": "hpc"})
    _, s = api.call("POST", "/tasks", {"endpoint_id": e["endpoint_id"], "tasks": [
        {"function_id": f["function_id"], "payload": pack_args((0,), {})}]})
    (tid,) = s["task_ids"]
    apply_pack(ResultPack(endpoint_id=e["endpoint_id"], results=[
        TaskResult(task_id=tid, state="FAILED", reason="the node went away")]))
    status(api, [tid])
    flush()
    time.sleep(RESULT_TTL + 0.2)
    assert not redis_client().exists(f"t:{tid}")
    got = status(api, [tid])[tid]
    assert got["state"] == "FAILED" and got["reason"] == "the node went away" and "result_expired" not in got


def _get(api, task_id, query=""):
    """GET /tasks/{id}[?query] as API Gateway delivers it (the query string parsed)."""
    import json
    from urllib.parse import parse_qs

    from lambdas.api import handler
    from tests.service.conftest import Context, api_event

    event = api_event("GET", f"/tasks/{task_id}", None, api.token)
    if query:
        multi = parse_qs(query, keep_blank_values=True)
        event["queryStringParameters"] = {k: v[-1] for k, v in multi.items()}
        event["multiValueQueryStringParameters"] = multi
    resp = handler(event, Context())
    return resp["statusCode"], json.loads(resp["body"])


def test_get_task_with_peek_leaves_the_result_past_the_retention_window(short_ttl, finished):
    from lambdas.core import deps
    from lambdas.history import flush

    api = short_ttl
    (peeked, read, defaulted), done = finished
    for _ in range(2):
        code, info = _get(api, peeked, "peek=true")
        assert code == 200 and info["state"] == "SUCCEEDED" and info["result"] == "json 3.11\n1"
    assert kept(peeked) == (None, None)

    before = time.time()
    code, info = _get(api, read, "peek=false")
    assert code == 200 and info["result"] == "json 3.11\n2"
    code, info = _get(api, defaulted)  # no peek: a plain read, as before
    assert code == 200 and info["result"] == "json 3.11\n3"
    for task_id in (read, defaulted):
        rt, expires = kept(task_id)
        assert rt is not None and before <= float(rt) <= time.time() and expires is None

    assert flush()["tasks"] == 3
    for task_id in (read, defaulted):
        rt, expires = kept(task_id)
        assert expires == pytest.approx(float(rt) + RESULT_TTL, abs=0.01)
    time.sleep(RESULT_TTL + 0.2)  # past the retention window of a read result
    assert [redis_client().exists(f"t:{t}") for t in (peeked, read, defaulted)] == [1, 0, 0]
    code, info = _get(api, peeked)
    assert code == 200 and info["result"] == "json 3.11\n1" and "result_expired" not in info
    for task_id in (read, defaulted):
        code, info = _get(api, task_id, "peek=true")
        assert code == 200 and info["state"] == "SUCCEEDED" and info.get("result") is None
        assert info["result_expired"]["result_ttl"] == RESULT_TTL


@pytest.mark.parametrize("query", ["peek=1", "peek=yes", "peek=True", "peek=", "peek=truee"])
def test_get_task_peek_is_true_or_false(short_ttl, finished, query):
    api = short_ttl
    (task_id, *_), _ = finished
    code, body = _get(api, task_id, query)
    assert code == 422, body
    assert body["error"] == "invalid_request"
    assert "peek" in body["message"] and "'true'" in body["message"] and "'false'" in body["message"], body
    assert kept(task_id)[0] is None  # a refused read marks nothing


def test_the_sdk_get_task_peeks_through_the_gateway(short_ttl, finished):
    from infra.local.standins.gateway import Gateway
    from lambdas.api import handler
    from skyfn import Client

    api = short_ttl
    (peeked, read, _), _ = finished
    with Gateway(handler, concurrency=1) as gateway:
        client = Client(gateway.url, api.token, retries=0)
        try:
            assert client.get_task(peeked, peek=True)["result"] == "json 3.11\n1"
            assert kept(peeked)[0] is None
            assert client.get_task(read)["result"] == "json 3.11\n2"  # the default still retrieves
            assert kept(read)[0] is not None
            with pytest.raises(TypeError, match="peek must be True or False"):
                client.get_task(peeked, peek="false")
        finally:
            client.close()
