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


class RemoteExecutionError(SkyfnError):
    """Stands in for a remote exception whose class could not be rebuilt here."""

    def __init__(self, type_name: str, message: str, remote_traceback: str):
        super().__init__(f"{type_name}: {message}\n\nRemote traceback:\n{remote_traceback}")
        self.type_name = type_name
        self.message = message
        self.remote_traceback = remote_traceback
