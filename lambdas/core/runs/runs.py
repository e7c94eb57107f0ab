"""Runs: every Step Functions execution the service starts for a user (a batch,
a flow, an SPMD group) is a run, recorded in the hot store under its id with its owner
(lambdas/adapters/redis_store/run_store.py), so that GET /runs/{id} answers only its owner
and reads the execution's state from Step Functions.
"""
from __future__ import annotations

import json
import time
from typing import Any

from lambdas.adapters import aws
from lambdas.core import deps
from lambdas.core.errors import NotFound
from lambdas.core.ids import new_id

RUN_TTL = 30 * 86400


def start(owner: str, kind: str, machine_arn: str, payload: Any, run_id: str | None = None) -> tuple[str, str]:
    """Start an execution of `machine_arn` named by the run id; returns (run_id, execution ARN)."""
    run_id = run_id or new_id()
    records = deps.run_store()
    # Recorded first: a handler of the execution may look the run up as soon as it starts.
    records.create(run_id, owner, kind, time.time(), RUN_TTL)
    arn = aws.start(machine_arn, run_id, payload)
    records.started(run_id, arn)
    return run_id, arn


def record(owner: str, run_id: str) -> dict[str, str]:
    raw = deps.run_store().record(run_id)
    if raw.get("o") != owner or "x" not in raw:
        raise NotFound(f"run {run_id} not found")
    return raw


def status(owner: str, run_id: str) -> dict[str, Any]:
    rec = record(owner, run_id)
    d = aws.describe(rec["x"])
    out: dict[str, Any] = {"run_id": run_id, "kind": rec["k"], "state": d["status"],
                           "started": d["startDate"].timestamp() if d.get("startDate") else None,
                           "stopped": d["stopDate"].timestamp() if d.get("stopDate") else None}
    if d.get("output") is not None:
        try:
            out["output"] = json.loads(d["output"])
        except ValueError:
            out["output"] = d["output"]
    if d["status"] != "SUCCEEDED":
        out["error"], out["cause"] = _failure(d, rec["x"])
        out["cause"] = _readable(out["cause"])
    return out


def _readable(cause: str | None) -> str | None:
    """A Lambda step's cause is its error JSON: keep the message, the part people read."""
    if not cause or not cause.startswith("{"):
        return cause
    try:
        return str(json.loads(cause).get("errorMessage") or cause)
    except (ValueError, AttributeError):
        return cause


def _failure(described: dict[str, Any], execution_arn: str) -> tuple[str | None, str | None]:
    """Error and cause of a failed execution: DescribeExecution has them on AWS; some
    emulators give them only in the history's ExecutionFailed event."""
    error, cause = described.get("error"), described.get("cause")
    if error or described["status"] == "RUNNING":
        return error, cause
    try:
        events = aws.sfn().get_execution_history(executionArn=execution_arn, reverseOrder=True,
                                                 maxResults=5)["events"]
    except Exception:
        return error, cause
    for ev in events:
        for key in ("executionFailedEventDetails", "executionTimedOutEventDetails", "executionAbortedEventDetails"):
            if key in ev:
                return ev[key].get("error"), ev[key].get("cause")
    return error, cause
