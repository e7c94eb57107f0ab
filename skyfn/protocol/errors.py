"""Exceptions shared by every part of skyfn, and the wire form of a remote exception."""
from __future__ import annotations


class SkyfnError(Exception):
    """Base class of skyfn's own errors."""


class SerializationError(SkyfnError):
    """No strategy could serialize an object."""


class DeserializationError(SkyfnError):
    """A buffer could not be decoded; the message names strategy, versions and the fix."""


class TaskFailed(SkyfnError):
    """A task failed for a reason that is not an exception raised by the user's function
    (lease expired past its retries, dead-lettered, timed out, cancelled)."""

    def __init__(self, task_id: str, state: str, reason: str):
        super().__init__(f"task {task_id} {state}: {reason}")
        self.task_id = task_id
        self.state = state
        self.reason = reason


class TaskCancelled(TaskFailed):
    pass


class TaskTimedOut(TaskFailed):
    pass


class DependencyFailed(TaskFailed):
    """A task never ran because one of its inputs (a future passed as an argument) did not
    succeed. `input_task_id` names that input, `input_state` its final state, and `cause`
    is the exception it raised (None when it was cancelled, timed out or lost)."""

    def __init__(self, task_id: str, input_task_id: str, input_state: str, reason: str,
                 cause: BaseException | None = None):
        super().__init__(task_id, "FAILED", reason)
        self.input_task_id = input_task_id
        self.input_state = input_state
        self.cause = cause
        if cause is not None:
            self.__cause__ = cause


class ResultExpired(SkyfnError, LookupError):
    """A task SUCCEEDED but the service no longer keeps its result (TaskStatus.result_expired):
    raised instead of returning None, which would read as the function's answer."""

    def __init__(self, task_id: str, finished: float | None, result_ttl: float, unretrieved_ttl: float):
        self.task_id = task_id
        self.finished = finished
        self.result_ttl = result_ttl
        self.unretrieved_ttl = unretrieved_ttl
        super().__init__(
            f"task {task_id} SUCCEEDED{_when(finished)}, but its result is no longer kept: the service keeps a "
            f"result SKYFN_RESULT_TTL={_span(result_ttl)} after it is first read (a status read, get_result, "
            "an Executor future, or a push delivered to one of your connections), or "
            f"SKYFN_UNRETRIEVED_TTL={_span(unretrieved_ttl)} if it is never read. Collect results sooner after "
            "they finish, or have the function return large or long-lived results by reference "
            "(skyfn.data.default_store().ref(value, ttl=...), or S3) and keep the ref.")


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    import time

    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))
    return f" at {stamp} ({_age(time.time() - ts)} ago)"


def _age(seconds: float) -> str:
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.0f} {unit}"
    return f"{max(0.0, seconds):.0f} s"


def _span(seconds: float) -> str:
    """600 -> '600 s (10 min)'; whole days and hours spelled out too."""
    s = f"{seconds:g} s"
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{s} ({n} {'day' if unit == 'days' and n == 1 else unit})"
    return s


class RemoteExecutionError(SkyfnError):
    """Stands in for a remote exception whose class could not be rebuilt here."""

    def __init__(self, type_name: str, message: str, remote_traceback: str):
        super().__init__(f"{type_name}: {message}\n\nRemote traceback:\n{remote_traceback}")
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback
