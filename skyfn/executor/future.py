"""The Executor's future: one skyfn task, cancelled remotely with it, usable as another call's argument."""
from __future__ import annotations

from typing import Any, Optional

from skyfn.dataflow import TaskFuture


class SkyfnFuture(TaskFuture):
    """A Future for one skyfn task; ``task_id`` is set once the task is submitted.
    ``cancel()`` on a pending future also cancels the remote task. Passed as an argument
    of another call, it stands for its result (skyfn.dataflow)."""

    def __init__(self) -> None:
        super().__init__()
        self._executor: Any = None  # its Executor (skyfn/executor/core.py): cancel() tells it
        self.data_locations: Optional[dict[str, int]] = None  # endpoint id -> bytes of its refs there

    def cancel(self) -> bool:
        if not super().cancel():
            return False
        ex, tid = self._executor, self.task_id
        if ex is not None and tid is not None:
            ex._request_cancel(tid)
        return True

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f" task_id={self.task_id}>"
