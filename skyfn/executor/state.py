"""The state of one Executor that its core and its channels share, and how futures resolve.

``State`` holds, under one lock (``cv``, a Condition on an RLock), what the Executor's
background thread and its callers' threads both touch: the submission queue, the tasks in
flight (POST /tasks not answered yet), the outstanding map (task id -> future), the
cancels to send, the status cursor. The core (skyfn/executor/core.py) owns it and reads and
writes its fields; the channels (push, direct) reach it only through the methods of the
``ChannelPort`` the core hands them (skyfn/executor/channel.py).

Each future resolves exactly once, whichever path delivers its result: a future is popped
from the outstanding map under the lock (``pop_answer``, or a channel's ``take``) and only
then resolved (``resolve``), outside the lock.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Optional

from skyfn.outcomes import FINAL, task_outcome
from skyfn.http import TaskNotFound


class State:
    """Fields guarded by ``cv`` (the core reads a few counters without it, for the progress bar)."""

    def __init__(self) -> None:
        self.cv = threading.Condition(threading.RLock())
        self.queue: list[tuple] = []  # (future, function_id, payload)
        self.first_enqueued = 0.0
        self.last_enqueued = 0.0
        self.flush_now = False
        self.outstanding: dict[str, Future] = {}  # task_id -> future
        self.inflight: list[Future] = []  # taken from the queue, POST /tasks not answered yet
        self.to_cancel: set[str] = set()
        self.deferred: set[Future] = set()  # calls waiting for by-value inputs (skyfn/executor/inputs.py)
        self.shutdown = False
        self.n_submitted = 0
        self.broken: Optional[BaseException] = None
        # the push channel's select on its socket and the wake-up pipe: submissions write to the pipe
        self.selecting = False
        # the position in the service's stream of finished tasks (POST /tasks/status, pushes)
        self.cursor: Optional[str] = None

    def deferring(self) -> bool:
        """Whether calls still wait for by-value inputs (cancelled ones do not count)."""
        return any(not fut.done() for fut in self.deferred)

    def pop_answer(self, answer: dict) -> tuple[list, list]:
        """Pop the futures a POST /tasks/status answer settles: (done, lost), to ``resolve``."""
        tasks = answer.get("tasks") or {}
        unknown = answer.get("unknown") or ()
        done: list[tuple[Future, str, dict]] = []
        with self.cv:
            pop = self.outstanding.pop
            for tid, st in tasks.items():
                if st.get("state") in FINAL:
                    fut = pop(tid, None)
                    if fut is not None:
                        done.append((fut, tid, st))
            lost = [(tid, pop(tid)) for tid in unknown if tid in self.outstanding]
        return done, lost

    def apply_answer(self, answer: dict) -> int:
        """Resolve the futures of a POST /tasks/status answer; returns how many."""
        done, lost = self.pop_answer(answer)
        resolve(done, lost)
        return len(done) + len(lost)


def resolve(done: list, lost: list) -> None:
    """Set outcomes of futures already popped from the outstanding map (so each resolves once):
    ``done`` (future, task id, status), ``lost`` (task id, future) the service no longer knows."""
    for fut, tid, st in done:
        ok, value = task_outcome(tid, st)
        if ok:
            set_result(fut, value)
        else:
            set_exception(fut, value)
    for tid, fut in lost:
        set_exception(fut, TaskNotFound(tid))


def set_result(fut: Future, value: Any) -> None:
    if fut.set_running_or_notify_cancel():
        fut.set_result(value)


def set_exception(fut: Future, exc: BaseException) -> None:
    if fut.done():
        return
    try:
        if fut.set_running_or_notify_cancel():
            fut.set_exception(exc)
    except RuntimeError:  # already running/finished: someone else resolved it
        pass
