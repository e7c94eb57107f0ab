"""A worker's side of dataflow: opening a task's envelope and putting its inputs' results in place.

A task that took other tasks' results (skyfn.protocol.dataflow) arrives with an *envelope*
for payload: its argument buffer, holding ``Input(i)`` placeholders, and the inputs'
result buffers (inline, or a presigned URL for one kept in S3). ``open_payload`` splits
it; the worker unpacks the arguments as usual and ``fill_inputs`` replaces each
placeholder with the i-th result, deserialized once (the same input twice is the same
object) and only when a placeholder asks for it. Whatever cannot be read -- a broken
envelope, a result that does not download or deserialize -- raises ``InputError``
naming the input's task, and the task is FAILED with it.
"""
from __future__ import annotations

from typing import Any, Optional

from skyfn.protocol import blobs
from skyfn.protocol.dataflow import is_envelope, open_envelope, substitute
from skyfn.protocol.errors import SkyfnError
from skyfn.protocol.serialize import deserialize


class InputError(SkyfnError):
    """A task's inputs could not be read: its envelope is broken, or an input's result is."""


def open_payload(payload: str) -> tuple[str, Optional[list]]:
    """(argument buffer, input entries) of a payload; entries is None when it is no envelope."""
    if not is_envelope(payload):
        return payload, None
    try:
        env = open_envelope(payload)
        args, entries = env["args"], env["inputs"]
        if not isinstance(args, str) or not isinstance(entries, list):
            raise TypeError("'args' must be a buffer and 'inputs' a list")
    except Exception as exc:  # noqa: BLE001 - JSON, keys, types: all say the same
        raise InputError(f"this task's dataflow envelope is broken ({type(exc).__name__}: {exc}); "
                         "it was made by the service when the task's inputs were done") from exc
    if blobs.is_ref(args):  # a large argument buffer kept in S3
        url = env.get("args_url") or blobs.target(args)
        try:
            args = blobs.download(url)
        except Exception as exc:  # noqa: BLE001
            raise InputError(f"could not download this task's arguments from S3 ({exc})") from exc
    return args, entries


def fill_inputs(args: tuple, kwargs: dict, entries: list) -> tuple[tuple, dict]:
    """`args`, `kwargs` with every ``Input(i)`` replaced by the result of ``entries[i]``."""
    values: dict[int, Any] = {}

    def value_of(i: int) -> Any:
        if i not in values:
            values[i] = _result(entries, i)
        return values[i]

    return (tuple(substitute(a, value_of) for a in args),
            {k: substitute(v, value_of) for k, v in kwargs.items()})


def _result(entries: list, i: int) -> Any:
    if not 0 <= i < len(entries) or not isinstance(entries[i], dict):
        raise InputError(f"this task's arguments name input {i}, but its envelope holds {len(entries)} inputs")
    entry = entries[i]
    tid = entry.get("task_id", "?")
    try:
        if entry.get("url"):
            buffer = blobs.download(entry["url"])
        elif isinstance(entry.get("result"), str) and not blobs.is_ref(entry["result"]):
            buffer = entry["result"]
        else:
            raise ValueError("the entry has neither a result buffer nor a url")
        return deserialize(buffer)
    except Exception as exc:  # noqa: BLE001 - DeserializationError carries the fix in its message
        raise InputError(f"input {i} (the result of task {tid}) could not be read: {type(exc).__name__}: {exc}") from exc
