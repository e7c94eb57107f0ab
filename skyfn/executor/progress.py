"""The Executor's progress bar (tqdm), driven from one thread only.

That thread is the direct channel's when the executor has one (it sees every task: those it
sends and those it hands back to the service path), else the core's background thread. Each
asks with its own name (``owner``: "executor" or "direct"); the other one's calls are no-ops.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, TextIO, Union

from skyfn.executor.state import State


class ProgressBar:
    def __init__(self, progress: Union[bool, TextIO], state: State, direct: Callable[[], Any]):
        self.progress = progress
        self.state = state
        self._direct = direct  # the executor's direct channel, or None
        self.bar = None

    def open(self, owner: str = "executor") -> None:
        if not self.progress or owner != ("direct" if self._direct() is not None else "executor"):
            return
        from tqdm.auto import tqdm

        kwargs: dict[str, Any] = {"total": 0, "unit": "task", "desc": "skyfn", "dynamic_ncols": True}
        if self.progress is not True and hasattr(self.progress, "write"):
            kwargs["file"] = self.progress
        self.bar = tqdm(**kwargs)

    def update(self, idle: bool = False) -> None:
        bar = self.bar
        if bar is None:
            return
        st = self.state
        total = st.n_submitted
        done = total - len(st.queue) - len(st.inflight) - len(st.outstanding)
        direct: Optional[Any] = self._direct()
        if direct is not None:
            done -= direct.pending()
        if bar.total != total:
            bar.total = total
        if done != bar.n:
            bar.update(done - bar.n)
        if idle:
            bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            try:
                self.update()
                self.bar.close()
            finally:
                self.bar = None
