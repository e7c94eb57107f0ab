"""What one user does to their own account stops no one else (issue 36), from bob's side: his
task replaces his working directory with a symlink, he kills his own user agent (as bob), then
sends tasks with his usual config and with a new user_config. The privileged process keeps
running; bob's tasks end FAILED with the reason (each audited once, as bob's); dave is served
throughout; once bob puts his directory back, his tasks run again."""
from __future__ import annotations

import pwd
import subprocess
import time

from skyfn import Executor
from tests.mu_endpoint.tenant import agent_of, nap, square, third_user_served, wait_state


def break_workdir():
    """In bob's task: ~/.skyfn/work becomes a symlink (the real directory moved aside)."""
    import os

    work = os.path.expanduser("~/.skyfn/work")
    os.rename(work, work + ".moved")
    os.symlink("/tmp", work)
    return os.path.islink(work)


def _kill_as(account, pid):
    pw = pwd.getpwnam(account)
    done = subprocess.run(["kill", "-KILL", str(pid)], user=pw.pw_uid, group=pw.pw_gid, extra_groups=[pw.pw_gid],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def _failed_with(client, future, timeout=180):
    try:
        value = future.result(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - the refusal, as the SDK raises it
        return str(exc), client.get_task(future.task_id)
    raise AssertionError(f"task {future.task_id} succeeded with {value!r}; it should have failed")


def test_symlinked_workdir_and_killed_agent_fail_only_bobs_tasks(site):
    bob_acct = site.accounts["bob"]
    home = pwd.getpwnam(bob_acct).pw_dir
    work = f"{home}/.skyfn/work"
    third_user_served(site)
    bob = site.user("bob")
    eb = Executor(endpoint_id=site.endpoint_id, client=bob)
    restored = False
    try:
        assert eb.submit(break_workdir).result(timeout=120) is True
        running = eb.submit(nap, 60)
        wait_state(bob, running, ("RUNNING",))
        _kill_as(bob_acct, agent_of(site, "bob")["pid"])   # bob kills his own user agent

        reason, task = _failed_with(bob, running)
        assert task["state"] == "FAILED"
        assert "not a directory (a symlink or a file)" in reason and bob_acct in reason, reason
        assert site.proc.poll() is None, site.log_tail()
        third_user_served(site)

        # his usual config again, and twice a new user_config: refused with the reason, nothing crashes
        again = eb.submit(square, 3)
        with Executor(endpoint_id=site.endpoint_id, client=bob, user_config={"workers": 3}) as fresh:
            pair = [fresh.submit(square, 4), fresh.submit(square, 5)]
            for f in [again, *pair]:
                reason, task = _failed_with(bob, f)
                assert task["state"] == "FAILED"
                assert "a symlink or a file" in reason, reason
        assert site.proc.poll() is None, site.log_tail()
        third_user_served(site)
        ids = [running.task_id, again.task_id, *(f.task_id for f in pair)]
        lines = site.audit_of(ids)
        assert sorted(r["task_id"] for r in lines) == sorted(ids), lines  # each once
        assert {r["account"] for r in lines} == {bob_acct}
        assert {r["outcome"] for r in lines} <= {"FAILED", "REFUSED"}

        # bob repairs his directory: after the back-off his tasks run again
        subprocess.run(["rm", "-f", work], check=True)
        subprocess.run(["mv", work + ".moved", work], check=True)
        restored = True
        deadline = time.monotonic() + 180
        while True:
            f = eb.submit(square, 7)
            try:
                assert f.result(timeout=180) == 49
                break
            except Exception as exc:  # noqa: BLE001 - still backed off: its reason says so
                assert "not tried again" in str(exc) or "a symlink or a file" in str(exc), exc
                assert time.monotonic() < deadline, f"bob's tasks still refused after his fix: {exc}"
                time.sleep(2)
    finally:
        if not restored:
            subprocess.run(["rm", "-f", work], check=False)
            subprocess.run(["mv", work + ".moved", work], check=False)
        eb.shutdown()
        bob.close()
    third_user_served(site)
