"""What a final task's status means to the caller: its value, or the exception to raise.

`task_outcome` reads one entry of GET /tasks/{id} or POST /tasks/status (a plain dict) once
the task is in a FINAL state; the Client, the Executor's state and the service's tests all
decode results through it. A result someone else's endpoint produced is never decoded
(skyfn/result_check.py).
"""
from __future__ import annotations

from typing import Any

from skyfn.protocol import blobs
from skyfn.protocol.dataflow import dependency_failure
from skyfn.protocol.errors import DependencyFailed, ResultExpired, TaskCancelled, TaskFailed, TaskTimedOut
from skyfn.protocol.remote_exception import unwrap_exception
from skyfn.protocol.serialize import deserialize
from skyfn.result_check import foreign_result

FINAL = frozenset({"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED"})


def task_outcome(task_id: str, st: dict) -> tuple[bool, Any]:
    """(True, value) for SUCCEEDED; (False, exception) for every other final state, and for
    a SUCCEEDED task whose result the service no longer keeps (ResultExpired: never None).

    FAILED with an ``error`` buffer rebuilds the function's own exception (remote traceback
    attached); CANCELLED / TIMED_OUT / other failures become TaskCancelled / TaskTimedOut /
    TaskFailed carrying the service's ``reason``; a task that never ran because an input
    did not succeed, DependencyFailed (its ``cause``: the input's exception). Never raises.
    """
    state = st.get("state")
    foreign = foreign_result(st)
    if foreign is not None:  # never decoded: a pickle from elsewhere would run here
        return False, TaskFailed(task_id, str(state), foreign)
    if state == "FAILED" and (dependency := dependency_failure(st.get("reason"))):
        return False, _dependency_failed(task_id, st, *dependency)
    try:
        if state == "SUCCEEDED":
            gone = st.get("result_expired")
            if gone:
                return False, ResultExpired(task_id, gone.get("finished"), gone["result_ttl"], gone["unretrieved_ttl"])
            result = st.get("result")
            if blobs.is_ref(result) and st.get("result_url"):  # a large result, kept in S3
                result = blobs.download(st["result_url"])
            return True, (deserialize(result) if result is not None else None)
        error = st.get("error")
        if state == "FAILED" and error:
            return False, unwrap_exception(error)
    except Exception as exc:  # a buffer we cannot decode is this task's failure, not ours
        return False, exc
    reason = st.get("reason")
    if state == "CANCELLED":
        return False, TaskCancelled(task_id, state, reason or "cancelled")
    if state == "TIMED_OUT":
        return False, TaskTimedOut(task_id, state, reason or "exceeded its walltime")
    return False, TaskFailed(task_id, str(state), reason or "failed without an error report")


def _dependency_failed(task_id: str, st: dict, input_id: str, input_state: str) -> DependencyFailed:
    cause = None
    if st.get("error"):
        try:
            cause = unwrap_exception(st["error"])
        except Exception as exc:  # noqa: BLE001 - the input's error we cannot decode: that is the cause we have
            cause = exc
    return DependencyFailed(task_id, input_id, input_state, st["reason"], cause=cause)
