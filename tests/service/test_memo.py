"""Memoization at the service: a repeat call is answered from the owner's cache without a
dispatch (nothing reaches the endpoint's queue), its events say MEMO_HIT, and the key is
(function code, container, arguments) -- any change misses; failures are not cached."""
from __future__ import annotations

import json

import boto3
import pytest

from lambdas.core import deps
from lambdas.results import apply_pack
from skyfn.protocol import blobs, pack_args, serialize, serialize_function
from skyfn.protocol.messages import ResultPack, TaskResult
from skyfn.protocol.queues import open_queue
from lambdas.adapters.redis_store.connection import redis_client


def square(x):
    return x * x


def square_v2(x):
    return x * x + 0  # same behaviour, other code: a different function as far as the cache goes


@pytest.fixture
def ep(api):
    status, body = api.call("POST", "/endpoints", {"name": "memo-ep"})
    assert status == 201
    return body


def register(api, fn, **extra):
    status, body = api.call("POST", "/functions", {"function": serialize_function(fn), "name": fn.__name__, **extra})
    assert status == 201, body
    return body["function_id"]


def submit(api, ep, fid, arg, **extra):
    task = {"function_id": fid, "payload": pack_args((arg,), {})}
    task.update(extra.pop("task", {}))
    status, body = api.call("POST", "/tasks", {"endpoint_id": ep["endpoint_id"], "tasks": [task], **extra})
    assert status == 202, body
    return body["task_ids"][0]


def finish(ep, tid, value, state="SUCCEEDED"):
    result = serialize(value) if state == "SUCCEEDED" else None
    apply_pack(ResultPack(endpoint_id=ep["endpoint_id"], results=[
        TaskResult(task_id=tid, state=state, result=result, reason=None if result else "boom")]))


def info(api, tid):
    status, body = api.call("GET", f"/tasks/{tid}")
    assert status == 200
    return body


def queued_packs(ep) -> int:
    return redis_client().xlen(ep["task_queue"]["name"])


def test_repeat_call_is_answered_from_the_cache_without_a_dispatch(api, ep):
    fid = register(api, square, memoize=True)
    first = submit(api, ep, fid, 7)
    assert queued_packs(ep) == 1
    finish(ep, first, 49)
    again = submit(api, ep, fid, 7)
    assert queued_packs(ep) == 1  # nothing new reached the endpoint
    hit = info(api, again)
    assert hit["state"] == "SUCCEEDED" and hit["result"] == serialize(49)
    assert [e[0] for e in hit["events"]] == ["CREATED", "MEMO_HIT", "SUCCEEDED", "STORED"]
    status, st = api.call("POST", "/tasks/status", {"task_ids": [again], "wait": 1.0})
    assert status == 200 and st["tasks"][again]["state"] == "SUCCEEDED"
    other_arg = submit(api, ep, fid, 8)  # other arguments: a miss, dispatched
    assert info(api, other_arg)["state"] == "QUEUED" and queued_packs(ep) == 2


def test_changing_the_code_misses_and_the_same_code_hits_under_another_id(api, ep):
    fid = register(api, square, memoize=True)
    finish(ep, submit(api, ep, fid, 3), 9)
    assert info(api, submit(api, ep, register(api, square_v2, memoize=True), 3))["state"] == "QUEUED"
    same_code = register(api, square, memoize=True)
    assert same_code != fid
    assert info(api, submit(api, ep, same_code, 3))["state"] == "SUCCEEDED"


def test_container_is_part_of_the_key(api, ep):
    fid = register(api, square, memoize=True)
    finish(ep, submit(api, ep, fid, 4), 16)
    assert info(api, submit(api, ep, fid, 4, task={"container": "sci"}))["state"] == "QUEUED"
    assert info(api, submit(api, ep, fid, 4))["state"] == "SUCCEEDED"


def test_opt_in_per_submission_and_opt_out_per_task(api, ep):
    fid = register(api, square)  # not memoized by default
    finish(ep, submit(api, ep, fid, 5), 25)
    assert info(api, submit(api, ep, fid, 5, memoize=True))["state"] == "QUEUED"  # the first run cached nothing
    cached = submit(api, ep, fid, 6, memoize=True)
    finish(ep, cached, 36)
    assert info(api, submit(api, ep, fid, 6, memoize=True))["state"] == "SUCCEEDED"
    assert info(api, submit(api, ep, fid, 6))["state"] == "QUEUED"  # the function's default: off
    assert info(api, submit(api, ep, fid, 6, memoize=True, task={"memoize": False}))["state"] == "QUEUED"


def test_failures_are_not_cached(api, ep):
    fid = register(api, square, memoize=True)
    finish(ep, submit(api, ep, fid, 2), None, state="FAILED")
    assert info(api, submit(api, ep, fid, 2))["state"] == "QUEUED"


def test_the_cache_is_per_owner(api, other_api, ep):
    fid = register(api, square, memoize=True)
    finish(ep, submit(api, ep, fid, 11), 121)
    status, theirs = other_api.call("POST", "/endpoints", {"name": "their-ep"})
    their_fid = register(other_api, square, memoize=True)  # the same code and arguments
    tid = submit(other_api, theirs, their_fid, 11)
    status, body = other_api.call("GET", f"/tasks/{tid}")
    assert body["state"] == "QUEUED"  # never answered from alice's result


def test_a_keyed_retry_of_a_submission_with_hits_creates_nothing_twice(api, ep):
    fid = register(api, square, memoize=True)
    finish(ep, submit(api, ep, fid, 1), 1)
    req = {"endpoint_id": ep["endpoint_id"], "idempotency_key": "memo-retry",
           "tasks": [{"function_id": fid, "payload": pack_args((x,), {})} for x in (1, 2)]}
    s1, b1 = api.call("POST", "/tasks", req)
    s2, b2 = api.call("POST", "/tasks", req)
    assert (s1, s2) == (202, 200) and b1["task_ids"] == b2["task_ids"]
    hit, miss = b1["task_ids"]
    assert info(api, hit)["state"] == "SUCCEEDED" and info(api, miss)["state"] == "QUEUED"
    assert queued_packs(ep) == 2  # the first call's pack and the miss's, once


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_memoize_must_be_a_boolean(api, ep, bad):
    fid = register(api, square)
    status, body = api.call("POST", "/tasks", {"endpoint_id": ep["endpoint_id"], "memoize": bad,
                                               "tasks": [{"function_id": fid, "payload": pack_args((1,), {})}]})
    if bad is None:  # null means "the function's setting"
        assert status == 202
    else:
        assert status == 422 and "memoize" in json.dumps(body)
    status, body = api.call("POST", "/functions", {"function": serialize_function(square), "memoize": "on"})
    assert status == 422 and "memoize" in json.dumps(body)


@pytest.fixture
def bucket(service_env, aws_endpoint, monkeypatch, unique):
    name = f"memo-{unique}"
    boto3.client("s3").create_bucket(Bucket=name)
    monkeypatch.setenv("SKYFN_BUCKET", name)
    deps.reset()
    return name


def test_large_results_are_memoized_by_reference(api, ep, bucket):
    from endpoint_agent.service.blob_results import offload

    fid = register(api, square, memoize=True)
    first = submit(api, ep, fid, "big")
    [msg] = open_queue(ep["task_queue"], consumer="agent").receive(max_messages=1)
    result = serialize("r" * (2 << 20))
    stored, ref = offload(json.loads(msg.body)["result_upload"], first, result)
    assert stored
    apply_pack(ResultPack(endpoint_id=ep["endpoint_id"], results=[TaskResult(task_id=first, state="SUCCEEDED",
                                                                               result=ref)]))
    again = submit(api, ep, fid, "big")
    hit = info(api, again)
    assert hit["state"] == "SUCCEEDED" and hit["result"] == ref  # the reference, not a copy
    assert f"results/{ep['endpoint_id']}/{first}" in hit["result_url"]
    assert blobs.download(hit["result_url"]) == result
