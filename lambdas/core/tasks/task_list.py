"""GET /tasks: the caller's recent tasks with their events, for reports (skyfn report,
Client.report) and the status page (/ui).

Tasks still in the hot store come from the owner's recent index (Redis, newest first);
finished tasks already purged from it come from the durable history (DynamoDB): by id when
the index still names them, through the owner-index when the window reaches back past what
the index holds (trimmed, or expired after a week without submissions). Each task: id, function, endpoint, state, created,
retries, reason and its events as [state, timestamp] pairs. Payloads and results are
never listed.
"""
from __future__ import annotations

from typing import Any

from lambdas.core import deps
from skyfn.protocol.states import parse_events

MAX_LIST = 20_000  # one answer stays well under API Gateway's 10 MB / Lambda's 6 MB
HISTORY_LOOKUPS = 2_000  # purged tasks read back from the history per call
HISTORY_STATES_FINAL = frozenset({"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED"})


def _hot(rec: dict[str, str]) -> dict[str, Any]:
    return {"task_id": rec["task_id"], "function_id": rec.get("f"), "endpoint_id": rec.get("e") or None,
            "state": rec.get("s"), "created": float(rec.get("c", 0)), "retries": int(rec.get("r", 0)),
            "reason": rec.get("why"), "events": [list(e) for e in parse_events(rec.get("ev"))]}


def _cold(item: dict[str, Any]) -> dict[str, Any]:
    return {"task_id": item["task_id"], "function_id": item.get("function_id"),
            "endpoint_id": item.get("endpoint_id") or None, "state": item.get("state"),
            "created": float(item.get("created", 0)), "retries": int(item.get("retries", 0)),
            "reason": item.get("reason"), "events": [list(e) for e in parse_events(item.get("events"))]}


def list_tasks(owner: str, since: float, endpoint_id: str | None = None, limit: int = 10_000,
               history: bool = True) -> dict[str, Any]:
    limit = max(1, min(int(limit), MAX_LIST))
    records, purged, complete_from = deps.store().recent(owner, since, limit)
    tasks = {r["task_id"]: _hot(r) for r in records if r.get("o") == owner}
    if history:
        cold = []
        if complete_from is None or complete_from > since:  # the index may not reach back to since
            cold = deps.dynamo().tasks_since(owner, since, limit)
        elif purged:
            cold = list(deps.dynamo().get_tasks(owner, purged[:HISTORY_LOOKUPS]).values())
        for item in cold:
            if (item.get("owner") == owner and item.get("task_id") not in tasks
                    and item.get("state") in HISTORY_STATES_FINAL):
                tasks[item["task_id"]] = _cold(item)
    out = [t for t in tasks.values() if endpoint_id is None or t["endpoint_id"] == endpoint_id]
    out.sort(key=lambda t: t["created"], reverse=True)
    return {"tasks": out[:limit], "truncated": len(out) > limit, "since": since}
