"""A fork server for Lambda execution environments (infra/local/standins/lambda_pool.py).

Every environment used to be a fresh interpreter that imported boto3, redis, pydantic,
PyJWT and Powertools before its handler: ~0.3 s of CPU each, four of them at every start
of the embedded runtime (two API environments, the reaper's, the history's) and one more
each time the gateway scales out. The fork server is one interpreter that imports those
libraries once (PRELOAD) and forks an environment per request; the fork imports only its
handler's own modules. What a fork shares with the server, and why that is safe:

- its environment variables, exactly: the server serves only requests whose environment
  equals the one it was started with (the pool compares them; any other is started by
  exec as before), so every module imported before the fork saw what it would have seen;
- only libraries and skyfn.protocol are imported before the fork, never the handler's
  modules (they read settings and build their loggers at import);
- the interpreter (PYTHON* settings: the same environment) and the hash seed, as
  multiprocessing's forkserver children share theirs; `random` is reseeded in every fork
  by CPython itself;
- nothing else: the server runs one thread (forking is safe), holds no connection, and a
  fork closes the server's descriptors before it starts.

    python -m infra.local.standins.lambda_forkserver FD     (FD: its end of a SOCK_SEQPACKET pair)

Protocol, one message each way per datagram (JSON, with descriptors as SCM_RIGHTS):
request {"target", "nice"} + [request pipe read end, answer pipe write end] → answer
{"pid"} or {"error"}; and, unasked, {"exited": pid, "code": code} when a fork ends (the
server reaps its forks; the pool learns their exit status from it). The server exits when
its socket closes (the pool's process is gone); its forks then end with their pipes.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback

log = logging.getLogger("skyfn.local.forkserver")

# Libraries the handlers import that read no settings at import. Not lambdas.*: the handlers'
# modules are imported by each fork, after it is one.
PRELOAD = ("boto3", "boto3.session", "botocore.client", "botocore.session", "s3transfer.manager", "redis",
           "redis.asyncio", "pydantic", "jwt", "jwt.algorithms", "cryptography.x509", "orjson", "requests", "yaml",
           "aws_lambda_powertools.event_handler", "aws_lambda_powertools.event_handler.openapi.params",
           "skyfn.protocol")

_MAX = 1 << 16


def enabled() -> bool:
    """Linux (fork, SCM_RIGHTS, SOCK_SEQPACKET), unless SKYFN_LAMBDA_FORK=0."""
    return sys.platform == "linux" and os.environ.get("SKYFN_LAMBDA_FORK", "1") != "0"


class Forked:
    """A fork of the server, as lambda_pool uses a subprocess.Popen: pid, poll, wait, kill.
    Its exit status comes from the server; if the server is gone first (killed), the fork
    was handed to init, and it is looked at by its pid (exit status unknown: -1)."""

    ORPHAN_POLL_S = 0.05

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._exited = threading.Event()
        self._orphaned = False

    def _ended(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def _orphan(self) -> None:
        self._orphaned = True
        self.poll()

    def poll(self) -> int | None:
        if self.returncode is None and self._orphaned:
            import psutil

            try:  # exited: gone, or a zombie its new parent has not reaped yet
                if psutil.Process(self.pid).status() == psutil.STATUS_ZOMBIE:
                    self._ended(-1)
            except psutil.NoSuchProcess:
                self._ended(-1)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._exited.wait(self.ORPHAN_POLL_S if self._orphaned else
                                    (None if deadline is None else max(0.0, deadline - time.monotonic()))):
            if self.poll() is not None:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"environment {self.pid}", timeout)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)  # not reaped yet (no exit notice): still its pid
            except ProcessLookupError:
                pass


class ForkServer:
    """The pool side: starts the server with this process's environment (`env`, as a pool
    would give an environment) and asks it for forks."""

    def __init__(self, env: dict, cwd: str):
        self.env = dict(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "infra.local.standins.lambda_forkserver", str(theirs.fileno())],
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=self.env, cwd=cwd)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self._lock = threading.Lock()  # one request at a time: answers come back in order
        self._answers: list[dict] = []
        self._answered = threading.Condition()
        self._forks: dict[int, Forked] = {}
        self._codes: dict[int, int] = {}  # exits noticed before their fork's answer was read
        self._asking = 0  # fork requests not yet answered
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="skyfn-forkserver", daemon=True)
        self._reader.start()

    def serves(self, env: dict) -> bool:
        return not self._closed and env == self.env

    def idle(self) -> bool:
        """No fork of ours still runs (closing the server now loses no exit status)."""
        with self._answered:
            return not self._forks and not self._asking

    def fork(self, target: str, request_fd: int, answer_fd: int, nice: int, timeout: float) -> Forked:
        """A new environment for `target` on these pipe ends (still ours to close)."""
        with self._answered:
            self._asking += 1
        try:
            with self._lock:
                socket.send_fds(self.sock, [json.dumps({"target": target, "nice": nice}).encode()],
                                [request_fd, answer_fd])
                with self._answered:
                    if not self._answered.wait_for(lambda: self._answers or self._closed, timeout):
                        raise TimeoutError(f"the fork server did not answer within {timeout:.0f} s")
                    if not self._answers:
                        raise RuntimeError("the fork server is gone")
                    answer = self._answers.pop(0)
            if "error" in answer:
                raise RuntimeError(f"the fork server could not fork: {answer['error']}")
            forked = Forked(answer["pid"])
            with self._answered:
                if forked.pid in self._codes:  # it has ended already
                    forked._ended(self._codes.pop(forked.pid))
                else:
                    self._forks[forked.pid] = forked
            return forked
        finally:
            with self._answered:
                self._asking -= 1

    def _read(self) -> None:
        try:
            while True:
                data = self.sock.recv(_MAX)
                if not data:
                    break
                message = json.loads(data)
                with self._answered:
                    if "exited" in message:
                        fork = self._forks.pop(message["exited"], None)
                        if fork is None:
                            self._codes[message["exited"]] = message["code"]
                        else:
                            fork._ended(message["code"])
                    else:
                        self._answers.append(message)
                        self._answered.notify_all()
        except OSError:
            pass
        finally:
            with self._answered:
                self._closed = True
                self._answered.notify_all()
                for fork in self._forks.values():
                    fork._orphan()

    def close(self) -> None:
        """End the server (its forks end when their pools close their pipes)."""
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


_shared: ForkServer | None = None
_shared_lock = threading.Lock()


def shared(env: dict, cwd: str) -> ForkServer | None:
    """This process's fork server for environments equal to `env` (started on first use), or
    None when forks cannot serve `env`: the server has another and forks of it still run
    (see the module's docstring). An idle server for another environment (this process's
    variables changed since it started, or the pool that started it wanted others) is
    replaced, so there is never more than one."""
    global _shared
    with _shared_lock:
        if _shared is not None and not _shared.serves(env) and (_shared._closed or _shared.idle()):
            _shared.close()
            _shared = None
        if _shared is None:
            _shared = ForkServer(env, cwd)
        return _shared if _shared.serves(env) else None


# -- the server ---------------------------------------------------------------------------

def _child(sock: socket.socket, wakeup_r: int, wakeup_w: int, target: str, fds: list[int], nice: int) -> None:
    """In the fork: become an environment for `target` on the pipes `fds` (never returns)."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        os.close(wakeup_r)
        os.close(wakeup_w)
        if nice:
            os.nice(nice)
        from infra.local.standins import lambda_worker

        code = lambda_worker.main([target, str(fds[0]), str(fds[1])])
    except BaseException:  # noqa: BLE001 - the environment's own failure, reported as its exit
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)


def serve(sock: socket.socket) -> int:
    import importlib

    from skyfn import gc_tuning

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # not installed here: the environments import what they need themselves
    gc_tuning.settle()  # what the forks share stays out of their collector's sight (and unwritten)
    wakeup_r, wakeup_w = os.pipe()
    os.set_blocking(wakeup_w, False)
    signal.set_wakeup_fd(wakeup_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd hears of exits
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wakeup_r, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj is sock:
                try:
                    data, fds, _, _ = socket.recv_fds(sock, _MAX, 2)
                except OSError:
                    return 0
                if not data:
                    return 0  # the pool's process is gone
                try:
                    request = json.loads(data)
                    pid = os.fork()
                except BaseException as exc:  # noqa: BLE001 - answered, the server goes on
                    for fd in fds:
                        os.close(fd)
                    sock.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
                    continue
                if pid == 0:
                    _child(sock, wakeup_r, wakeup_w, request["target"], fds, int(request.get("nice") or 0))
                for fd in fds:
                    os.close(fd)
                sock.send(json.dumps({"pid": pid}).encode())
            else:
                os.read(wakeup_r, 4096)
                _reap(sock)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        try:
            sock.send(json.dumps({"exited": pid, "code": code}).encode())
        except OSError:
            return


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the service, which closes our socket
    return serve(socket.socket(fileno=int(argv[0])))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
