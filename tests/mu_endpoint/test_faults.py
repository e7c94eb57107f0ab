"""Kills on a multi-user endpoint (issue 23): SIGKILL of a user agent mid-batch, and of the
privileged process mid-batch; every task resolves once, with the right value, as its own
account, and the audit log holds each task once."""
from __future__ import annotations

import os
import pwd
import signal
import time

from skyfn import Executor

N = 60


def slow(x):
    import os
    import time

    time.sleep(0.3)
    return x, os.getuid()


def _agent_pid(site, account, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for a in site.user_agents():
            if a["account"] == account and a["alive"] and a["pid"]:
                return a["pid"]
        time.sleep(0.1)
    raise AssertionError(f"no user agent of {account} in {site.user_agents()}")


def _run_with_kill(site, role, kill):
    client = site.user(role)
    ex = Executor(endpoint_id=site.endpoint_id, client=client)
    try:
        futures = [ex.submit(slow, i) for i in range(N)]
        deadline = time.monotonic() + 120
        while sum(f.done() for f in futures) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        done_before = sum(f.done() for f in futures)
        assert done_before < N, "the batch ended before the kill: make the tasks longer"
        kill()
        results = [f.result(timeout=180) for f in futures]
    finally:
        ex.shutdown()
        client.close()
    uid = pwd.getpwnam(site.accounts[role]).pw_uid
    assert results == [(i, uid) for i in range(N)]
    ids = [f.task_id for f in futures]
    audited = [r["task_id"] for r in site.audit_of(ids)]
    assert sorted(audited) == sorted(ids), "each task audited exactly once"
    return done_before


def test_sigkill_of_a_user_agent_mid_batch_loses_nothing(site):
    account = site.accounts["alice"]
    killed = []

    def kill():
        killed.append(_agent_pid(site, account))
        os.kill(killed[0], signal.SIGKILL)

    _run_with_kill(site, "alice", kill)
    assert _agent_pid(site, account) != killed[0]  # the endpoint started it again


def test_sigkill_of_the_privileged_process_mid_batch_loses_nothing(site):
    def kill():
        old = site.proc
        site.stop(signal.SIGKILL)
        assert old.returncode == -signal.SIGKILL
        site.start()

    _run_with_kill(site, "bob", kill)
    assert site.status()["state"] == "running"


def test_stop_after_a_sigkill_ends_what_the_privileged_process_left(site):
    import subprocess
    import sys

    from endpoint_agent.procutil import pid_alive

    with site.user("alice") as alice, Executor(endpoint_id=site.endpoint_id, client=alice) as ex:
        assert ex.submit(slow, 1).result(timeout=120)[0] == 1
    agent = _agent_pid(site, site.accounts["alice"])
    site.stop(signal.SIGKILL)
    assert pid_alive(agent)  # a user agent outlives a killed privileged process (it is taken up again)
    env = {**os.environ, "SKYFN_HOME": str(site.home)}
    done = subprocess.run([sys.executable, "-m", "endpoint_agent", "stop", "mu"], env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "user agent(s)" in done.stdout and "router's redis-server" in done.stdout, done.stdout
    deadline = time.monotonic() + 10
    while pid_alive(agent) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(agent)
    site.start()
    with site.user("alice") as alice, Executor(endpoint_id=site.endpoint_id, client=alice) as ex:
        assert ex.submit(slow, 2).result(timeout=120)[0] == 2


def nap(seconds):
    import time

    time.sleep(seconds)
    return seconds


def test_a_cancel_reaches_the_user_agent_and_is_audited_once(site):
    with site.user("alice") as alice:
        fid = alice.register_function(nap)
        tid = alice.run(fid, 60, endpoint_id=site.endpoint_id)
        deadline = time.monotonic() + 60
        while alice.get_task(tid)["state"] != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alice.cancel(tid) is True
        deadline = time.monotonic() + 30
        while not [r for r in site.audit() if r["task_id"] == tid] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alice.get_task(tid)["state"] == "CANCELLED"
    records = [r for r in site.audit() if r["task_id"] == tid]
    assert [r["outcome"] for r in records] == ["CANCELLED"]
    assert records[0]["account"] == site.accounts["alice"]
