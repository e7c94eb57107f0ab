"""The history Lambda: drains the outbox of the hot store into DynamoDB in bulk, off the
hot path: one record per submission, finished tasks in compressed pages
(lambdas/adapters/history_pages.py). Driven by the backlog: one invocation keeps taking
batches while the outbox holds work, until it is empty or the invocation's time is nearly
up (SKYFN_HISTORY_DRAIN_MARGIN_S), so a schedule only needs to start drainers, never to
pace them. Concurrent drainers are safe: each batch is taken by one atomic LPOP.

At-least-once: a failed write puts the batch back; page writes are idempotent. Once
written, task records are marked archived and given their expiry in Redis (they leave it
by Redis's own TTL). After each invocation the backlog gauge is published as metrics."""
from __future__ import annotations

import time
from typing import Any

import orjson
from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext

from lambdas.config import settings
from lambdas.core import deps
from lambdas.core.tasks import backlog
from skyfn.protocol.states import parse_events

logger = Logger(service="skyfn-history")

ERROR_MAX = 64_000  # longer error texts stay out of the history (they are in the result)


def _task_item(rec: dict[str, str]) -> dict[str, Any]:
    err = rec.get("err")
    return {
        "task_id": rec["task_id"], "owner": rec["o"], "function_id": rec["f"], "endpoint_id": rec["e"],
        "submission_id": rec["sub"], "state": rec["s"], "retries": int(rec.get("r", 0)),
        "created": float(rec["c"]), "events": rec.get("ev", ""), "reason": rec.get("why"),
        "error": err if err is not None and len(err) < ERROR_MAX else None,
    }


def _expires_at(now: float) -> int | None:
    """DynamoDB TTL (epoch seconds) of the items written now, when a TTL is configured."""
    days = settings().history_ttl_days
    return int(now + days * 86400) if days > 0 else None


def flush(limit: int | None = None) -> dict[str, int]:
    """Archive one batch of the outbox. Returns what it took and wrote."""
    store = deps.store()
    entries = store.outbox_take(limit or settings().history_batch)
    if not entries:
        return {"taken": 0, "submissions": 0, "tasks": 0, "pages": 0}
    submissions = [orjson.loads(e[4:]) for e in entries if e.startswith("sub:")]
    task_ids = [e for e in entries if not e.startswith("sub:")]
    records = store.records(task_ids)
    try:
        pages = deps.dynamo().write_bulk(submissions, [_task_item(r) for r in records], _expires_at(time.time()))
    except Exception:
        store.outbox_return(entries)
        raise
    try:
        store.mark_archived([r["task_id"] for r in records])
    except Exception:  # written but not marked: taken again, its pages written again
        store.outbox_return(entries)
        raise
    return {"taken": len(entries), "submissions": len(submissions), "tasks": len(records), "pages": pages}


def drain(seconds: float, batch: int | None = None, max_batches: int = 0) -> dict[str, int]:
    """Archive batches until the outbox is empty, `seconds` have passed or (when not 0)
    `max_batches` were taken."""
    batch = batch or settings().history_batch
    deadline = time.monotonic() + seconds
    total = {"batches": 0, "taken": 0, "submissions": 0, "tasks": 0, "pages": 0}
    while True:
        got = flush(batch)
        if got["taken"]:
            total["batches"] += 1
            for k in ("taken", "submissions", "tasks", "pages"):
                total[k] += got[k]
        if got["taken"] < batch or time.monotonic() >= deadline or total["batches"] == max_batches:
            return total


def handler(event: dict, context: LambdaContext) -> dict:
    seconds = context.get_remaining_time_in_millis() / 1000 - settings().history_drain_margin_s
    started = time.monotonic()
    total = drain(max(0.0, seconds), max_batches=settings().history_max_batches)
    total["seconds"] = round(time.monotonic() - started, 3)
    if total["taken"]:
        logger.info("drained", extra=total)
    backlog.publish(backlog.gauge(deps.backlog_figures(), 0))
    return total
