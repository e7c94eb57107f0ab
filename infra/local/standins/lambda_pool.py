"""A pool of Lambda execution environments (lambda_worker processes) for one handler.

Why processes: Lambda runs one invocation per environment at a time, and handlers are
written for that (Powertools' resolvers keep the current event and the routing context in
shared state). The gateway serves many connections at once and some requests block for
seconds (long polls), so each concurrent invocation needs its own environment, exactly as
Lambda scales out. Idle environments are reused (warm) last-in first-out; a new one is
started when all are busy, up to `max_workers`; one that dies or overruns its timeout is
replaced. An environment whose variables are this process's own is a fork of a process
that imported the handlers' libraries already (infra/local/standins/lambda_forkserver.py); any other
is a fresh interpreter.
"""
from __future__ import annotations

import logging
import os
import queue
import select
import subprocess
import sys
import threading
from pathlib import Path

from infra.local.standins import lambda_forkserver
from infra.local.standins.lambda_worker import read_frame, write_frame

log = logging.getLogger("skyfn.local.lambda_pool")

REPO_ROOT = Path(__file__).resolve().parents[3]


class HandlerFailed(Exception):
    """The handler raised; `remote_traceback` is its traceback."""

    def __init__(self, message: str, remote_traceback: str):
        super().__init__(message)
        self.remote_traceback = remote_traceback


class HandlerTimedOut(Exception):
    pass


# What a function's environment keeps of ours when it is built like Lambda's (`inherit=False`):
# the process basics, never a SKYFN_, AWS_ or POWERTOOLS_ setting the function was not given.
PROCESS_BASICS = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONWARNINGS",
                  "SKYFN_LOG_LEVEL")


def child_env(extra: dict | None = None, inherit: bool = True) -> dict:
    """The environment of our child processes: ours (or only its PROCESS_BASICS when not
    `inherit`), then `extra`, the repo root importable."""
    base = os.environ if inherit else {k: v for k, v in os.environ.items() if k in PROCESS_BASICS}
    env = dict(base, **(extra or {}))
    path = env.get("PYTHONPATH", "")
    if str(REPO_ROOT) not in path.split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)
    return env


class _Worker:
    def __init__(self, target: str, env: dict | None, start_timeout: float, nice: int = 0, inherit: bool = True):
        req_r, req_w = os.pipe()
        ans_r, ans_w = os.pipe()
        environ = child_env(env, inherit)
        try:
            server = lambda_forkserver.shared(environ, str(REPO_ROOT)) if lambda_forkserver.enabled() else None
            if server is not None:  # a fork of the process that imported the libraries already
                self.proc = server.fork(target, req_r, ans_w, nice, start_timeout)
            else:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "infra.local.standins.lambda_worker", target, str(req_r), str(ans_w)],
                    pass_fds=(req_r, ans_w), stdin=subprocess.DEVNULL, env=environ, cwd=str(REPO_ROOT))
                if nice:
                    os.setpriority(os.PRIO_PROCESS, self.proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + nice)
        except BaseException:
            for fd in (req_w, ans_r):
                os.close(fd)
            raise
        finally:
            os.close(req_r)
            os.close(ans_w)
        self.requests = os.fdopen(req_w, "wb")
        self.answers = os.fdopen(ans_r, "rb", buffering=0)
        kind, *rest = self._read(start_timeout)
        if kind != "ready":
            self.close()
            raise RuntimeError(rest[0] if rest else f"worker for {target} failed to start") from (
                HandlerFailed(rest[0], rest[1]) if len(rest) > 1 else None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self, timeout: float):
        ready, _, _ = select.select([self.answers], [], [], timeout)  # unbuffered: select is exact
        if not ready:
            raise HandlerTimedOut(f"no answer within {timeout:.1f} s")
        frame = read_frame(self.answers)
        if frame is None:
            code = self.proc.poll()
            raise EOFError(f"the handler process {self.pid} exited" + (f" with code {code}" if code is not None else ""))
        return frame

    def invoke(self, event: dict, function_name: str, timeout: float, request_id: str):
        write_frame(self.requests, (event, function_name, timeout, request_id))
        kind, *rest = self._read(timeout + 1.0)
        if kind == "ok":
            return rest[0]
        raise HandlerFailed(rest[0], rest[1])

    def close(self, timeout: float = 3.0) -> None:
        for stream in (self.requests, self.answers):
            try:
                stream.close()
            except OSError:
                pass
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout)  # EOF on its request pipe ends it
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class InProcess:
    """Invoke a handler callable in the calling thread (at most `concurrency` at once, if
    set): for handlers known to be thread-safe, and for tests."""

    def __init__(self, handler, concurrency: int | None = None):
        self.handler = handler
        self._limit = threading.BoundedSemaphore(concurrency) if concurrency else None

    def start(self) -> "InProcess":
        return self

    def invoke(self, event: dict, function_name: str, timeout: float, request_id: str):
        from infra.local.standins.events import LocalLambdaContext

        context = LocalLambdaContext(function_name, timeout, request_id=request_id)
        if self._limit is None:
            return self.handler(event, context)
        with self._limit:
            return self.handler(event, context)

    def pids(self) -> list[int]:
        return []

    def close(self) -> None:
        pass


class LambdaPool:
    """Invoke `target` ("module:attr") in up to `max_workers` environments at once. Their
    environment is ours plus `env`, or, with `inherit=False`, `env` alone (plus the process
    basics), as Lambda builds a function's from its configuration."""

    def __init__(self, target: str, *, min_workers: int = 2, max_workers: int = 16, env: dict | None = None,
                 start_timeout: float = 60.0, reuse_wait: float = 0.05, nice: int = 0, inherit: bool = True):
        self.target = target
        self.min_workers = max(1, min_workers)
        self.max_workers = max(self.min_workers, max_workers)
        self.env = env
        self.start_timeout = start_timeout
        self.reuse_wait = reuse_wait
        self.nice = nice  # lower priority of its environments (background work)
        self.inherit = inherit
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> "LambdaPool":
        """Start the `min_workers` environments at once (each is a process importing the
        handler: on a machine with several cores they start side by side); return when they
        are ready. One that fails is logged; if all fail, the first failure is raised here (an
        import error of the handler surfaces now, not at the first invocation)."""
        errors: list[BaseException] = []

        def one() -> None:
            try:
                self._add(_Worker(self.target, self.env, self.start_timeout, self.nice, self.inherit))
            except BaseException as exc:  # noqa: BLE001 - raised below when no environment started
                errors.append(exc)

        threads = [threading.Thread(target=one, name=f"start-{self.target}", daemon=True)
                   for _ in range(self.min_workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if len(errors) == len(threads):
            raise errors[0]
        for exc in errors:
            log.error("starting a handler environment for %s failed: %s: %s", self.target, type(exc).__name__, exc)
        return self

    def _add(self, worker: _Worker) -> None:
        with self._lock:
            self._all.add(worker)
        self._idle.put(worker)

    def _grow_idle(self) -> None:
        try:
            self._add(_Worker(self.target, self.env, self.start_timeout, self.nice, self.inherit))
        except Exception:
            log.exception("starting a handler environment for %s failed", self.target)

    def pids(self) -> list[int]:
        with self._lock:
            return [w.pid for w in self._all if isinstance(w, _Worker)]

    def _acquire(self) -> _Worker:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        try:
            return self._idle.get(timeout=self.reuse_wait)
        except queue.Empty:
            pass
        with self._lock:
            grow = len(self._all) < self.max_workers and not self._closed
            if grow:
                placeholder = object()
                self._all.add(placeholder)  # reserve the slot while the process starts
        if not grow:
            return self._idle.get()
        try:
            worker = _Worker(self.target, self.env, self.start_timeout, self.nice, self.inherit)
        finally:
            with self._lock:
                self._all.discard(placeholder)
        with self._lock:
            self._all.add(worker)
        log.info("all %s environments busy: started another (%d now)", self.target, len(self._all))
        return worker

    def invoke(self, event: dict, function_name: str, timeout: float, request_id: str):
        if self._closed:
            raise RuntimeError("the handler pool is closed")
        worker = self._acquire()
        healthy = False
        try:
            answer = worker.invoke(event, function_name, timeout, request_id)
            healthy = True
            return answer
        except HandlerFailed:
            healthy = True
            raise
        finally:
            if healthy and not self._closed:
                self._idle.put(worker)
            else:
                self._discard(worker)

    def _discard(self, worker: _Worker) -> None:
        with self._lock:
            self._all.discard(worker)
        if worker.proc.poll() is None:
            worker.proc.kill()
        worker.close()
        if not self._closed:
            threading.Thread(target=self._grow_idle, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        with self._lock:
            workers = [w for w in self._all if isinstance(w, _Worker)]
            self._all.clear()
        for w in workers:
            w.close()
