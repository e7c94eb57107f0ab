"""Flow and SPMD step: `submit` one task through the service core; `wait` for it a few
seconds and return {task_id, output} when it succeeded, {task_id, pending} while it runs
(the state machine loops), or raise TaskFailed / TaskTimedOut / TaskCancelled."""
from __future__ import annotations

from typing import Any

from lambdas.core.runs import steps


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    action = event.get("action")
    if action == "submit":
        return steps.submit(event)
    if action == "wait":
        return steps.wait(event)
    raise ValueError(f"unknown action {action!r}: 'submit' or 'wait'")
