"""Dataflow on the wire: tasks whose arguments are other tasks' results (DESIGN.md section 3).

The SDK replaces each skyfn future found among a task's arguments (nested in lists,
tuples, dicts) with a placeholder ``Input(i)`` and lists the inputs in the request's
``TaskRequest.inputs``, in placeholder order: a task id, or ``"#k"`` for the k-th task of
the same request (its id is not known to the client yet). The service keeps the task
WAITING until every input SUCCEEDED and never looks inside the payload: when it releases
the task it wraps the argument buffer and the inputs' results, still opaque text, in an
*envelope*; the worker opens it, deserializes each result and puts it in its
placeholder's place.

An envelope is ``"dataflow 1\\n"`` followed by JSON ``{"args": <argument buffer>,
"inputs": [entry, ...]}``; an entry is ``{"task_id": id, "result": <result buffer>}`` or,
for a result kept in S3, ``{"task_id": id, "url": <presigned GET>}``. An argument buffer
kept in S3 is ``"args"``: its blob reference, with ``"args_url"``: a presigned GET.

A dependent whose unfinished inputs all run on its own endpoint is *parked*: the service
sends it at once, with ``TaskSpec.after`` naming those inputs and a ``{"task_id": id,
"local": true}`` entry in their places; the agent fills each from the result it got from
its own worker (``fill_local``) and runs the task with no trip through the service, or
hands it back (an UNPARK update) when it cannot.
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable

ENVELOPE_HEADER = "dataflow 1\n"
MAX_INPUTS = 20_000  # inputs of one task (a fan-in of 10,000 fits twice)
_LOCAL = re.compile(r"^#(0|[1-9][0-9]{0,5})$")
_TASK_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class Input:
    """The place of the i-th input's result among a task's arguments."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __reduce__(self):
        return Input, (self.index,)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Input) and other.index == self.index

    def __hash__(self) -> int:
        return hash(("skyfn.Input", self.index))

    def __repr__(self) -> str:
        return f"Input({self.index})"


def local_input(index: int) -> str:
    """The input naming the `index`-th task of the same request."""
    return f"#{index}"


def parse_input(text: str, position: int) -> tuple[str | None, int | None]:
    """(task id, None) or (None, index of a task earlier in the same request), for the
    task at `position` of its request; ValueError naming the problem otherwise."""
    m = _LOCAL.match(text)
    if m:
        index = int(m.group(1))
        if index >= position:
            raise ValueError(f"input {text!r} of task {position} names a task at or after it in the request: "
                             "a task's inputs must come before it")
        return None, index
    if _TASK_ID.match(text):
        return text, None
    raise ValueError(f"input {text!r} is neither a task id nor '#<index>' of an earlier task in the same request")


def make_envelope(args: str, inputs: list[dict[str, str]], args_url: str | None = None) -> str:
    body: dict[str, Any] = {"args": args, "inputs": inputs}
    if args_url:
        body["args_url"] = args_url
    return ENVELOPE_HEADER + json.dumps(body, separators=(",", ":"))


PARK_FEATURE = "park"  # what an agent that releases parked dependents reports (Heartbeat.features)


def local_entry(task_id: str) -> dict[str, Any]:
    """The entry of an input whose result the agent of the dependent's endpoint puts in."""
    return {"task_id": task_id, "local": True}


def fill_local(payload: str, result_of: Callable[[str], str]) -> str:
    """The envelope `payload` with each local entry's result put in: result_of(task id)."""
    body = open_envelope(payload)
    for entry in body["inputs"]:
        if entry.pop("local", False):
            entry["result"] = result_of(entry["task_id"])
    return ENVELOPE_HEADER + json.dumps(body, separators=(",", ":"))


def is_envelope(payload: str) -> bool:
    return payload.startswith(ENVELOPE_HEADER)


def open_envelope(payload: str) -> dict[str, Any]:
    return json.loads(payload[len(ENVELOPE_HEADER):])


def substitute(obj: Any, value_of: Callable[[int], Any]) -> Any:
    """`obj` with every Input(i) replaced by value_of(i), inside lists, tuples (named ones
    too), dicts (values) and sets; other objects are returned as they are. Only type(obj)
    is asked, never isinstance: a proxy (a skyfn.data Ref) answers isinstance by resolving
    itself, which would fetch its object whether the function uses it or not."""
    t = type(obj)
    if t is Input:
        return value_of(obj.index)
    if issubclass(t, list):
        return [substitute(x, value_of) for x in obj]
    if issubclass(t, tuple):
        items = [substitute(x, value_of) for x in obj]
        return t(*items) if hasattr(t, "_fields") else tuple(items)
    if issubclass(t, dict):
        out = {k: substitute(v, value_of) for k, v in obj.items()}
        return out if t is dict else _rebuild(obj, out)
    if issubclass(t, (set, frozenset)):
        return t(substitute(x, value_of) for x in obj)
    return obj


def _rebuild(original: dict, items: dict) -> dict:
    try:  # OrderedDict, defaultdict, ...: same type, same order
        out = original.copy()
        out.clear()
        out.update(items)
        return out
    except Exception:  # noqa: BLE001 - a mapping subclass that cannot be copied: a plain dict
        return items


# The reason the service gives a dependent that cannot run (its `error` is the input's own
# error buffer, when it had one): the SDK raises DependencyFailed from it.
DEPENDENCY_FAILED = "DependencyFailed: input task {input} ended {state}"
_DEPENDENCY_FAILED = re.compile(r"^DependencyFailed: input task ([0-9a-f-]{36}) ended ([A-Z_]+)")


def dependency_failure(reason: str | None) -> tuple[str, str] | None:
    """(input task id, its final state) when `reason` is a DependencyFailed reason."""
    m = _DEPENDENCY_FAILED.match(reason or "")
    return (m.group(1), m.group(2)) if m else None
