"""The Executor's dataflow: submissions whose arguments hold futures, and naming their inputs when sent.

A call whose arguments hold skyfn futures or TaskRefs (found by skyfn.dataflow) is queued
like any other, its payload holding ``Input(i)`` placeholders and its future listing the
inputs (``TaskFuture.inputs``); it always goes through the service, never the direct
channel, since the service is what holds it WAITING. The core's thread names the inputs
of each request just before sending it (``name_inputs``): a task id when the input has
one, ``"#k"`` when it is the k-th task of the same request (so a chain of N calls goes in
one request), and otherwise -- a future of another Executor still in its queue -- its id
once that Executor sent it (``skyfn.dataflow.wait_for_id``, bounded; what was named before
it is sent first, so two Executors waiting for each other's futures both move on). An input that
failed to submit fails its dependent with the same error; one cancelled before it was
submitted cancels it.

Inputs *by value* (``Deferred``): a direct session's task (``Executor(direct=True)``) has
no id the service knows, so a call taking its future waits here, off the caller's
thread: once every such input is done, their values are put in their places and the call
is queued for the service (with the placeholders of its other inputs). Until then the
call's own future is by-value too (a call taking it waits the same way), counts as
outstanding, and ``shutdown(wait=True)`` waits for it.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import CancelledError, Future
from typing import Any, Callable, Optional

from skyfn.dataflow import ID_WAIT_S, TaskFuture, TaskRef, by_value, check_inputs, input_failure, settle, wait_for_id
from skyfn.executor.state import State, set_exception
from skyfn.protocol.dataflow import local_input

log = logging.getLogger("skyfn.executor")


def end(fut: Future, exc: BaseException) -> None:
    """A dependent that will not be submitted: cancelled with its input, else failed."""
    if isinstance(exc, CancelledError):
        fut.cancel()
    else:
        set_exception(fut, exc)


def name_inputs(items: list[tuple], tasks: list[dict], send: Callable[[list, list, int], None],
                wait: float = ID_WAIT_S) -> None:
    """Send the (items, tasks) of one request with every task's ``inputs`` named (task id
    or ``"#k"``), through ``send(items, tasks, taken)`` -- `taken` counts the items it
    accounts for, left-out ones included. A task whose input cannot be named (it failed to
    submit, was cancelled, or got no id within `wait` seconds) is left out and its future
    ended here, before the tasks after it are named (one may take it as an input). Before
    waiting for another Executor's future, the tasks named so far are sent: that Executor
    may itself be waiting for one of them."""
    at: dict[int, int] = {}  # id(future) -> its index in the request being made
    kept_items: list = []
    kept_tasks: list = []
    taken = 0
    for item, task in zip(items, tasks):
        fut = item[0]
        if fut.inputs:
            if taken and any(_unsent(x, at) for x in fut.inputs):
                send(kept_items, kept_tasks, taken)
                at, kept_items, kept_tasks, taken = {}, [], [], 0
            try:
                task = {**task, "inputs": [_name(x, at, wait) for x in fut.inputs]}
            except BaseException as exc:  # noqa: BLE001 - whatever it is, it is this task's end
                end(fut, exc)
                taken += 1
                continue
            fut.inputs = None  # named: a long chain of futures need not keep every one alive
        at[id(fut)] = len(kept_items)
        kept_items.append(item)
        kept_tasks.append(task)
        taken += 1
    if taken:
        send(kept_items, kept_tasks, taken)


def _unsent(x: Any, at: dict[int, int]) -> bool:
    """An input future of another Executor that has no id yet (one must wait for it)."""
    return isinstance(x, Future) and id(x) not in at and getattr(x, "task_id", None) is None and not x.done()


def _name(x: Any, at: dict[int, int], wait: float) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, TaskRef):
        return x.task_id
    k = at.get(id(x))
    if k is not None:
        return local_input(k)
    return wait_for_id(x, wait)


class Deferred:
    """Calls waiting for the values of by-value inputs (module docstring); one per Executor.
    `pack` makes a call's payload, `enqueue` queues items for the service path."""

    def __init__(self, state: State, owner: Any, pack: Callable[[TaskFuture, tuple, dict], str],
                 enqueue: Callable[[list], None]):
        self._state = state
        self._owner = owner
        self._pack = pack
        self._enqueue = enqueue

    def item(self, fut: TaskFuture, fid: str, args: tuple, kwargs: dict, found: list) -> Optional[tuple]:
        """The queue item of a call with inputs `found` (skyfn.dataflow.find_inputs), or None
        when it waits for by-value inputs (queued once they are done)."""
        check_inputs(found)
        waits = by_value(found)
        if not waits:
            fut.inputs = found
            return fut, fid, self._pack(fut, args, kwargs)
        st = self._state
        with st.cv:
            if st.broken is not None:
                raise RuntimeError(f"this skyfn Executor stopped after an internal error: {st.broken!r}")
            if st.shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            fut._executor = self._owner
            fut.by_value = True  # no id to name it by until it is queued
            st.deferred.add(fut)
            st.n_submitted += 1
        _when_done([found[j] for j in waits], lambda: self._release(fut, fid, args, kwargs, found, waits))
        return None

    def _release(self, fut: TaskFuture, fid: str, args: tuple, kwargs: dict, found: list, waits: list[int]) -> None:
        st = self._state
        with st.cv:
            if fut not in st.deferred:  # the executor failed it meanwhile
                return
        try:
            if fut.cancelled():
                return self._drop(fut, None)
            values = {}
            for j in waits:
                failure = input_failure(found[j])
                if failure is not None:
                    return self._drop(fut, failure)
                values[j] = found[j].result()
            args, kwargs, left = settle(args, kwargs, found, values)
            fut.inputs = left or None
            item = (fut, fid, self._pack(fut, args, kwargs))
            self._enqueue([item])
        except BaseException as exc:  # noqa: BLE001 - a callback's error would only be logged: end the future
            log.debug("a call waiting for by-value inputs cannot be submitted: %r", exc)
            self._drop(fut, exc)

    def _drop(self, fut: TaskFuture, exc: Optional[BaseException]) -> None:
        st = self._state
        with st.cv:
            if fut in st.deferred:
                st.deferred.discard(fut)
                st.n_submitted -= 1
            st.cv.notify_all()
        if exc is not None:
            end(fut, exc)


def _when_done(futs: list[Future], then: Callable[[], None]) -> None:
    """Call `then` once every future of `futs` is done, in the thread that finished the last."""
    left = [len(futs)]
    lock = threading.Lock()

    def one(_: Future) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            then()

    for f in futs:
        f.add_done_callback(one)
