"""agent.pid: one agent per endpoint, enforced with an exclusive lock on the pid file.

The running agent holds an flock on agent.pid for its whole life and writes its pid in
it. The kernel drops the lock when the process dies, however it dies, so a stale pid
file (left by SIGKILL) is simply taken over; a live one makes a second `start` fail.
Readers (status, stop, list) test the lock rather than trust the pid alone, so a
recycled pid is not mistaken for an agent.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path


class AlreadyRunning(Exception):
    def __init__(self, path: Path, pid: int | None):
        super().__init__(f"an agent is already running for this endpoint (pid {pid}, pid file {path})")
        self.pid = pid


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def is_locked(path: Path) -> bool:
    """True when a live process holds the pid file's lock (an agent is running)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def running_pid(path: Path) -> int | None:
    """The pid of the running agent, or None when none runs."""
    return read_pid(path) if is_locked(path) else None


class PidFile:
    """Held for the agent's lifetime: `with PidFile(path): run()`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise AlreadyRunning(self.path, read_pid(self.path)) from None
            # The file we locked must still be the one at the path (an exiting agent unlinks it).
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> "PidFile":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
