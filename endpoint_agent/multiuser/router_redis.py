"""The router's Redis: the queues between a multi-user endpoint's privileged process and its
user agents, one set per user agent, each reachable only by that agent's Redis ACL user.

A redis-server the privileged process starts (root-owned directory, 0600 config, the
append-only file on, so a restart of it loses no routed task), or keeps when the one a
previous run started still answers (the privileged process was killed hard: the user agents
and their queues live on). The default user is off; the privileged process logs in as
`skyfn-router`, whose password is in a 0600 file. Each user agent gets an ACL user of its
own, allowed only the keys under its prefix (`mu:<account>:<digest>:`: its task, results
and control streams, and the mark of what the router has seen of its lane) and exactly the
commands its queue client sends (USER_COMMANDS), so a task of bob's that finds his agent's
queue password still reads nothing of alice's and can neither run code in Redis nor remove
anything that is not his (Redis answers NOPERM). The queue's multi-key steps are the Redis
functions of skyfn.protocol.queues.redis_lib, loaded by the router (its admin login) when the
server starts; an agent may call them (FCALL, which checks every command a function runs
against the caller's rules), never load, replace or flush them: no EVAL, EVALSHA, SCRIPT or
FUNCTION.

ACL users are not kept in the append-only file: `ensure_user` is called again for every
known user agent when the server was restarted (the router keeps their passwords, 0600).
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Optional

import redis

from endpoint_agent.data.redis_process import (end_recorded_redis, end_redis, free_port, is_redis, launch,
                                                  port_free, secret_file)
from endpoint_agent.errors import ConfigError
from skyfn.protocol.queues import redis_lib

log = logging.getLogger("skyfn.multiuser.router")

ADMIN = "skyfn-router"
HOST = "127.0.0.1"
# Exactly what a user agent's queue client sends (skyfn/protocol/queues/redis_streams.py and the
# redis_lib functions, whose commands Redis checks against the caller's rules too; the same
# table as the service's queue logins, lambdas/adapters/queue_logins.py), plus GET of its lane's
# seen mark (multiuser/lane_routes.py). Everything else is refused: no EVAL, EVALSHA, SCRIPT,
# FUNCTION, KEYS, SCAN, FLUSH*, CONFIG, ACL, DEBUG, CLIENT, DEL, XTRIM, XSETID, XGROUP other than
# CREATE, pub/sub.
USER_COMMANDS = ("ping", "multi", "exec", "discard", "time", "fcall", "xgroup|create", "xread", "xreadgroup",
                 "xpending", "xclaim", "xrange", "xinfo|stream", "xack", "xdel", "xlen", "xadd", "zadd", "zrem",
                 "zrangebyscore", "zrange", "zscore", "get")
USER_RULES = ("resetchannels", "-@all", *(f"+{c}" for c in USER_COMMANDS))


def prefix_of(account: str, digest: str) -> str:
    return f"mu:{account}:{digest}:"


class RouterRedis:
    """The running router Redis (see the module docstring)."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.port: Optional[int] = None
        self.pid: Optional[int] = None
        self.client: Optional[redis.Redis] = None
        self.password = ""

    @property
    def record_path(self) -> Path:
        return self.dir / "redis.json"

    def start(self) -> "RouterRedis":
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        self.password = secret_file(self.dir / "router.password", 24)
        record = self._record()
        if record and is_redis(record.get("pid")) and self._connect(record["port"]):
            self.pid = record["pid"]
            redis_lib.load(self.client)  # today's version of the queue functions
            log.info("kept the router's redis-server of the previous run on %s:%d (pid %d)", HOST, self.port, self.pid)
            return self
        binary = shutil.which("redis-server")
        if binary is None:
            raise ConfigError("a multi-user endpoint needs redis-server for its user agents' queues: install it "
                              "(apt-get install redis-server)")
        port = (record or {}).get("port") or 0
        if not port or not port_free(HOST, port):
            port = free_port(HOST)
        lines = [f"port {port}", f"bind {HOST}", "protected-mode yes", f"dir {self.dir}",
                 f"logfile {self.dir / 'redis.log'}", "appendonly yes", "appendfsync everysec",
                 'save ""', "maxmemory-policy noeviction", "user default off",
                 f"user {ADMIN} on >{self.password} ~* &* +@all"]
        proc = launch(binary, self.dir / "redis.conf", lines, host=HOST, port=port, username=ADMIN,
                      password=self.password, log_path=self.dir / "redis.log")
        self.pid = proc.pid
        self._connect(port)
        redis_lib.load(self.client)  # the queue functions the agents call (they may not load them)
        self.record_path.write_text(json.dumps({"pid": proc.pid, "port": port}))
        log.info("started the router's redis-server on %s:%d (pid %d)", HOST, port, proc.pid)
        return self

    def _record(self) -> Optional[dict]:
        try:
            return json.loads(self.record_path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _connect(self, port: int) -> bool:
        client = redis.Redis(host=HOST, port=port, username=ADMIN, password=self.password, socket_timeout=10,
                             socket_connect_timeout=2, health_check_interval=30)
        try:
            client.ping()
        except redis.RedisError:
            client.close()
            return False
        self.port, self.client = port, client
        return True

    def url(self, username: str, password: str) -> str:
        return f"redis://{username}:{password}@{HOST}:{self.port}/0"

    def admin_url(self) -> str:
        return self.url(ADMIN, self.password)

    def ensure_user(self, username: str, password: str, prefix: str) -> None:
        """The ACL user of one user agent: its password, its key prefix, the commands of a queue client."""
        assert self.client is not None
        self.client.execute_command("ACL", "SETUSER", username, "reset", "on", f">{password}", f"~{prefix}*",
                                    *USER_RULES)

    def drop_user(self, username: str) -> None:
        assert self.client is not None
        self.client.execute_command("ACL", "DELUSER", username)
        # connections of the dropped user are closed by Redis itself

    def drop_streams(self, prefix: str) -> None:
        """Delete a forgotten user agent's keys: its task, results and control streams (with
        their leases and dead letters) and its lane's seen mark."""
        assert self.client is not None
        self.client.delete(*(f"{prefix}{kind}{tail}" for kind in ("tasks", "results", "control")
                             for tail in ("", ":leases", ":dlq")), f"{prefix}seen")

    def users(self) -> set[str]:
        assert self.client is not None
        return {u.decode() if isinstance(u, bytes) else u for u in self.client.execute_command("ACL", "USERS")}

    def stop(self) -> None:
        """End the server (a graceful stop of the endpoint: nothing is routed any more)."""
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.pid is not None and is_redis(self.pid):
            end_redis(self.pid)
        self.record_path.unlink(missing_ok=True)
        self.pid = None


def end_leftover(directory: Path) -> Optional[int]:
    """End the router's redis-server a privileged process killed hard left running; its pid, or None.
    Its append-only file keeps the routed tasks for the next start."""
    return end_recorded_redis(Path(directory) / "redis.json")
