"""Fault tests through the real embedded runtime and the SDK: during a 5,000-task batch,
SIGKILL a worker, a manager, or the whole agent; every Executor future resolves once with
the right value, and every task reaches exactly one final state in the service."""
from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest

from infra.local import agent
from skyfn import Executor
from tests.e2e.conftest import client, endpoint_id, local_home  # noqa: F401 - shared fixtures

N = 5000


def slow_square(x):
    import time as _t

    _t.sleep(0.001)
    return x * x


def _status(home) -> dict:
    try:
        return json.loads((home / "endpoints" / "local" / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _agent_pid(home) -> int:
    return int(agent.pidfile(home, "local").read_text().split()[0])


def _wait(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out")


def _kill_worker(home):
    st = _wait(lambda: (s := _status(home)) and s.get("pid") == _agent_pid(home) and s.get("worker_pids") and s)
    os.kill(st["worker_pids"][0], signal.SIGKILL)


def _kill_manager(home):
    pid = _agent_pid(home)
    mgr = _wait(lambda: [c for c in psutil.Process(pid).children() if "endpoint_agent.manager" in " ".join(c.cmdline())])
    os.kill(mgr[0].pid, signal.SIGKILL)


def _kill_agent(home):
    pid = _agent_pid(home)
    family = [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    os.kill(pid, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(p) for p in family if psutil.pid_exists(p)], timeout=15)
    agent.start("local", home)


@pytest.mark.parametrize("victim", ["worker", "manager", "agent"])
def test_sigkill_during_5000_task_batch_every_task_once(local_home, client, victim):  # noqa: F811
    if victim != "agent":  # a previous test may have left the agent restarting
        _wait(lambda: (s := _status(local_home)) and s.get("state") == "running" and len(s.get("worker_pids") or []) == 2)
    with Executor(endpoint="local") as ex:
        futures = [ex.submit(slow_square, i) for i in range(N)]
        _wait(lambda: sum(f.done() for f in futures) >= 500, timeout=120)
        assert sum(f.done() for f in futures) < N, "the batch must be in flight"
        {"worker": _kill_worker, "manager": _kill_manager, "agent": _kill_agent}[victim](local_home)
        for i, f in enumerate(futures):
            assert f.result(timeout=180) == i * i
    ids = [f.task_id for f in futures]
    finals = 0
    for chunk in range(0, N, 500):
        st = client.status(ids[chunk:chunk + 500], include_events=True)
        for t in st["tasks"].values():
            assert t["state"] == "SUCCEEDED"
            finals += sum(1 for e in t["events"] if e[0] in ("SUCCEEDED", "FAILED"))
    assert finals == N


def sleepy(x):
    import time as _t

    _t.sleep(x)
    return x


def test_cancel_through_the_service_kills_the_running_task(local_home, client, endpoint_id):  # noqa: F811
    _wait(lambda: (s := _status(local_home)) and s.get("state") == "running" and len(s.get("worker_pids") or []) == 2)
    before = set(_status(local_home)["worker_pids"])
    tid = client.run(sleepy, 60, endpoint_id=endpoint_id)
    _wait(lambda: client.get_task(tid)["state"] == "RUNNING", timeout=30)
    assert client.cancel(tid)
    st = _wait(lambda: (s := _status(local_home)) and len(s.get("worker_pids") or []) == 2
               and len(set(s["worker_pids"]) - before) == 1 and s, timeout=20)  # its worker was replaced
    assert st.get("cancelled", 0) >= 1
    other = client.run(sleepy, 0, endpoint_id=endpoint_id)
    assert client.get_result(other, timeout=30) == 0
    time.sleep(1.0)
    assert client.get_task(tid)["state"] == "CANCELLED"
