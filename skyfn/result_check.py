"""The SDK's check of who produced a result before it decodes it (skyfn.outcomes.task_outcome).

The service records, with each result it stores, the endpoint whose agent produced it, and
answers it as `result_by` beside the task's `endpoint_id`. A result or error buffer is
decoded (unpickled, perhaps) only when the two agree: were a value from another endpoint
ever stored, the submitter's process would refuse it unread rather than run whatever a
pickle in it says.
"""
from __future__ import annotations

from typing import Optional


def foreign_result(st: dict) -> Optional[str]:
    """Why a status's result or error buffer is refused unread: the service says an endpoint
    produced it other than the one the task was routed to. None when it may be decoded (the
    producer is the task's endpoint, or the service made it: a memo hit, a dependency's
    failure, a record older than the producer's stamp)."""
    by = st.get("result_by")
    if by is None or (st.get("result") is None and st.get("error") is None):
        return None
    expected = st.get("endpoint_id")
    if by == expected and by:
        return None
    return (f"its {'result' if st.get('result') is not None else 'error'} was produced by endpoint {by or '(none)'}, "
            f"not by endpoint {expected or '(none)'} the task was sent to: refused unread")
