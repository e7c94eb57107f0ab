"""Running a rendezvous server: in the foreground (the CLI), in a background thread, or in
a child process (tests and benchmarks).

uvloop is used when installed (it is pinned in requirements.txt); `loop="asyncio"` forces
the standard loop.
"""
from __future__ import annotations

import asyncio
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional, Union

from .server import Limits, RendezvousServer

SECRET_ENV = "SKYFN_RENDEZVOUS_SECRET"


def new_event_loop(loop: str = "auto") -> asyncio.AbstractEventLoop:
    if loop not in ("auto", "uvloop", "asyncio"):
        raise ValueError(f"loop must be auto, uvloop or asyncio, not {loop!r}")
    if loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if loop == "uvloop":
                raise RuntimeError("uvloop is not installed: pip install uvloop (see requirements.txt)")
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def raise_fd_limit() -> int:
    """Raise this process's open-file soft limit to the hard limit (thousands of peers)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def run(host: str, port: int, secret: Union[str, bytes], limits: Optional[Limits] = None,
        loop: str = "auto", port_file: Optional[str] = None) -> None:
    """Serve in the foreground until SIGINT/SIGTERM."""
    raise_fd_limit()
    ev = new_event_loop(loop)
    server = RendezvousServer(secret, limits)

    async def main():
        _, bound = await server.start(host, port)
        if port_file:
            tmp = port_file + ".tmp"
            with open(tmp, "w") as f:
                f.write(f"{bound}\n")
            os.replace(tmp, port_file)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            ev.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.stop()

    try:
        ev.run_until_complete(main())
    finally:
        ev.close()


class ThreadHandle:
    """A server running on its own event loop in a daemon thread."""

    def __init__(self, host: str, port: int, server: RendezvousServer, loop: asyncio.AbstractEventLoop,
                 thread: threading.Thread):
        self.host, self.port, self.server, self._loop, self._thread = host, port, server, loop, thread

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        if not self._thread.is_alive():
            return
        fut = asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop)
        fut.result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def serve_in_thread(host: str, port: int, secret: Union[str, bytes], limits: Optional[Limits] = None,
                    loop: str = "auto") -> ThreadHandle:
    """Start a server in a background thread; returns once it listens (port 0 = any free port)."""
    raise_fd_limit()
    ev = new_event_loop(loop)
    server = RendezvousServer(secret, limits)
    bound = ev.run_until_complete(server.start(host, port))

    def body():
        asyncio.set_event_loop(ev)
        try:
            ev.run_forever()
        finally:
            ev.close()

    thread = threading.Thread(target=body, name="rendezvous", daemon=True)
    thread.start()
    return ThreadHandle(bound[0], bound[1], server, ev, thread)


class ProcessHandle:
    """A server running as `python -m rendezvous` in a child process."""

    def __init__(self, host: str, port: int, proc: subprocess.Popen):
        self.host, self.port, self.proc = host, port, proc

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def serve_in_process(host: str, port: int, secret: str, log_level: str = "warning",
                     join_timeout_s: float = 60.0, loop: str = "auto", timeout: float = 20.0,
                     stderr=None) -> ProcessHandle:
    """Start `python -m rendezvous` (secret passed by environment, not argv); wait until it listens."""
    with tempfile.TemporaryDirectory(prefix="rendezvous-") as tmp:
        port_file = os.path.join(tmp, "port")
        env = dict(os.environ, **{SECRET_ENV: secret})
        cmd = [sys.executable, "-m", "rendezvous", "--host", host, "--port", str(port), "--port-file", port_file,
               "--log-level", log_level, "--join-timeout", str(join_timeout_s), "--loop", loop]
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + timeout
        while not os.path.exists(port_file):
            if proc.poll() is not None:
                raise RuntimeError(f"rendezvous server exited with code {proc.returncode} before listening")
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"rendezvous server did not listen within {timeout:g} s")
            time.sleep(0.02)
        with open(port_file) as f:
            bound = int(f.read())
    return ProcessHandle(host, bound, proc)
