"""The batch-fanout state machine under moto's Step Functions with the real step
handlers: a batch submitted through POST /batches is staged in S3, routed chunk by chunk
by the Distributed Map, run by the local endpoint, and the run completes when every task
has a result. Per-task failures are counted, not fatal; an offline endpoint's chunks are
reported and the run ends in BatchNotRouted."""
from __future__ import annotations

import time

from skyfn.workflows import submit_batch
from tests.workflows import fns


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
