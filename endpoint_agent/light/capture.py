"""What a task prints, captured per thread: the light agent runs tasks of many endpoints at
once on the threads of one process, where sys.stdout and sys.stderr are shared.

`install()` (once per process, idempotent; `begin` installs again streams replaced since) replaces sys.stdout and sys.stderr with streams
that write to the calling thread's capture when it has one (`begin`/`end` around a task,
each a CappedWriter of the worker: the same cap and truncation marker as a worker
process), and to the original stream otherwise. Logging handlers made before keep the
original streams.
"""
from __future__ import annotations

import sys
import threading
from typing import Optional

from endpoint_agent.manager.worker import CappedWriter

_local = threading.local()
_lock = threading.Lock()


class _Routed:
    """A text stream: the thread's capture when one is on, else the original stream."""

    def __init__(self, which: str, original):
        self._which = which
        self._original = original

    def _target(self):
        cap = getattr(_local, self._which, None)
        return cap if cap is not None else self._original

    def write(self, s) -> int:
        return self._target().write(s)

    def writelines(self, lines) -> None:
        self._target().writelines(lines)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name):  # encoding, isatty, fileno, ... of the stream written to
        return getattr(self._target(), name)


def install() -> None:
    with _lock:
        if not isinstance(sys.stdout, _Routed):
            sys.stdout = _Routed("out", sys.stdout)
        if not isinstance(sys.stderr, _Routed):
            sys.stderr = _Routed("err", sys.stderr)


def begin(cap: int) -> None:
    """Capture what this thread prints from now on, `cap` characters per stream at most
    (installing the routed streams again if someone put others in their place since)."""
    if not isinstance(sys.stdout, _Routed) or not isinstance(sys.stderr, _Routed):
        install()
    _local.out, _local.err = CappedWriter(cap), CappedWriter(cap)


def end() -> tuple[Optional[str], Optional[str]]:
    """(stdout, stderr) captured since `begin` (None for a stream nothing was written to)."""
    out, err = _local.out, _local.err
    _local.out = _local.err = None
    return out.take(), err.take()
