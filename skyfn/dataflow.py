"""Futures as arguments, on the SDK's side: finding them among a call's arguments and naming them.

A skyfn future (an Executor's ``SkyfnFuture``) or a ``TaskRef`` (a task named by its id,
e.g. one ``Client.run`` returned) passed to ``Executor.submit``/``map``, ``Client.run`` or
``Batch.add`` -- as an argument, or inside lists, tuples (named ones too), dicts (as
values) and sets of arguments -- is an *input* of the task: the argument buffer holds
``Input(i)`` in its place, and the request lists the inputs in ``TaskRequest.inputs``
(skyfn.protocol.dataflow). The service keeps the task WAITING until every input SUCCEEDED
and the worker puts the inputs' results in their places; the client need not stay up.

``find_inputs`` does the finding (the same future twice is one input); ``TaskFuture`` is
what an input future offers (its task id once the service gave one, or that it ran in a
direct session the service has no record of yet: its *value* is then passed inline, once
it is known); ``bind_inputs`` names every input at once for the synchronous calls
(``Client.run``, ``Batch.add``); ``rebase_local_inputs`` keeps ``"#k"`` inputs right when
a list of tasks is split into several requests.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError, Future
from typing import Any, Callable, Optional

from skyfn.protocol.dataflow import DEPENDENCY_FAILED, Input, local_input
from skyfn.protocol.errors import DependencyFailed, TaskCancelled, TaskTimedOut

# How long a submission waits for an input future of another executor to get its task id
# (that executor's own batching and retries: a minute of retries at most, by default).
ID_WAIT_S = 300.0
# Containers nested deeper than this are not searched (pickle would refuse most of them anyway).
_MAX_DEPTH = 100
_LEAVES = frozenset({str, bytes, int, float, bool, complex, type(None)})
_ASSIGNED = threading.Condition()  # notified whenever task futures got ids or failed to submit


class TaskRef:
    """A task named by its id, to pass as an argument: its result takes its place when
    the task runs (``client.run(g, TaskRef(client.run(f, 1)), endpoint_id=...)``)."""

    __slots__ = ("task_id",)

    def __init__(self, task_id: str):
        if not isinstance(task_id, str) or not task_id:
            raise TypeError(f"TaskRef takes a task id (a str), not {task_id!r}")
        self.task_id = task_id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TaskRef) and other.task_id == self.task_id

    def __hash__(self) -> int:
        return hash(("skyfn.TaskRef", self.task_id))

    def __repr__(self) -> str:
        return f"TaskRef({self.task_id!r})"


class TaskFuture(Future):
    """A Future of one skyfn task. ``task_id`` is set once the task is submitted;
    ``by_value`` is true while it is a direct session's task (its id is not the
    service's yet): a task taking it as an input then gets its value inline."""

    def __init__(self) -> None:
        super().__init__()
        self.task_id: Optional[str] = None
        self.by_value = False
        self.inputs: Optional[list] = None  # its own inputs (TaskFuture | str), when it has some


def announce() -> None:
    """Wake submissions waiting for input futures to get their task ids (``wait_for_id``)."""
    with _ASSIGNED:
        _ASSIGNED.notify_all()


def wait_for_id(fut: TaskFuture, timeout: float = ID_WAIT_S) -> str:
    """The service's id of `fut`'s task, waiting up to `timeout` for its submission. Raises
    the error its submission failed with, CancelledError when it was cancelled before it
    was submitted, TimeoutError past `timeout`."""
    deadline = time.monotonic() + timeout
    with _ASSIGNED:
        while fut.task_id is None and not fut.done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"an input future was not submitted within {timeout:.0f} s: {fut!r}")
            _ASSIGNED.wait(min(left, 0.5))  # a failure may not be announced: look again now and then
    if fut.task_id is not None:
        return fut.task_id
    if fut.cancelled():
        raise CancelledError(f"an input future was cancelled before it was submitted: {fut!r}")
    exc = fut.exception()
    raise exc if exc is not None else RuntimeError(f"an input future has no task id: {fut!r}")


# -- finding inputs among arguments -------------------------------------------------------

# The walk asks type(obj), never isinstance(obj, ...): a proxy (a skyfn.data Ref) answers
# isinstance by resolving itself, which would fetch -- and for a ref made with evict=True,
# use up -- its object here, in the client.

_INPUTS = (TaskRef, Future)


def _holds(obj: Any, kinds: tuple, depth: int) -> bool:
    """Whether `obj` is, or holds in the containers the worker walks, an object of `kinds`."""
    t = type(obj)
    if issubclass(t, kinds):
        return True
    if depth >= _MAX_DEPTH:
        return False
    if issubclass(t, dict):
        values = obj.values()
    elif issubclass(t, (list, tuple, set, frozenset)):
        values = obj
    else:
        return False
    for x in values:
        if type(x) not in _LEAVES and _holds(x, kinds, depth + 1):
            return True
    return False


def _replace(obj: Any, kinds: tuple, new: Callable[[Any], Any], depth: int = 0) -> Any:
    """`obj` with each object of `kinds` in it replaced by new(that object); containers
    without any come back as they are, the others rebuilt as the worker's substitute()
    rebuilds them (namedtuples, dict subclasses keep their type)."""
    t = type(obj)
    if issubclass(t, kinds):
        return new(obj)
    if depth >= _MAX_DEPTH or not _holds(obj, kinds, depth):
        return obj
    if issubclass(t, list):
        return [_replace(x, kinds, new, depth + 1) for x in obj]
    if issubclass(t, tuple):
        items = [_replace(x, kinds, new, depth + 1) for x in obj]
        return t(*items) if hasattr(obj, "_fields") else tuple(items)
    if issubclass(t, dict):
        out = {k: _replace(v, kinds, new, depth + 1) for k, v in obj.items()}
        if t is dict:
            return out
        try:  # OrderedDict, defaultdict, ...: same type, same order
            copy = obj.copy()
            copy.clear()
            copy.update(out)
            return copy
        except Exception:  # noqa: BLE001 - a mapping subclass that cannot be copied: a plain dict
            return out
    return t(_replace(x, kinds, new, depth + 1) for x in obj)  # set, frozenset


def _any_input(values) -> bool:
    for x in values:
        if type(x) not in _LEAVES and _holds(x, _INPUTS, 0):
            return True
    return False


def find_inputs(args: tuple, kwargs: dict) -> tuple[tuple, dict, list]:
    """(args, kwargs, inputs): the arguments with every future and TaskRef in them replaced
    by ``Input(i)``, ``inputs[i]`` being that object; the same future (or task id) found
    twice is one input. The arguments come back as they are when they hold none."""
    if not (_any_input(args) or (kwargs and _any_input(kwargs.values()))):
        return args, kwargs, []
    found: list = []
    index: dict = {}

    def index_of(obj: Any) -> int:
        tid = obj.task_id if isinstance(obj, TaskRef) else getattr(obj, "task_id", None)
        key = ("id", tid) if tid and not getattr(obj, "by_value", False) else ("obj", id(obj))
        i = index.get(key)
        if i is None:
            i = index[key] = len(found)
            found.append(obj)
        return i

    def placeholder(obj: Any) -> Any:
        if type(obj) is not TaskRef and _succeeded(obj):
            return obj.result()  # the value is here already: no input (and no record it needs to outlive)
        return Input(index_of(obj))

    args = tuple(_replace(a, _INPUTS, placeholder) for a in args)
    kwargs = {k: _replace(v, _INPUTS, placeholder) for k, v in kwargs.items()}
    return args, kwargs, found


def _succeeded(fut: Future) -> bool:
    """A skyfn future whose task already SUCCEEDED here (its result is known)."""
    return issubclass(type(fut), TaskFuture) and fut.done() and not fut.cancelled() and fut.exception() is None


def check_inputs(found: list) -> None:
    """TypeError for a future that is not a skyfn task's (only those can be inputs)."""
    for obj in found:
        if isinstance(obj, Future) and not isinstance(obj, TaskFuture):
            raise TypeError(f"{type(obj).__name__} is not a skyfn future: only an Executor's futures and TaskRefs "
                            "can be arguments that stand for a task's result (wait for this one's result and "
                            "pass the value)")


def by_value(found: list) -> list[int]:
    """Positions of the inputs passed by value: futures of direct-session tasks."""
    return [j for j, obj in enumerate(found) if isinstance(obj, TaskFuture) and obj.by_value]


def settle(args: tuple, kwargs: dict, found: list, values: dict[int, Any]) -> tuple[tuple, dict, list]:
    """The arguments with the inputs of ``values`` (position -> value) put in their places
    and the other placeholders renumbered; the inputs left, in their new order."""
    if not values:
        return args, kwargs, found
    new: dict[int, int] = {}
    left = []
    for j, obj in enumerate(found):
        if j not in values:
            new[j] = len(left)
            left.append(obj)

    def value_of(placeholder: Input) -> Any:
        j = placeholder.index
        return values[j] if j in values else Input(new[j])

    args = tuple(_replace(a, (Input,), value_of) for a in args)
    kwargs = {k: _replace(v, (Input,), value_of) for k, v in kwargs.items()}
    return args, kwargs, left


def input_failure(fut: Future) -> Optional[BaseException]:
    """None when a by-value input `fut` (done) succeeded, else what its dependent ends with:
    DependencyFailed naming it, or CancelledError when it was cancelled (the dependent is
    cancelled too, as the service cancels the dependents of a cancelled task)."""
    exc = None if fut.cancelled() else fut.exception()
    if fut.cancelled() or isinstance(exc, TaskCancelled):
        return CancelledError(f"an input was cancelled: {fut!r}")
    if exc is None:
        return None
    tid = getattr(fut, "task_id", None) or "(never submitted)"
    state = "TIMED_OUT" if isinstance(exc, TaskTimedOut) else "FAILED"
    reason = DEPENDENCY_FAILED.format(input=tid, state=state) + " (the dependent was not submitted)"
    return DependencyFailed("(not submitted)", tid, state, reason, cause=exc)


def bind_inputs(args: tuple, kwargs: dict, timeout: float = ID_WAIT_S) -> tuple[tuple, dict, list[str]]:
    """For a submission made at once (Client.run, Batch.add): (args, kwargs, task ids of the
    inputs). Waits for input futures still being submitted (up to `timeout` each) and for
    the values of by-value ones; raises what makes the task impossible (an input that failed
    to submit, or a by-value input that failed: DependencyFailed)."""
    args, kwargs, found = find_inputs(args, kwargs)
    if not found:
        return args, kwargs, []
    check_inputs(found)
    values = {}
    for j in by_value(found):
        fut = found[j]
        try:
            fut.exception()  # waits; the input's own exception is read below
        except CancelledError:
            pass
        failure = input_failure(fut)
        if failure is not None:
            raise failure
        values[j] = fut.result()
    args, kwargs, found = settle(args, kwargs, found, values)
    names = [obj.task_id if isinstance(obj, TaskRef) else wait_for_id(obj, timeout) for obj in found]
    return args, kwargs, names


def rebase_local_inputs(chunk: list[dict], start: int, ids: list[str]) -> list[dict]:
    """The tasks of a request that starts at task `start` of a longer list: their ``"#k"``
    inputs (k counts in the whole list) renamed ``"#(k - start)"``, or, for a task of an
    earlier request, its id from that request's answer (`ids`)."""
    if start == 0:
        return chunk
    out = []
    for task in chunk:
        names = task.get("inputs")
        if names and any(n.startswith("#") for n in names):
            renamed = []
            for n in names:
                if n.startswith("#"):
                    k = int(n[1:])
                    n = ids[k] if k < start else local_input(k - start)
                renamed.append(n)
            task = {**task, "inputs": renamed}
        out.append(task)
    return out
