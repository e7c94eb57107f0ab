"""Batch fan-out step: `check` settles the batch's finished tasks and returns its summary
(state COMPLETE / NOT_ROUTED / TIMED_OUT / RUNNING and the seconds to wait before the next
check); `chunk_failed` records a chunk the route step could not route."""
from __future__ import annotations

from typing import Any

from lambdas.core import batches


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    action = event.get("action", "check")
    if action == "chunk_failed":
        return batches.chunk_failed(event)
    if action == "check":
        return batches.progress(event["batch_id"], int(event.get("poll_seconds") or 2))
    raise ValueError(f"unknown action {action!r}: 'check' or 'chunk_failed'")
