"""A multi-user endpoint routes each user's tasks to a user agent running as that user's account,
and refuses what must not run with the reason (issue 23, "What must be shown")."""
from __future__ import annotations

import os
import pwd
import threading
import time

import pytest

from skyfn import Executor


def whoami():
    import os

    return {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()),
            "home": os.environ.get("HOME"), "cwd": os.getcwd(), "user": os.environ.get("USER")}


def expected(account: str) -> dict:
    """The account's uid, gid and groups -- plus the user agents' peer_gid, the only extra group
    (it reads identities.json) -- its HOME and name."""
    from endpoint_agent.multiuser.configure import MultiUserConfig

    pw = pwd.getpwnam(account)
    groups = sorted({*os.getgrouplist(account, pw.pw_gid), MultiUserConfig(multi_user=True).peer_gid})
    return {"uid": pw.pw_uid, "euid": pw.pw_uid, "gid": pw.pw_gid, "groups": groups, "home": pw.pw_dir,
            "user": account}


def test_after_its_first_task_a_users_tasks_bypass_the_router(site):
    """The first task of a new (identity, user_config) is routed and binds it to its agent's lane;
    the rest go from the service to the lane and back without the privileged process, and are
    still audited once each as the user's account."""
    want = expected(site.accounts["bob"])
    with site.user("bob") as bob, Executor(endpoint_id=site.endpoint_id, client=bob,
                                           user_config={"workers": 1}) as ex:
        before = _routed(site)
        first = ex.submit(whoami)
        assert {k: v for k, v in first.result(timeout=120).items() if k in want} == want
        assert _routed(site, before + 1) == before + 1
        futures = [ex.submit(whoami) for _ in range(40)]
        assert all({k: g[k] for k in want} == want for g in (f.result(timeout=120) for f in futures))
    time.sleep(2.5)  # the status file is rewritten every 2 s
    assert _routed(site) == before + 1, "tasks after the first went through the router"
    records = site.audit_of([first.task_id] + [f.task_id for f in futures])
    assert sorted(r["task_id"] for r in records) == sorted([first.task_id] + [f.task_id for f in futures])
    assert {(r["account"], r["uid"], r["outcome"], r["function"]["name"]) for r in records} == {
        (site.accounts["bob"], want["uid"], "SUCCEEDED", "whoami")}


def _routed(site, at_least: int = 0) -> int:
    """Tasks the router has routed, from the status file (waiting until it says `at_least`)."""
    deadline = time.monotonic() + 10
    while True:
        routed = site.status().get("routed", 0)
        if routed >= at_least or time.monotonic() > deadline:
            return routed
        time.sleep(0.1)


def test_interleaved_tasks_of_two_users_run_as_their_own_accounts(site):
    users = {role: site.user(role) for role in ("alice", "bob")}
    futures: dict[str, list] = {"alice": [], "bob": []}
    executors = {role: Executor(endpoint_id=site.endpoint_id, client=c) for role, c in users.items()}
    try:
        def submit(role):
            for _ in range(100):
                futures[role].append(executors[role].submit(whoami))
        threads = [threading.Thread(target=submit, args=(r,)) for r in users]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for role, futs in futures.items():
            want = expected(site.accounts[role])
            got = [f.result(timeout=120) for f in futs]
            assert len(got) == 100
            for g in got:
                assert {k: g[k] for k in want} == want
                assert g["cwd"] == f"{want['home']}/.skyfn/work", g["cwd"]
    finally:
        for ex in executors.values():
            ex.shutdown()
        for c in users.values():
            c.close()
    agents = {a["account"] for a in site.user_agents()}
    assert agents >= {site.accounts["alice"], site.accounts["bob"]}
    assert "root" not in agents
    audit = [r for r in site.audit_of(f.task_id for futs in futures.values() for f in futs)
             if r["outcome"] == "SUCCEEDED"]
    by_account = {}
    for r in audit:
        by_account.setdefault(r["account"], set()).add(r["task_id"])
    assert len(by_account[site.accounts["alice"]]) >= 100 and len(by_account[site.accounts["bob"]]) >= 100
    sample = next(r for r in audit if r["account"] == site.accounts["bob"])
    assert sample["identity"]["email"] == f"{site.accounts['bob']}@users.example.org"
    assert sample["uid"] == pwd.getpwnam(site.accounts["bob"]).pw_uid and sample["start"] and sample["end"]


def _failure(client, fid, endpoint, **kwargs) -> str:
    tid = client.run(fid, endpoint_id=endpoint, **kwargs)
    with pytest.raises(Exception) as info:
        client.get_result(tid, timeout=60)
    return str(info.value), tid


@pytest.mark.parametrize("case", ["unmapped", "root", "denied", "schema", "injection", "template-expression"])
def test_refusals_end_failed_with_the_reason_and_start_nothing(site, case):
    before = {a["key"] for a in site.user_agents()}
    if case == "unmapped":
        client, kwargs, want = site.client("stranger-id", "stranger@elsewhere.org"), {}, \
            ["stranger-id", "maps to no local account on endpoint mu"]
    elif case == "root":
        client, kwargs, want = site.client("root-claimer", "root@users.example.org"), {}, ["root"]
    elif case == "denied":
        client, kwargs, want = site.user("carol"), {}, ["deny list"]
    elif case == "schema":
        client, kwargs, want = site.user("alice"), {"user_config": {"workers": "many"}}, ["workers", "integer"]
    elif case == "injection":
        client, kwargs, want = site.user("alice"), {"user_config": {"log_level": "INFO\nworkers: 64\nprovider: pbs"}}, \
            ["log_level"]
    else:
        client, kwargs, want = site.user("alice"), {"user_config": {"log_level": "{{ ''.__class__ }}"}}, ["log_level"]
    with client:
        fid = client.register_function(whoami)
        message, tid = _failure(client, fid, site.endpoint_id, **kwargs)
    for text in want:
        assert text in message, message
    after = {a["key"] for a in site.user_agents()}
    started = after - before
    assert not started, f"{case}: user agents started: {started}"
    refused = [r for r in site.audit() if r["task_id"] == tid]
    assert [r["outcome"] for r in refused] == ["REFUSED"] and want[0] in refused[0]["reason"]
