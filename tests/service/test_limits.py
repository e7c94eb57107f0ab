"""Limits with clear errors (request size, batch size, argument, result and function size;
rate limits are in test_auth.py), and large arguments and results through S3 instead of a
failure (lambdas/core/tasks/blobs.py, skyfn/protocol/blobs.py), through the real API handler on
a real redis-server and moto's S3."""
from __future__ import annotations

import json

import boto3
import pytest

from lambdas.auth import mint_token
from lambdas.core import deps
from skyfn.protocol import blobs, pack_args, serialize, serialize_function
from skyfn.protocol.api import MAX_BATCH, MAX_FUNCTION_BYTES, MAX_PAYLOAD_BYTES, MAX_REQUEST_BYTES
from skyfn.protocol.queues import open_queue
from tests.service.conftest import SECRET, Api


def inc(x):
    return x + 1


@pytest.fixture
def fn_ep(api):
    _, fn = api.call("POST", "/functions", {"function": serialize_function(inc)})
    _, ep = api.call("POST", "/endpoints", {"name": "site"})
    return fn["function_id"], ep


def test_request_body_over_the_limit_is_413_with_both_sizes(api):
    raw = json.dumps({"task_ids": ["x" * 60] * (MAX_REQUEST_BYTES // 60 + 10)})
    status, body = api.call("POST", "/tasks/status", raw=raw)
    assert status == 413 and body["error"] == "payload_too_large"
    assert f"{len(raw)} bytes" in body["message"] and f"limit of {MAX_REQUEST_BYTES} bytes" in body["message"]


def test_batch_over_the_limit_is_422_with_the_count(api, fn_ep):
    fid, ep = fn_ep
    task = {"function_id": fid, "payload": "json 3.11\n[[1],{}]"}
    status, body = api.call("POST", "/tasks", {"endpoint_id": ep["endpoint_id"], "tasks": [task] * (MAX_BATCH + 1)})
    assert status == 422 and f"at most {MAX_BATCH} items" in body["message"] and str(MAX_BATCH + 1) in body["message"]


def test_function_over_the_limit_is_422_with_its_size(api):
    big = "x" * (MAX_FUNCTION_BYTES + 5)
    status, body = api.call("POST", "/functions", {"function": big})
    assert status == 422
    assert f"at most {MAX_FUNCTION_BYTES} characters, got {len(big)}" in body["message"]


def test_inline_payload_over_the_limit_is_422_pointing_to_s3(api, fn_ep):
    fid, ep = fn_ep
    payload = "x" * (MAX_PAYLOAD_BYTES + 1)
    status, body = api.call("POST", "/tasks", {"endpoint_id": ep["endpoint_id"],
                                               "tasks": [{"function_id": fid, "payload": payload}]})
    assert status == 422
    assert f"at most {MAX_PAYLOAD_BYTES} characters, got {len(payload)}" in body["message"] and "S3" in body["message"]


def test_blobs_need_a_bucket(api, monkeypatch):
    monkeypatch.delenv("SKYFN_BUCKET", raising=False)
    deps.reset()
    status, body = api.call("POST", "/blobs", {"size": 10})
    assert status == 422 and body["error"] == "blobs_disabled" and "SKYFN_BUCKET" in body["message"]


# --- through S3 ---------------------------------------------------------------------------
@pytest.fixture
def bucket(service_env, aws_endpoint, monkeypatch, unique):
    name = f"blobs-{unique}"
    boto3.client("s3").create_bucket(Bucket=name)
    monkeypatch.setenv("SKYFN_BUCKET", name)
    deps.reset()
    return name


def test_large_argument_travels_through_s3_to_the_agent(api, fn_ep, bucket):
    fid, ep = fn_ep
    payload = pack_args(("z" * (3 << 20),), {})  # 3 MiB: three times the inline ceiling
    status, form = api.call("POST", "/blobs", {"size": len(payload)})
    assert status == 201 and form["max_bytes"] == len(payload) and form["key"].startswith("args/")
    key = blobs.upload(form, payload.encode())
    status, sub = api.call("POST", "/tasks", {"endpoint_id": ep["endpoint_id"],
                                              "tasks": [{"function_id": fid, "payload": blobs.make_ref(key)}]})
    assert status == 202
    [msg] = open_queue(ep["task_queue"], consumer="agent").receive(max_messages=1)  # as the agent
    pack = json.loads(msg.body)
    [spec] = pack["tasks"]
    assert spec["payload"] == blobs.make_ref(key) and len(msg.body) < 64 << 10  # the queue carries no megabytes
    assert blobs.download(spec["payload_url"]) == payload  # the agent fetches it, no AWS credentials needed
    assert pack["result_upload"]["prefix"] == f"results/{ep['endpoint_id']}/"


def test_a_reference_to_someone_elses_upload_is_refused(api, fn_ep, bucket):
    fid, ep = fn_ep
    mallory = Api(mint_token(SECRET, "mallory"))
    _, form = mallory.call("POST", "/blobs", {"size": 10})
    status, body = api.call("POST", "/tasks", {"endpoint_id": ep["endpoint_id"], "tasks": [
        {"function_id": fid, "payload": blobs.make_ref(form["key"])}]})
    assert status == 422 and body["error"] == "invalid_blob" and "not an upload of yours" in body["message"]


def test_large_result_is_stored_by_the_agent_and_fetched_by_the_submitter(api, other_api, fn_ep, bucket):
    from lambdas.results import apply_pack
    from skyfn.protocol.messages import ResultPack, TaskResult

    fid, ep = fn_ep
    _, sub = api.call("POST", "/tasks", {"endpoint_id": ep["endpoint_id"], "tasks": [
        {"function_id": fid, "payload": pack_args((1,), {})} for _ in range(2)]})
    good, bad = sub["task_ids"]
    [msg] = open_queue(ep["task_queue"], consumer="agent").receive(max_messages=1)
    form = json.loads(msg.body)["result_upload"]
    result = serialize("r" * (2 << 20))
    from endpoint_agent.service.blob_results import offload

    stored, ref = offload(form, good, result)  # the agent's own upload path
    assert stored and ref == blobs.make_ref(f"results/{ep['endpoint_id']}/{good}")
    elsewhere = blobs.make_ref(f"results/{ep['endpoint_id']}/{good}")  # bad claims good's object
    apply_pack(ResultPack(endpoint_id=ep["endpoint_id"], results=[
        TaskResult(task_id=good, state="SUCCEEDED", result=ref),
        TaskResult(task_id=bad, state="SUCCEEDED", result=elsewhere)]))
    status, st = api.call("POST", "/tasks/status", {"task_ids": [good, bad]})
    assert st["tasks"][good]["state"] == "SUCCEEDED" and st["tasks"][good]["result"] == ref
    assert blobs.download(st["tasks"][good]["result_url"]) == result
    assert st["tasks"][bad]["state"] == "FAILED" and "not at this task's place" in st["tasks"][bad]["reason"]
    assert other_api.call("GET", f"/tasks/{good}")[0] == 404  # the URL is handed to the submitter only


def test_small_results_stay_inline_and_no_form_means_inline(fn_ep):
    from endpoint_agent.service.blob_results import offload

    assert offload({"prefix": "results/x/", "url": "http://unused", "fields": {}}, "t", "json 3.11\n1") == \
        (True, "json 3.11\n1")
    big = "x" * (blobs.INLINE_BYTES + 1)
    assert offload(None, "t", big) == (True, big)
