"""What the Executor's core gives each of its result channels (push, direct): ``ChannelPort``.

A channel (skyfn/executor/push.py, skyfn/executor/direct.py) gets one port from the core
when the Executor is made and touches nothing else of it. Through the port it may:

- read the service client (``client``), the batch size, the task options and the idle time
  after which the core's thread ends (``idle_exit``);
- see what is outstanding (``has_outstanding``, ``outstanding_ids``, ``holds``) and take a
  task's future out of the outstanding map (``take``); ``lock`` makes several of these one
  step (it is re-entrant: the methods take it themselves too);
- read and move the status cursor (``cursor``);
- resolve futures it took (``resolve``) or a POST /tasks/status answer (``apply_answer``);
- hand tasks back to the service path (``to_service``);
- say it is about to wait on its socket (``begin_select``/``end_select``: submissions
  then wake it through the core's wake-up pipe);
- drive the progress bar (``open_bar``, ``update_bar``, ``close_bar``).

A future is popped from the outstanding map under the lock before it is resolved, so each
resolves exactly once whichever path delivers its result (skyfn/executor/state.py).
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Callable, Optional

from skyfn.executor.progress import ProgressBar
from skyfn.executor.state import State, resolve


class ChannelPort:
    def __init__(self, state: State, client: Any, *, batch_size: int, idle_exit: float,
                 task_options: Callable[[], dict], to_service: Callable[[list], None], bar: ProgressBar,
                 owner: str):
        self._state = state
        self.client = client
        self.batch_size = batch_size
        self.idle_exit = idle_exit
        self._task_options = task_options
        self._to_service = to_service
        self._bar = bar
        self._owner = owner  # the name this channel drives the progress bar with

    # -- the outstanding map ----------------------------------------------------------
    @property
    def lock(self):
        """The core's lock (a Condition on an RLock): hold it to make several calls one step."""
        return self._state.cv

    def has_outstanding(self) -> bool:
        with self._state.cv:
            return bool(self._state.outstanding)

    def outstanding_ids(self) -> list[str]:
        with self._state.cv:
            return list(self._state.outstanding)

    def holds(self, task_id: str) -> bool:
        with self._state.cv:
            return task_id in self._state.outstanding

    def take(self, task_id: Optional[str]) -> Optional[Future]:
        """Pop the future of `task_id` from the outstanding map (None if it is not there):
        the caller resolves it (``resolve``), nobody else will."""
        with self._state.cv:
            return self._state.outstanding.pop(task_id, None)

    @property
    def cursor(self) -> Optional[str]:
        return self._state.cursor

    @cursor.setter
    def cursor(self, value: Optional[str]) -> None:
        self._state.cursor = value

    # -- results ----------------------------------------------------------------------
    @staticmethod
    def resolve(done: list, lost: list) -> None:
        """Set outcomes of futures already taken: ``done`` (future, task id, status), ``lost``
        (task id, future)."""
        resolve(done, lost)

    def apply_answer(self, answer: dict) -> int:
        """Resolve the outstanding futures a POST /tasks/status answer settles; returns how many."""
        return self._state.apply_answer(answer)

    def to_service(self, items: list[tuple]) -> None:
        """Hand (future, function id, payload) submissions back to the service path, at once."""
        self._to_service(items)

    @property
    def task_options(self) -> dict:
        """The options applied to every task ({"cores", "gpus", "walltime"} when set)."""
        return self._task_options()

    # -- waiting ----------------------------------------------------------------------
    def begin_select(self) -> Optional[bool]:
        """About to wait on the channel's socket: None when submissions or cancels wait to be
        sent (do not wait), else whether tasks are outstanding; a submission from now on
        writes to the core's wake-up pipe. Pair it with ``end_select``."""
        st = self._state
        with st.cv:
            if st.queue or st.to_cancel:
                return None
            st.selecting = True
            return bool(st.outstanding)

    def end_select(self) -> None:
        with self._state.cv:
            self._state.selecting = False

    # -- progress bar -----------------------------------------------------------------
    def open_bar(self) -> None:
        self._bar.open(self._owner)

    def update_bar(self, idle: bool = False) -> None:
        self._bar.update(idle=idle)

    def close_bar(self) -> None:
        self._bar.close()
