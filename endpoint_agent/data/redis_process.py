"""A redis-server run beside an agent: secrets kept in 0600 files, a free port, start and
wait until it answers, tell a live redis-server from a reused pid, end one.

Used by the endpoint's data plane (endpoint_agent/data/plane.py: the endpoint's own Redis)
and by a multi-user endpoint's router (endpoint_agent/multiuser/router_redis.py: the queues
between the privileged process and its user agents). Passwords go into the config file
(0600), never onto a command line.
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional, Sequence

START_TIMEOUT_S = 15.0


def secret_file(path: Path, nbytes: int = 32) -> str:
    """A hex secret kept in `path` (0600), made on first use."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        value = secrets.token_hex(nbytes)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value)
        return value


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def is_redis(pid: Optional[int]) -> bool:
    """pid runs a redis-server (not a reused pid of something else)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            return b"redis-server" in f.read()
    except OSError:
        return False


def end_redis(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM the redis-server `pid`, SIGKILL it if it has not gone within `timeout`."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while is_redis(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if is_redis(pid):
        os.kill(pid, signal.SIGKILL)


def end_recorded_redis(record: Path) -> Optional[int]:
    """End the redis-server whose `{"pid": ...}` record a process killed hard left behind (and
    drop the record); its pid, or None when there was none or it is gone already."""
    import json

    try:
        pid = json.loads(Path(record).read_text()).get("pid")
    except (FileNotFoundError, ValueError):
        return None
    Path(record).unlink(missing_ok=True)
    if not is_redis(pid):
        return None
    end_redis(pid)
    return pid


def launch(binary: str, conf: Path, lines: Sequence[str], *, host: str, port: int, password: str,
           username: Optional[str] = None, log_path: Optional[Path] = None,
           timeout: float = START_TIMEOUT_S) -> subprocess.Popen:
    """Write `lines` to `conf` (0600) and start redis-server on it in its own session; return
    once it answers PING as `username`/`password`. RuntimeError (naming the log) if it does not."""
    import redis

    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    proc = subprocess.Popen([binary, str(conf)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    client = redis.Redis(host=host, port=port, username=username, password=password, socket_timeout=2)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.ping()
                return proc
            except redis.RedisError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait(5)
                    raise RuntimeError(f"redis-server did not start on {host}:{port} (see {log_path or conf})") \
                        from None
                time.sleep(0.05)
    finally:
        client.close()
