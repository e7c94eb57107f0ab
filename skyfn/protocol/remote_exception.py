"""The wire form of an exception raised by a user's function, and its rebuilding.

The worker sends the exception by value (when it can be serialized) together with its
formatted remote traceback; the SDK re-raises the original type with the remote
traceback attached as a note, or RemoteExecutionError when the type cannot be rebuilt.
"""
from __future__ import annotations

import traceback

from skyfn.protocol.errors import RemoteExecutionError
from skyfn.protocol.serialize import deserialize, serialize


def wrap_exception(exc: BaseException) -> str:
    """Serialize an exception raised in a worker, keeping its remote traceback."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        body = serialize(exc)
    except Exception:
        body = None
    return serialize(
        {"type": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": str(exc), "traceback": tb, "exception": body}
    )


def unwrap_exception(buffer: str) -> BaseException:
    """Rebuild the remote exception to raise locally."""
    data = deserialize(buffer)
    exc: BaseException | None = None
    if data.get("exception"):
        try:
            exc = deserialize(data["exception"])
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        return RemoteExecutionError(data["type"], data["message"], data["traceback"])
    exc.add_note("Remote traceback:\n" + data["traceback"])
    exc.remote_traceback = data["traceback"]  # type: ignore[attr-defined]
    return exc
