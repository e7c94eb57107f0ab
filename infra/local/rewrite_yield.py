"""The embedded runtime's redis-server rewrites its append-only file in a forked child (every
~100 s under a sustained load, 1-3 s of a core each). On a machine whose cores the whole
runtime shares, that child competed with Redis itself and with every process of the task
path: Redis's main thread waited for a core as long as it ran, and the probes of
benchmarks/soak.py that fell in a rewrite took 3-10x their usual time. On AWS, ElastiCache
has cores of its own.

`RewriteYield` watches the redis-server recorded in the runtime's pid file (following it
across restarts) and puts each child it forks at SCHED_IDLE: it runs only on a core no one
else wants. Its parent, the data and the file are untouched, so the rewrite's result is the
same; on a machine kept fully busy it finishes once the load eases, and meanwhile the file
keeps growing on disk. Linux only (it reads /proc/<pid>/task/<pid>/children); elsewhere it
logs once and stops."""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from pathlib import Path

from infra.local.processes import recorded_process

log = logging.getLogger("skyfn.local.rewrite_yield")

POLL_S = 0.05  # a rewrite lasts a second or more: caught within its first 5 %
RECHECK_S = 1.0  # how often the pid file is read again (a restart, or a SIGKILLed server left a zombie)


class RewriteYield:
    def __init__(self, redis_pidfile: Path, poll_s: float = POLL_S):
        self.pidfile = Path(redis_pidfile)
        self.poll_s = poll_s
        self.yielded: deque[int] = deque(maxlen=64)  # the last children put at SCHED_IDLE, oldest first
        self._seen: set[int] = set()  # children alive at the last look, each lowered once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "RewriteYield":
        if not hasattr(os, "sched_setscheduler") or not Path("/proc/self/task").is_dir():
            log.info("not on Linux: the append-only file's rewrites run at the default priority")
            return self
        self._thread = threading.Thread(target=self._run, name="skyfn-rewrite-yield", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _run(self) -> None:
        pid, checked = None, 0.0
        while not self._stop.wait(self.poll_s):
            if pid is None or time.monotonic() - checked >= RECHECK_S:
                proc = recorded_process(self.pidfile)
                pid, checked = (proc.pid if proc is not None else None), time.monotonic()
                if pid is None:
                    continue
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except FileNotFoundError:  # redis-server exited: look for its successor
                pid = None
                continue
            except OSError as exc:  # no children file in this kernel
                log.info("cannot list redis-server's children (%s): its rewrites run at the default priority", exc)
                return
            alive = set(map(int, children))
            for child in alive - self._seen:
                self._idle(child)
            self._seen = alive

    def _idle(self, child: int) -> None:
        try:
            os.sched_setscheduler(child, os.SCHED_IDLE, os.sched_param(0))
        except ProcessLookupError:  # the rewrite already ended
            return
        except PermissionError as exc:  # not our process (another user's redis on this pid file)
            log.warning("cannot lower redis-server's child %d: %s", child, exc)
            return
        self.yielded.append(child)
        log.debug("redis-server's child %d (an append-only file rewrite) runs at SCHED_IDLE", child)
