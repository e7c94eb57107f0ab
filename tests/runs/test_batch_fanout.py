"""The batch-fanout state machine under moto's Step Functions with the real step
handlers: a batch submitted through POST /batches is staged in S3, routed chunk by chunk
by the Distributed Map, run by the local endpoint, and the run completes when every task
has a result. Per-task failures are counted, not fatal; an offline endpoint's chunks are
reported and the run ends in BatchNotRouted."""
from __future__ import annotations

import time

from skyfn.runs import submit_batch
from tests.runs import fns


def test_batch_of_200_tasks_runs_to_completion(client, endpoint):
    batch = submit_batch(client, fns.square, [(i,) for i in range(200)], "local", poll_seconds=1)
    assert len(batch.task_ids) == 200 and len(set(batch.task_ids)) == 200
    report = batch.wait(timeout=120)
    assert report["run_state"] == "SUCCEEDED", report
    assert report["state"] == "COMPLETE"
    assert report["total"] == 200 and report["routed"] == 200 and report["pending"] == 0
    assert report["counts"] == {"SUCCEEDED": 200}
    assert report["failed_chunks"] == []
    results = client.get_batch_result(batch.task_ids)
    assert [results[t]["result"] for t in batch.task_ids] == [i * i for i in range(200)]
    assert batch.result()["counts"] == {"SUCCEEDED": 200}   # the execution's output is the summary
    # the staged chunks and the manifest are deleted once the batch is complete
    from infra.local.state import StateDir
    from tests.e2e.conftest import service_s3

    s3, bucket = service_s3(StateDir.at().home)
    assert s3.list_objects_v2(Bucket=bucket, Prefix=f"batches/{batch.batch_id}/").get("KeyCount") == 0


def test_failed_tasks_are_counted_not_fatal(client, endpoint):
    batch = submit_batch(client, fns.square_or_fail, [(i,) for i in range(50)], "local", max_retries=0,
                         poll_seconds=1)
    report = batch.wait(timeout=120)
    assert report["run_state"] == "SUCCEEDED" and report["state"] == "COMPLETE", report
    assert report["counts"] == {"SUCCEEDED": 45, "FAILED": 5}
    results = client.get_batch_result(batch.task_ids)
    failed = [i for i, t in enumerate(batch.task_ids) if results[t]["state"] == "FAILED"]
    assert failed == [0, 10, 20, 30, 40]
    assert "no multiples of ten: 20" in str(results[batch.task_ids[20]]["exception"])


def test_offline_endpoint_ends_in_batch_not_routed(client, offline_endpoint):
    batch = submit_batch(client, fns.square, [(i,) for i in range(30)], offline_endpoint, poll_seconds=1)
    report = batch.wait(timeout=120)
    assert report["run_state"] == "FAILED" and report["error"] == "BatchNotRouted", report
    assert report["state"] == "NOT_ROUTED" and report["routed"] == 0
    assert report["counts"] == {"FAILED": 30}
    [chunk] = report["failed_chunks"]
    assert chunk["chunk"] == 0 and chunk["tasks"] == 30 and chunk["error"] == "EndpointOffline"
    assert "gone-away" in chunk["cause"] and "is offline" in chunk["cause"]
    st = client.status(batch.task_ids[:3])["tasks"]
    assert all(s["state"] == "FAILED" and s["reason"].startswith("not routed: EndpointOffline") for s in st.values())


def test_batch_request_errors_are_4xx(client, endpoint):
    from skyfn.http import SkyfnAPIError

    fid = client.register_function(fns.square)
    bad = [({"endpoint_id": endpoint, "function_id": fid, "payloads": []}, 422, "payloads"),
           ({"endpoint_id": endpoint, "function_id": "no-such-function", "payloads": ["x"]}, 404, "function"),
           ({"endpoint_id": "no-such-endpoint", "function_id": fid, "payloads": ["x"]}, 404, "endpoint")]
    for body, status, word in bad:
        try:
            client._http.post("/batches", body)
        except SkyfnAPIError as exc:
            assert exc.status == status and word in exc.message, (body, exc.status, exc.message)
        else:
            raise AssertionError(f"{body} was accepted")
    try:
        client._http.get("/batches/not-a-batch")
    except SkyfnAPIError as exc:
        assert exc.status == 404 and "not found" in exc.message
    else:
        raise AssertionError("an unknown batch was found")
