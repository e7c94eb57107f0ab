"""The embedded runtime's redis-server rewrites its append-only file at SCHED_IDLE
(infra/local/rewrite_yield.py): a real redis-server, a real rewrite (made to last ~4 s by
rdb-key-save-delay), its child's scheduling policy read from the kernel while it runs; the
watcher follows the pid file to a restarted server; the rewritten file still holds the data."""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest
import redis

from infra.local.processes import AOF_REWRITE_PERCENTAGE, start_redis, threads_exited, write_pidfile
from infra.local.rewrite_yield import RewriteYield

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE and /proc: Linux only")

KEYS = 2_000
DELAY_US = 2_000  # per key saved by the rewrite's child: ~4 s for KEYS (the pid file is read again every 1 s)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except FileNotFoundError:
        return []


def _rewrite_policies(server, r: redis.Redis) -> tuple[dict[int, int], dict]:
    """Start a rewrite and read its child's policy until the rewrite is over."""
    r.config_set("rdb-key-save-delay", DELAY_US)
    r.bgrewriteaof()
    seen: dict[int, int] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for child in _children(server.pid):
            try:
                seen[child] = os.sched_getscheduler(child)
            except ProcessLookupError:
                pass
        info = r.info("persistence")
        if seen and not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
            return seen, info
        time.sleep(0.02)
    raise AssertionError(f"the rewrite did not end in 30 s: {r.info('persistence')}")


def _until_dead(pid: int, timeout: float = 10.0) -> None:
    """Until every thread of `pid` has exited (left a zombie: a SIGKILL is delivered, and the
    sockets closed with the last thread, a little later; see threads_exited)."""
    deadline = time.monotonic() + timeout
    while not threads_exited(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} still runs {timeout} s after SIGKILL")
        time.sleep(0.01)


def test_rewrites_run_at_sched_idle_and_follow_a_restart(tmp_path):
    pidfile = tmp_path / "redis.pid"
    server = start_redis(tmp_path / "redis")
    write_pidfile(pidfile, server.pid)
    watcher = RewriteYield(pidfile, poll_s=0.02).start()
    killed = None
    try:
        r = redis.Redis.from_url(server.url)
        assert r.config_get("auto-aof-rewrite-percentage") == {"auto-aof-rewrite-percentage": str(AOF_REWRITE_PERCENTAGE)}
        r.mset({f"k{i}": i for i in range(KEYS)})
        seen, info = _rewrite_policies(server, r)
        assert info["aof_last_bgrewrite_status"] == "ok"
        assert set(seen.values()) == {os.SCHED_IDLE}, seen  # seen running: at SCHED_IDLE from early on
        assert list(watcher.yielded) == list(seen)
        assert os.sched_getscheduler(server.pid) == os.SCHED_OTHER  # Redis itself is untouched

        # SIGKILL, left unreaped (a zombie, as under a parent that reaps late), and a restart
        # on the same directory (as infra/local/recover.py does): the data comes back from
        # the rewritten file, and the next rewrite yields too
        killed = server
        os.kill(killed.pid, signal.SIGKILL)
        _until_dead(killed.pid)  # its socket closed: the restart's readiness check must not find the old server
        server = start_redis(tmp_path / "redis", killed.port)
        write_pidfile(pidfile, server.pid)
        r = redis.Redis.from_url(server.url)
        assert r.dbsize() == KEYS and int(r.get(f"k{KEYS - 1}")) == KEYS - 1
        seen2, info = _rewrite_policies(server, r)
        assert info["aof_last_bgrewrite_status"] == "ok"
        assert set(seen2.values()) == {os.SCHED_IDLE}, seen2
        assert list(watcher.yielded) == list(seen) + list(seen2)
    finally:
        watcher.stop()
        server.stop()
        if killed is not None:
            killed.proc.wait(5)
