"""Killing the embedded runtime's agent mid-batch, for the fault tests: wait until a batch
is under way, SIGKILL the agent and its managers and workers, start it again."""
from __future__ import annotations

import os
import signal
import time

import psutil

from infra.local import agent


def wait_under_way(futures, done: int = 300, timeout: float = 60) -> int:
    """Wait until `done` futures resolved (the batch is in flight); how many did."""
    deadline = time.monotonic() + timeout
    while sum(f.done() for f in futures) < done and time.monotonic() < deadline:
        time.sleep(0.02)
    n = sum(f.done() for f in futures)
    assert 0 < n < len(futures), "the batch must be in flight when the agent dies"
    return n


def kill_and_restart(home) -> None:
    """SIGKILL the agent and every process under it, wait for them to go, start it again."""
    pid = int(agent.pidfile(home, "local").read_text().split()[0])
    family = [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    os.kill(pid, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(p) for p in family if psutil.pid_exists(p)], timeout=15)
    agent.start("local", home)
