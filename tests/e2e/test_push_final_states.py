"""Every final state reaches the Executor by push, not only results (issue 13), through the
real embedded runtime: a task its owner cancels from elsewhere, and a task whose agent is
killed with SIGKILL so that its lease expires past its retry budget, resolve their futures
from the pushed message itself (nothing fetched, no quiet-spell check needed)."""
from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from infra.local import agent
from skyfn import Client, Executor
from skyfn.protocol.errors import TaskCancelled, TaskFailed


def hold(flag: str, limit: float):
    """Runs while `flag` exists (at most `limit` s): a task that stays RUNNING until the test
    lets it go, and returns at once if it is delivered again later."""
    import os as _os
    import time as _t

    end = _t.monotonic() + limit
    while _os.path.exists(flag) and _t.monotonic() < end:
        _t.sleep(0.05)
    return "released"


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def _state(owner: Client, task_id: str) -> str | None:
    return owner.status([task_id])["tasks"].get(task_id, {}).get("state")


@pytest.fixture
def flag(tmp_path):
    path = tmp_path / "hold"
    path.write_text("")
    yield str(path)
    path.unlink(missing_ok=True)


@pytest.fixture
def owner(local_home):
    """The same user as the Executor's client, acting from elsewhere (another Client)."""
    with Client() as c:
        yield c


def _running(ex: Executor, owner: Client, fut) -> str:
    _wait_for(lambda: fut.task_id is not None, 30, "the task to be submitted")
    _wait_for(lambda: _state(owner, fut.task_id) == "RUNNING", 60, "the task to run")
    return fut.task_id


def test_a_task_cancelled_by_its_owner_resolves_by_push(client, endpoint_id, owner, flag):
    with Executor(endpoint_id=endpoint_id, client=client, push=True) as ex:
        assert ex.submit(hold, flag + ".absent", 0).result(timeout=60) == "released"  # connected and warm
        assert ex.push_stats["connected"]
        fut = ex.submit(hold, flag, 60)
        tid = _running(ex, owner, fut)
        # cancel right after a quiet-spell check (counted once its status answer is applied:
        # a status read still in flight could take the cancel before the push): the next one
        # is at least 2 s away, so a resolution well within that came by push
        checks = ex.push_stats["quiet_checks"]
        _wait_for(lambda: ex.push_stats["quiet_checks"] > checks, 30, "a quiet-spell check")
        before = ex.push_stats
        t0 = time.monotonic()
        assert owner.cancel(tid)
        exc = fut.exception(timeout=30)
        took = time.monotonic() - t0
        after = ex.push_stats

    assert isinstance(exc, TaskCancelled) and exc.task_id == tid
    assert (exc.state, exc.reason) == ("CANCELLED", "cancelled by its owner")
    assert not fut.cancelled()  # cancelled remotely: the future holds the outcome, as for any final state
    print("cancel resolved in", round(took * 1000, 1), "ms; push stats", before, "->", after)
    # the push resolved it: a status read (a quiet-spell check, which a loaded machine can
    # reach before the push) would have taken it first, and the push would not count
    assert after["pushed_results"] == before["pushed_results"] + 1
    assert after["fetched"] == 0 and after["gaps"] == before["gaps"]


def _kill_agent(home) -> None:
    """SIGKILL the agent and everything it runs (its managers and workers), as a lost node;
    its data redis-server survives, as it does any agent crash (tests/e2e/test_data.py)."""
    pid = int(agent.pidfile(home, "local").read_text().split()[0])
    family = [psutil.Process(pid)] + [p for p in psutil.Process(pid).children(recursive=True)
                                      if "redis-server" not in " ".join(p.cmdline())]
    for p in family:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=15)


def test_a_task_whose_lease_expires_past_its_retries_resolves_by_push(local_home, client, endpoint_id, owner,
                                                                      flag):
    with Executor(endpoint_id=endpoint_id, client=client, push=True) as ex:
        assert ex.submit(hold, flag + ".absent", 0).result(timeout=60) == "released"
        # the Executor has no max_retries argument; its per-task options are where one goes
        ex._task_options = {**ex._task_options, "max_retries": 0}
        fut = ex.submit(hold, flag, 120)
        tid = _running(ex, owner, fut)
        before = ex.push_stats
        try:
            _kill_agent(local_home)
            # the lease (4 s in this runtime) expires; the reaper (every 5 s) fails the task
            exc = fut.exception(timeout=60)
            after = ex.push_stats
        finally:
            os.unlink(flag)  # a redelivery to the next agent returns at once
            agent.start("local", local_home)

    assert type(exc) is TaskFailed and exc.task_id == tid and exc.state == "FAILED"
    assert exc.reason == ("lease expired 1 times (the endpoint agent running it was lost); "
                          "retry budget max_retries=0 exhausted")
    print("push stats", before, "->", after)
    assert after["pushed_results"] == before["pushed_results"] + 1
    assert after["fetched"] == 0 and after["gaps"] == before["gaps"]
