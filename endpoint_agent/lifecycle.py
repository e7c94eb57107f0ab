"""A running endpoint process's life: its state, stopping on request or signal, the status file.

What an agent (agent.py) and a multi-user endpoint (multiuser/endpoint.py) share besides
their service session (service/session.py). `stop()` is thread-safe and signal-safe; a
first SIGTERM/SIGINT asks for a graceful stop, a second one ends the grace period at once
(`grace_deadline` = 0). The status file (status.py) is written from the `status` callable
of the process that holds this part.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any, Callable

from endpoint_agent.paths import EndpointPaths
from endpoint_agent.status import write_status

log = logging.getLogger("skyfn.agent")

STATUS_PERIOD_S = 2.0  # the status file is rewritten at least this often while running


class Lifecycle:
    def __init__(self, paths: EndpointPaths, grace_period: float, status: Callable[[], dict[str, Any]], *,
                 write_status_file: bool = True):
        self.paths = paths
        self.grace_period = grace_period
        self._status = status
        self.write_status_file = write_status_file
        self.stopping = threading.Event()
        self.started = time.time()
        self.state = "starting"
        self.grace_deadline: float | None = None  # when unfinished tasks are given up on

    def stop(self) -> None:
        """Ask the process to stop gracefully (thread-safe, signal-safe)."""
        self.stopping.set()

    def catch_signals(self) -> None:
        """SIGTERM and SIGINT stop the process, when it runs in the main thread."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        if self.stopping.is_set():
            log.warning("second %s: stopping now without waiting for tasks", signal.Signals(signum).name)
            self.grace_deadline = 0.0
        else:
            log.info("%s received: stopping gracefully (grace period %g s)", signal.Signals(signum).name,
                     self.grace_period)
        self.stop()

    def head(self, session) -> dict[str, Any]:
        """The fields every status file opens with (`session`: service/session.py's ServiceSession)."""
        return {"name": session.name, "pid": os.getpid(), "endpoint_id": session.endpoint_id, "state": self.state,
                "started": self.started, "updated": time.time(), "consumer": session.consumer}

    def uptime(self) -> float:
        return round(time.time() - self.started, 1)

    def write_status(self) -> None:
        if not self.write_status_file:
            return
        try:
            self.paths.ensure()
            write_status(self.paths.status, self._status())
        except OSError as exc:
            log.warning("cannot write %s: %s", self.paths.status, exc)
