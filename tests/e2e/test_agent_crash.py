"""Killing the endpoint agent with SIGKILL in the middle of a 2,000-task batch and
starting it again loses no task and delivers each result exactly once to the SDK."""
from __future__ import annotations

from skyfn import Executor
from tests.e2e.agent_kill import kill_and_restart, wait_under_way


def slow_square(x):
    import time as _t

    _t.sleep(0.002)
    return x * x


def test_sigkill_agent_mid_batch_loses_nothing(local_home, client):
    n = 2000
    delivered: dict[int, int] = {}
    with Executor(endpoint="local") as ex:
        futures = [ex.submit(slow_square, i) for i in range(n)]
        wait_under_way(futures)
        kill_and_restart(local_home)
        for i, f in enumerate(futures):
            value = f.result(timeout=120)
            assert value == i * i
            delivered[i] = delivered.get(i, 0) + 1
    assert len(delivered) == n and set(delivered.values()) == {1}
    # every task reached exactly one final state in the service, whatever ran twice
    ids = [f.task_id for f in futures]
    finals = 0
    for chunk in range(0, n, 500):
        st = client.status(ids[chunk:chunk + 500], include_events=True)
        for t in st["tasks"].values():
            assert t["state"] == "SUCCEEDED"
            finals += sum(1 for e in t["events"] if e[0] in ("SUCCEEDED", "FAILED"))
    assert finals == n
