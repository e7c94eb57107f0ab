"""Batch fan-out step: `check` settles the batch's finished tasks and returns its summary
(state COMPLETE / NOT_ROUTED / TIMED_OUT / RUNNING and the seconds to wait before the next
check; once the batch is final its staged chunks are deleted from S3); `chunk_failed` records a chunk the route step could not route."""
from __future__ import annotations

from typing import Any

from lambdas.core.runs import batches


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    action = event.get("action", "check")
    if action == "chunk_failed":
        return batches.chunk_failed(event)
    if action == "check":
        summary = batches.progress(event["batch_id"], int(event.get("poll_seconds") or 2))
        if summary["state"] in batches.FINAL_BATCH_STATES and event.get("bucket"):
            batches.delete_staged(event["bucket"], event["batch_id"])
        return summary
    raise ValueError(f"unknown action {action!r}: 'check' or 'chunk_failed'")
