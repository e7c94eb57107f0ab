"""The history Lambda (scheduled): drains the outbox of the hot store into DynamoDB in
bulk, off the hot path: one record per submission and one per finished task (owner,
endpoint, states with timestamps, reason). At-least-once: a failed write puts the
entries back; writes are idempotent puts."""
from __future__ import annotations

import time

import orjson
from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext

from lambdas.config import settings
from lambdas.core import deps
from skyfn.protocol.states import parse_events

logger = Logger(service="skyfn-history")


def _task_item(rec: dict[str, str]) -> dict:
    events = rec.get("ev", "")
    return {
        "task_id": rec["task_id"], "owner": rec["o"], "function_id": rec["f"], "endpoint_id": rec["e"],
        "submission_id": rec["sub"], "state": rec["s"], "retries": int(rec.get("r", 0)),
        "created": float(rec["c"]), "events": events, "reason": rec.get("why"),
        "error": rec.get("err") if len(rec.get("err", "")) < 64_000 else None,
        "finished": parse_events(events)[-1][1] if events else None,
    }


def _expiring(items: list[dict], now: float) -> list[dict]:
    """Items with `expires_at` (epoch seconds, DynamoDB TTL) when a TTL is configured."""
    days = settings().history_ttl_days
    if days > 0:
        expires = int(now + days * 86400)
        for item in items:
            item["expires_at"] = expires
    return items


def flush(limit: int | None = None) -> dict[str, int]:
    store = deps.store()
    entries = store.outbox_take(limit or settings().history_batch)
    if not entries:
        return {"submissions": 0, "tasks": 0}
    submissions = [orjson.loads(e[4:]) for e in entries if e.startswith("sub:")]
    task_ids = [e for e in entries if not e.startswith("sub:")]
    records = store.records(task_ids)
    try:
        now = time.time()
        deps.dynamo().write_bulk(_expiring(submissions, now), _expiring([_task_item(r) for r in records], now))
    except Exception:
        store.outbox_return(entries)
        raise
    store.mark_historized([r["task_id"] for r in records])
    return {"submissions": len(submissions), "tasks": len(records)}


def handler(event: dict, context: LambdaContext) -> dict:
    return flush()
