"""Process helpers shared by the agent, manager and workers: tie a child's life to its
parent's, build the environment children need to import skyfn, describe an exit code."""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: ask the kernel to send `sig` when our parent dies (no orphaned workers
    after an agent is SIGKILLed). Elsewhere a no-op; callers also watch getppid()."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except Exception:
        pass


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a manager or worker: ours, with the directory holding the
    endpoint_agent and skyfn packages first on PYTHONPATH so `python -m` finds them
    whatever the working directory is."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        parts.insert(0, root)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update(extra)
    return env


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists and is not a zombie."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:
        return True


def serve_until_signalled(ready: dict, ready_file: str | None) -> None:
    """A standalone server's main loop: announce `ready` (one JSON line on stdout, and in
    `ready_file` when given, written atomically), then wait for SIGINT or SIGTERM."""
    import json
    import threading

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if ready_file:
        tmp = ready_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(ready, f)
        os.replace(tmp, ready_file)
    print(json.dumps(ready), flush=True)
    while not stop.wait(1.0):
        pass
