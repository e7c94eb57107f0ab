"""The audit record of a task, for its submitter: who submitted it, to which endpoint,
which function, and every state change with its time (and the reason of a failure).

Read from the hot store while the task is there, else from the durable history in
DynamoDB (written for every finished task, kept without expiry unless the deployment sets
SKYFN_HISTORY_TTL_DAYS). Results and payloads are not part of it.
"""
from __future__ import annotations

from typing import Any

from lambdas.core import deps
from lambdas.core.errors import NotFound
from lambdas.core.ids import is_uuid
from skyfn.protocol.states import parse_events


def task_record(user: str, task_id: str) -> dict[str, Any]:
    rec = deps.store().record(task_id)
    if rec and rec.get("o") == user:
        return {"task_id": task_id, "submitter": rec["o"], "endpoint_id": rec.get("e", ""),
                "function_id": rec.get("f", ""), "submission_id": rec.get("sub", ""), "state": rec["s"],
                "retries": int(rec.get("r", 0)), "reason": rec.get("why"), "created": float(rec["c"]),
                "events": parse_events(rec.get("ev"))}
    hist = deps.dynamo().get_task(user, task_id) if is_uuid(task_id) else None
    if not hist or hist.get("owner") != user:
        raise NotFound(f"task {task_id} not found")
    return {"task_id": task_id, "submitter": hist["owner"], "endpoint_id": hist.get("endpoint_id", ""),
            "function_id": hist.get("function_id", ""), "submission_id": hist.get("submission_id", ""),
            "state": hist["state"], "retries": int(hist.get("retries", 0)), "reason": hist.get("reason"),
            "created": float(hist["created"]), "events": parse_events(hist.get("events"))}
