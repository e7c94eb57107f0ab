"""Task graphs in the service (lambdas/core/tasks/dataflow.py): a task with inputs WAITS, is
released with its inputs' results in an envelope when the last one SUCCEEDED, and ends with
them when one fails or is cancelled -- against a real Redis, through the API handler and the
results function, the packs read back from the endpoint's real queue."""
from __future__ import annotations

import json
import time

import pytest

from lambdas.core import deps
from lambdas.results import apply_pack
from skyfn.protocol import pack_args, serialize_function
from skyfn.protocol.dataflow import ENVELOPE_HEADER, Input, dependency_failure, open_envelope
from skyfn.protocol.messages import ResultPack, TaskPack, TaskResult
from skyfn.protocol.serialize import serialize
from tests.service.graph_parts import add, dependent, info, plain, submit
from lambdas.adapters.redis_store.connection import redis_client



@pytest.fixture
def world(api):
    status, fn = api.call("POST", "/functions", {"function": serialize_function(add), "name": "add"})
    assert status == 201
    status, ep = api.call("POST", "/endpoints", {"name": "cluster"})
    assert status in (200, 201)
    return api, fn["function_id"], ep


def sent(ep: dict) -> dict[str, dict]:
    """task id -> its spec, of every pack on the endpoint's queue."""
    out = {}
    for _, fields in redis_client().xrange(ep["task_queue"]["name"]):
        for t in TaskPack.model_validate_json(fields[b"b"]).tasks:
            out[t.task_id] = t.model_dump()
    return out





def finish(ep, task_id: str, state: str = "SUCCEEDED", value=None, error: str | None = None, reason=None):
    result = serialize(value) if state == "SUCCEEDED" else None
    apply_pack(ResultPack(endpoint_id=ep["endpoint_id"], results=[
        TaskResult(task_id=task_id, state=state, result=result, error=error, reason=reason)]))



def test_a_chain_waits_then_runs_with_the_inputs_result(world):
    api, fid, ep = world
    (a,) = submit(api, fid, ep, plain(1, 2))
    (b,) = submit(api, fid, ep, dependent([a], Input(0), 10))
    got = info(api, b)
    assert got["state"] == "WAITING" and [e[0] for e in got["events"]] == ["CREATED", "WAITING"]
    assert set(sent(ep)) == {a}  # the dependent is not sent before its input finished

    finish(ep, a, value=3)
    got = info(api, b)
    assert got["state"] == "QUEUED" and [e[0] for e in got["events"]] == ["CREATED", "WAITING", "QUEUED"]
    spec = sent(ep)[b]
    assert spec["payload"].startswith(ENVELOPE_HEADER)
    env = open_envelope(spec["payload"])
    assert env["args"] == pack_args((Input(0), 10), {})
    assert env["inputs"] == [{"task_id": a, "result": serialize(3)}]
    # the pack is sent once and its record keeps no copy of it
    assert redis_client().hget(f"t:{b}", "wp") is None
    assert redis_client().llen("release") == 0 and redis_client().zcard("releasing") == 0


def test_inputs_in_the_same_request_and_a_diamond(world):
    api, fid, ep = world
    a, b, c, d = submit(api, fid, ep, plain(1), dependent(["#0"], Input(0), 1), dependent(["#0"], Input(0), 2),
                        dependent(["#1", "#2"], Input(0), Input(1)))
    assert [info(api, t)["state"] for t in (a, b, c, d)] == ["QUEUED", "WAITING", "WAITING", "WAITING"]
    finish(ep, a, value=1)
    assert info(api, b)["state"] == info(api, c)["state"] == "QUEUED" and info(api, d)["state"] == "WAITING"
    finish(ep, b, value=2)
    assert info(api, d)["state"] == "WAITING"  # one of its two inputs is still to come
    finish(ep, c, value=3)
    assert info(api, d)["state"] == "QUEUED"
    env = open_envelope(sent(ep)[d]["payload"])
    assert [(e["task_id"], e["result"]) for e in env["inputs"]] == [(b, serialize(2)), (c, serialize(3))]


def test_inputs_already_succeeded_release_at_once(world):
    api, fid, ep = world
    (a,) = submit(api, fid, ep, plain(1))
    finish(ep, a, value=5)
    (b,) = submit(api, fid, ep, dependent([a, a], Input(0), Input(1)))
    assert info(api, b)["state"] == "QUEUED"
    assert [e["result"] for e in open_envelope(sent(ep)[b]["payload"])["inputs"]] == [serialize(5)] * 2


def test_a_failed_input_fails_its_dependents_transitively(world):
    api, fid, ep = world
    a, b, c = submit(api, fid, ep, plain(1), dependent(["#0"], Input(0)), dependent(["#1"], Input(0)))
    finish(ep, a, "FAILED", error="the-error-buffer", reason="ZeroDivisionError: division by zero")
    for tid, failed_input in ((b, a), (c, b)):
        got = info(api, tid)
        assert got["state"] == "FAILED", got
        assert dependency_failure(got["reason"]) == (failed_input, "FAILED")
        assert got["error"] == "the-error-buffer"  # the root's own exception, for DependencyFailed.cause
    assert "ZeroDivisionError" in info(api, b)["reason"]
    assert set(sent(ep)) == {a}  # neither ran


def test_an_input_failed_before_submission_fails_the_dependent_at_once(world):
    api, fid, ep = world
    (a,) = submit(api, fid, ep, plain(1))
    finish(ep, a, "TIMED_OUT", reason="exceeded its walltime of 1 s")
    (b,) = submit(api, fid, ep, dependent([a], Input(0)))
    got = info(api, b)
    assert got["state"] == "FAILED" and dependency_failure(got["reason"]) == (a, "TIMED_OUT")
    assert [e[0] for e in got["events"]] == ["CREATED", "WAITING", "FAILED"]


def test_cancelling_a_task_cancels_its_dependents(world):
    api, fid, ep = world
    a, b, c = submit(api, fid, ep, plain(1), dependent(["#0"], Input(0)), dependent(["#1"], Input(0)))
    status, _ = api.call("DELETE", f"/tasks/{a}")
    assert status == 200
    for tid, of in ((b, a), (c, b)):
        got = info(api, tid)
        assert got["state"] == "CANCELLED" and got["reason"] == f"cancelled: input task {of} was cancelled"


def test_a_cancelled_dependent_never_runs_and_frees_its_inputs(world):
    api, fid, ep = world
    a, b = submit(api, fid, ep, plain(1), dependent(["#0"], Input(0)))
    assert redis_client().hget(f"t:{a}", "pn") == b"1"
    status, _ = api.call("DELETE", f"/tasks/{b}")
    assert status == 200 and info(api, b)["state"] == "CANCELLED"
    assert redis_client().hget(f"t:{a}", "pn") is None
    finish(ep, a, value=1)
    assert info(api, b)["state"] == "CANCELLED" and set(sent(ep)) == {a}


def test_inputs_of_other_users_unknown_or_malformed_are_refused(world, other_api):
    api, fid, ep = world
    (a,) = submit(api, fid, ep, plain(1))
    status, fn = other_api.call("POST", "/functions", {"function": serialize_function(add)})
    status, oep = other_api.call("POST", "/endpoints", {"name": "theirs"})
    before = set(redis_client().keys())
    status, body = other_api.call("POST", "/tasks", {"endpoint_id": oep["endpoint_id"], "tasks": [
        {"function_id": fn["function_id"], **dependent([a], Input(0))}]})
    assert status == 403 and body["error"] == "not_your_task" and a in body["message"]
    unknown = "6a0e0a57-8d6a-4e43-9a8c-4b2a1e1f0000"
    for inputs, code, status_wanted in (([unknown], "not_found", 404), (["#0"], "invalid_input", 400),
                                        (["#7"], "invalid_input", 400), (["nope"], "invalid_input", 400)):
        status, body = api.call("POST", "/tasks", {"endpoint_id": ep["endpoint_id"], "tasks": [
            {"function_id": fid, **dependent(inputs, Input(0))}]})
        assert (status, body["error"]) == (status_wanted, code), body
    assert {k for k in set(redis_client().keys()) - before if not k.startswith((b"rl:", b"claims:"))} == set()
    assert info(api, a)["state"] == "QUEUED"


def test_an_inputs_record_outlives_its_read_while_a_dependent_waits(world):
    api, fid, ep = world
    store = deps.store()
    a, b, c = submit(api, fid, ep, plain(1), plain(2), dependent(["#0", "#1"], Input(0), Input(1)))
    finish(ep, a, value=1)
    api.call("GET", f"/tasks/{a}")  # read: would expire result_ttl after archival
    store.mark_archived([a])
    r = redis_client()
    assert r.ttl(f"t:{a}") == -1  # pinned by c, which has yet to read it
    finish(ep, b, value=2)
    assert info(api, c)["state"] == "QUEUED"
    assert 0 < r.ttl(f"t:{a}") <= store.result_ttl  # unpinned at the release: the usual expiry


def test_a_release_whose_sender_died_is_offered_again(world):
    api, fid, ep = world
    store = deps.store()
    (a,) = submit(api, fid, ep, plain(1))
    (b,) = submit(api, fid, ep, dependent([a], Input(0)))
    r = redis_client()
    store.finish([[a, "SUCCEEDED", serialize(1), None, None, ""]])  # not through the results function
    store.settle()
    taken = store.take_released(10, hold=0.05)  # a sender takes it, then dies before sending
    assert [t.task_id for t in taken] == [b] and r.zcard("releasing") == 1
    time.sleep(0.1)
    from lambdas.core.tasks import dataflow

    report = dataflow.sweep(store)
    assert report["requeued_releases"] == 1 and report["sent"] == 1
    assert b in sent(ep) and r.zcard("releasing") == 0


def test_a_fan_in_of_10000_inputs(world):
    api, fid, ep = world
    n = 10_000
    ids = submit(api, fid, ep, *[plain(i) for i in range(n)], dependent([f"#{i}" for i in range(n)],
                                                                         *[Input(i) for i in range(n)]))
    sink = ids[-1]
    assert info(api, sink)["state"] == "WAITING"
    apply_pack(ResultPack(endpoint_id=ep["endpoint_id"], results=[
        TaskResult(task_id=t, state="SUCCEEDED", result=serialize(i)) for i, t in enumerate(ids[:-1])]))
    assert info(api, sink)["state"] == "QUEUED"
    env = open_envelope(sent(ep)[sink]["payload"])
    assert [e["task_id"] for e in env["inputs"]] == ids[:-1]
    assert json.loads(env["inputs"][-1]["result"].split("\n", 1)[1]) == n - 1


def test_tasks_with_inputs_are_never_answered_from_the_memo_cache(world):
    api, fid, ep = world
    a, b = submit(api, fid, ep, plain(1), plain(2))
    finish(ep, a, value=1)
    finish(ep, b, value=2)
    body = {"endpoint_id": ep["endpoint_id"], "memoize": True}
    status, first = api.call("POST", "/tasks", {**body, "tasks": [{"function_id": fid, **dependent([a], Input(0))}]})
    finish(ep, first["task_ids"][0], value=1)
    # the same payload (one placeholder) with another input: a memo key of the payload would answer 1
    status, second = api.call("POST", "/tasks", {**body, "tasks": [{"function_id": fid, **dependent([b], Input(0))}]})
    assert status == 202
    got = info(api, second["task_ids"][0])
    assert got["state"] == "QUEUED" and "MEMO_HIT" not in [e[0] for e in got["events"]]
