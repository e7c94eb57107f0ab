"""Batch fan-out: a large batch becomes a run of the batch-fanout state machine.

submit (API): task ids are assigned at once and returned; the tasks are staged in S3 in
chunks (one JSON object each) with a manifest listing them; the execution's Distributed
Map reads the manifest (ItemReader) and runs the RouteChunk step on each chunk.
route_chunk (step): routes and enqueues one chunk through the service core (idempotent
per chunk, so a retried step does not enqueue twice). chunk_failed (step, the Map's
Catch): records why a chunk could not be routed and fails its tasks with that reason,
so every task id of the batch ends in a final state. progress (step, polled between
Wait states): settles the tasks that finished since the last check and says whether the
batch is COMPLETE, NOT_ROUTED (no chunk routed), TIMED_OUT or still RUNNING.

Its records in the hot store (the batch, its chunks' reports, its pending tasks, the
counts of final states) are laid out in lambdas/adapters/redis_store/batch_store.py.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from lambdas.adapters import aws
from lambdas.adapters.redis_store.lua_rows import CreateRow
from lambdas.core import deps
from lambdas.core.identity import allowlist
from lambdas.core.tasks import backlog, idempotency, push, registry, tasks
from lambdas.core.runs import runs, steps
from lambdas.core.errors import Conflict, NotFound
from lambdas.core.ids import new_id, new_ids
from lambdas.core.runs.settings import run_settings
from skyfn.protocol.api import SubmitTasks, TaskRequest
from skyfn.protocol.runs import SubmitBatch

CHUNK_TASKS = 1000
CHUNK_BYTES = 4 << 20
BATCH_TTL = 30 * 86400
MAX_REPORTED_CHUNKS = 100   # failed chunks listed in a summary (the state payload stays small)
# A standard execution has at most 25,000 history events; one check-choice-wait round costs
# about 9, so the wait grows with the deadline to keep the loop under this many rounds.
MAX_CHECKS = 2000
FINAL_BATCH_STATES = ("COMPLETE", "NOT_ROUTED", "TIMED_OUT")

def _chunks(task_ids: list[str], payloads: list[str]):
    start, size = 0, 0
    for i, p in enumerate(payloads):
        if i > start and (i - start >= CHUNK_TASKS or size + len(p) > CHUNK_BYTES):
            yield start, i
            start, size = i, 0
        size += len(p) + 64
    yield start, len(payloads)


# --- API side ------------------------------------------------------------------------
def submit(owner: str, req: SubmitBatch) -> tuple[dict[str, Any], bool]:
    key = f"batch:{req.idempotency_key}" if req.idempotency_key else None
    def busy() -> Conflict:
        return Conflict(f"a batch with idempotency key {req.idempotency_key!r} is still being submitted: "
                        "retry in a moment")

    backlog.check()  # 429 backlog while the archiver is behind: nothing staged, the key not claimed
    return idempotency.submit_once(owner, key, lambda: _submit(owner, req), busy=busy)


def _submit(owner: str, req: SubmitBatch) -> dict[str, Any]:
    ws = run_settings()
    machine = ws.need("batch_fanout_arn", "the batch-fanout state machine")
    bucket = ws.need("bucket", "the payload bucket")
    registry.check_endpoint(owner, req.endpoint_id)
    fns = registry.function_bodies(owner, {req.function_id})  # NotFound for unknown or foreign functions
    allowlist.enforce([(req.endpoint_id, req.function_id)], fns)  # the endpoint's allowed_functions (403)
    batch_id = new_id()
    task_ids = new_ids(len(req.payloads))
    prefix = f"batches/{batch_id}"
    bounds = list(_chunks(task_ids, req.payloads))

    def stage(i: int) -> dict[str, Any]:
        lo, hi = bounds[i]
        key = f"{prefix}/chunk-{i:06d}.json"
        aws.put_json(bucket, key, {
            "batch_id": batch_id, "chunk": i, "owner": owner, "endpoint_id": req.endpoint_id,
            "function_id": req.function_id, "max_retries": req.max_retries,
            "tasks": [[task_ids[j], req.payloads[j]] for j in range(lo, hi)]})
        return {"chunk": i, "key": key, "tasks": hi - lo}

    with ThreadPoolExecutor(max_workers=min(8, len(bounds))) as pool:
        manifest = list(pool.map(stage, range(len(bounds))))
    aws.put_json(bucket, f"{prefix}/manifest.json", manifest)
    now = time.time()
    deps.batch_store().create(batch_id, {"o": owner, "n": len(task_ids), "m": len(bounds), "e": req.endpoint_id,
                                         "f": req.function_id, "c": f"{now:.6f}",
                                         "d": f"{now + req.deadline_seconds:.6f}", "run": batch_id}, BATCH_TTL)
    _, arn = runs.start(owner, "batch", machine, {"batch_id": batch_id, "bucket": bucket,
                                                  "manifest_key": f"{prefix}/manifest.json",
                                                  "poll_seconds": req.poll_seconds}, run_id=batch_id)
    return {"batch_id": batch_id, "run_id": batch_id, "execution_arn": arn, "task_ids": task_ids,
            "chunks": len(bounds), "replayed": False}


def batch_record(owner: str, batch_id: str) -> dict[str, str]:
    raw = deps.batch_store().record(batch_id)
    if raw.get("o") != owner:
        raise NotFound(f"batch {batch_id} not found")
    return raw


def status(owner: str, batch_id: str) -> dict[str, Any]:
    batch_record(owner, batch_id)
    summary = progress(batch_id, final_check=False)
    run = runs.status(owner, batch_id)
    out = {k: summary[k] for k in ("batch_id", "state", "total", "routed", "pending", "counts", "failed_chunks")}
    out["run_state"] = run["state"]
    if run.get("error"):
        out["error"], out["cause"] = run["error"], run.get("cause")
    return out


# --- steps ---------------------------------------------------------------------------
def route_chunk(event: dict[str, Any]) -> dict[str, Any]:
    """Route and enqueue one staged chunk (event: {batch_id, bucket, chunk: {chunk, key}})."""
    chunk = aws.get_json(event["bucket"], event["chunk"]["key"])
    owner, endpoint = chunk["owner"], chunk["endpoint_id"]
    steps.require_online(owner, endpoint)
    ids = [t[0] for t in chunk["tasks"]]
    req = SubmitTasks(endpoint_id=endpoint, max_retries=chunk["max_retries"],
                      idempotency_key=f"batch:{chunk['batch_id']}:{chunk['chunk']}",
                      tasks=[TaskRequest(function_id=chunk["function_id"], payload=t[1]) for t in chunk["tasks"]])
    tasks.submit(owner, req, task_ids=ids)  # no token here: the packs carry the owner's kept identity claims
    deps.batch_store().chunk_reported(chunk["batch_id"], chunk["chunk"], f"ok:{len(ids)}", ids, BATCH_TTL)
    return {"chunk": chunk["chunk"], "routed": len(ids)}


def chunk_failed(event: dict[str, Any]) -> dict[str, Any]:
    """The Map's Catch: record why a chunk was not routed; fail its tasks with that reason
    (tasks an interrupted route step did create are tracked as routed instead)."""
    error = event.get("error") or {}
    name, cause = str(error.get("Error") or "Unknown"), str(error.get("Cause") or "")
    try:
        cause = str(orjson.loads(cause).get("errorMessage") or cause)
    except (ValueError, AttributeError):
        pass
    chunk = aws.get_json(event["bucket"], event["chunk"]["key"])
    batch_id, owner = chunk["batch_id"], chunk["owner"]
    ids = [t[0] for t in chunk["tasks"]]
    batches = deps.batch_store()
    exists = batches.tasks_exist(ids)
    created = [tid for tid, e in zip(ids, exists) if e]
    missing = [CreateRow(task_id=tid, function_id=chunk["function_id"], endpoint_id=chunk["endpoint_id"],
                         max_retries=chunk["max_retries"]) for tid, e in zip(ids, exists) if not e]
    store = deps.store()
    if missing:
        now = time.time()
        store.create(owner, f"batch-{batch_id}", missing, now, now)
        push.notify(store.fail_unqueued([m.task_id for m in missing], f"not routed: {name}: {cause}"[:2000]))
    # every task pending: the failed ones settle as FAILED at the next check
    report = f"ok:{len(ids)}" if created else orjson.dumps({"tasks": len(ids), "error": name, "cause": cause[:1000]})
    batches.chunk_reported(batch_id, chunk["chunk"], report, ids, BATCH_TTL)
    return {"chunk": chunk["chunk"], "failed": len(missing), "error": name}


def progress(batch_id: str, poll_seconds: int = 2, final_check: bool = True) -> dict[str, Any]:
    """Settle finished tasks and summarize. `final_check`: called by the state machine
    after the Map, when every chunk has reported (a chunk without a report is lost)."""
    settled = deps.batch_store().settle(batch_id)
    if settled is None:
        raise NotFound(f"batch {batch_id} not found")
    rec, chunk_reports, pending, counts = settled
    total, n_chunks = int(rec["n"]), int(rec["m"])
    routed, failed = 0, []
    for chunk, report in sorted(chunk_reports.items()):
        if report.startswith("ok:"):
            routed += int(report[3:])
        else:
            f = orjson.loads(report)
            failed.append({"chunk": chunk, "tasks": f["tasks"], "error": f["error"], "cause": f["cause"]})
    unreported = n_chunks - len(chunk_reports)
    if final_check and unreported:
        failed.append({"chunk": -1, "tasks": total - routed - sum(f["tasks"] for f in failed),
                       "error": "RouteStepLost", "cause": f"{unreported} chunk(s) ended without a report"})
    if unreported and not final_check:
        state = "ROUTING"
    elif routed == 0:
        state = "NOT_ROUTED"
    elif pending == 0:
        state = "COMPLETE"
    elif time.time() > float(rec["d"]):
        state = "TIMED_OUT"
    else:
        state = "RUNNING"
    # Tasks of failed chunks are in the counts as FAILED once settled; `routed` counts routed tasks only.
    return {"batch_id": batch_id, "state": state, "total": total, "routed": routed, "pending": pending,
            "counts": counts, "failed_chunks": failed[:MAX_REPORTED_CHUNKS],
            "wait_seconds": max(int(poll_seconds), math.ceil((float(rec["d"]) - float(rec["c"])) / MAX_CHECKS))}


def delete_staged(bucket: str, batch_id: str) -> int:
    """Delete the batch's staged chunks and manifest (the payloads live on in the task
    store only as long as the tasks need them); returns how many objects were deleted."""
    client, deleted = aws.s3(), 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"batches/{batch_id}/"):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
            deleted += len(keys)
    return deleted
