"""Forged audit copies and the router login's commands, from bob's side (issue 36).

With his own user agent's login to the router's Redis, bob writes audit copies: a task that
never existed, under alice's identity; a copy of alice's running task naming his account, to
pre-empt her line; his own running task rewritten as a FAILED call of an innocent function, and
again after its true line; and another of his own running tasks reported FAILED, every other
field as the routing record has it (the first copy of a task used to be the one written). Each
is logged as a disagreement and none is written as a task's line: a line's outcome is the
service's final state, which the privileged process asks with the endpoint's credential;
alice's and bob's true lines are written, once each, SUCCEEDED. The same login cannot load, flush or
run code in Redis, nor touch what is not his; identities.json is not readable by an account
without a user agent. dave is served throughout."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import uuid

import pwd
import pytest
import redis

from skyfn import Executor
from tests.mu_endpoint.tenant import (agent_login, innocent, nap, square, third_user_served, wait_for,
                                      wait_state)


def _copy(task_id, state, identity_id=None, function_id=None, name=None):
    return {"task_id": task_id, "function_id": function_id, "function_name": name, "identity_id": identity_id,
            "state": state, "events": [["RUNNING", 1.0e9], [state, 1.0e9 + 1]], "reason": "forged"}


def _send(client, prefix, copies):
    client.xadd(prefix + "results", {"b": json.dumps({"audit": copies}).encode()})


def test_forged_audit_copies_are_disagreements_and_the_true_lines_stand(site):
    third_user_served(site)
    alice, bob = site.user("alice"), site.user("bob")
    ea = Executor(endpoint_id=site.endpoint_id, client=alice)
    eb = Executor(endpoint_id=site.endpoint_id, client=bob)
    try:
        assert ea.submit(square, 2).result(timeout=120) == 4  # both agents up, with lanes
        assert eb.submit(square, 3).result(timeout=120) == 9
        login, prefix = agent_login(site, "bob")
        fid_innocent = bob.register_function(innocent)
        before = len(site.disagreements())

        fa = ea.submit(nap, 6)  # alice's task, running while bob forges
        fb = eb.submit(nap, 6)  # bob's own
        fc = eb.submit(nap, 6)  # and another
        wait_state(alice, fa, ("RUNNING",))
        wait_state(bob, fb, ("RUNNING",))
        wait_state(bob, fc, ("RUNNING",))
        ghost = str(uuid.uuid4())
        _send(login, prefix, [
            _copy(ghost, "SUCCEEDED", identity_id="alice-id", function_id=fid_innocent, name="innocent"),
            _copy(fa.task_id, "FAILED"),  # pre-empting alice's line with one of his agent
            _copy(fb.task_id, "FAILED", function_id=fid_innocent, name="innocent"),  # rewriting his own
            _copy(fc.task_id, "FAILED", identity_id="bob-id", name="nap"),  # his own, only the outcome false
        ])
        forged = wait_for(lambda: [d for d in site.disagreements()[before:]] if
                          len(site.disagreements()) - before >= 3 else None, what="three disagreements")
        assert fa.result(timeout=120) == 6 and fb.result(timeout=120) == 6 and fc.result(timeout=120) == 6
        lines = site.audit_of([fa.task_id, fb.task_id, fc.task_id])
        by_task = {r["task_id"]: r for r in lines}
        assert sorted(r["task_id"] for r in lines) == sorted([fa.task_id, fb.task_id, fc.task_id]), lines  # once each
        a_line, b_line, c_line = by_task[fa.task_id], by_task[fb.task_id], by_task[fc.task_id]
        # the service's final state, not bob's copy: SUCCEEDED, and his FAILED is a disagreement
        assert (c_line["identity"]["id"], c_line["account"], c_line["outcome"], c_line["function"]["name"]) == \
            ("bob-id", site.accounts["bob"], "SUCCEEDED", "nap")
        (c_claim,) = wait_for(lambda: [d for d in site.disagreements()[before:]
                                       if d["claimed"]["task_id"] == fc.task_id], what="the disagreement of fc")
        assert c_claim["claimed"]["state"] == "FAILED" and c_claim["user_agent"]["account"] == site.accounts["bob"]
        assert f"the service's final state of task {fc.task_id} is SUCCEEDED; this copy reports FAILED" in \
            c_claim["disagreement"]
        assert len(site.disagreements()) - before == 4
        assert (a_line["identity"]["id"], a_line["account"], a_line["outcome"]) == \
            ("alice-id", site.accounts["alice"], "SUCCEEDED")
        assert a_line["uid"] == pwd.getpwnam(site.accounts["alice"]).pw_uid
        assert (a_line["function"]["name"], b_line["function"]["name"]) == ("nap", "nap")
        assert (b_line["identity"]["id"], b_line["account"], b_line["outcome"]) == \
            ("bob-id", site.accounts["bob"], "SUCCEEDED")
        assert "reason" not in a_line and "reason" not in b_line
        assert not [r for r in site.audit() if r["task_id"] == ghost]
        reasons = {d["claimed"]["task_id"]: d["disagreement"] for d in forged[:3]}
        assert "was not routed to user agent" in reasons[ghost]
        assert "was not routed to user agent" in reasons[fa.task_id] or "another user agent" in reasons[fa.task_id]
        assert "function" in reasons[fb.task_id] and "the routing record says" in reasons[fb.task_id]
        assert all(d["user_agent"]["account"] == site.accounts["bob"] for d in forged)

        # after the true line: a second copy of his own task with another outcome changes nothing
        n = len(site.disagreements())
        _send(login, prefix, [_copy(fb.task_id, "FAILED")])
        late = wait_for(lambda: site.disagreements()[n:], what="a disagreement for the late copy")
        assert "already audited as SUCCEEDED" in late[0]["disagreement"]
        assert [r["outcome"] for r in site.audit() if r["task_id"] == fb.task_id] == ["SUCCEEDED"]
        assert alice.get_task(fa.task_id)["state"] == "SUCCEEDED"
    finally:
        ea.shutdown()
        eb.shutdown()
        alice.close()
        bob.close()
    third_user_served(site)


@pytest.mark.parametrize("command", [
    ("FUNCTION", "LOAD", "REPLACE", "#!lua name=evil\nredis.register_function('evil', function() return 1 end)"),
    ("FUNCTION", "FLUSH"), ("FUNCTION", "DELETE", "skyfn_q1"), ("SCRIPT", "FLUSH"), ("SCRIPT", "LOAD", "return 1"),
    ("EVAL", "return 1", "0"), ("EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "0"),
    ("FLUSHALL",), ("FLUSHDB",), ("KEYS", "*"), ("SCAN", "0"), ("CONFIG", "GET", "*"), ("ACL", "LIST"),
    ("CLIENT", "LIST")])
def test_the_router_login_cannot_run_code_flush_or_administer(site, command):
    with site.user("bob") as bob, Executor(endpoint_id=site.endpoint_id, client=bob) as ex:
        assert ex.submit(square, 4).result(timeout=120) == 16
    login, prefix = agent_login(site, "bob")
    with pytest.raises(redis.exceptions.NoPermissionError):
        login.execute_command(*command)
    admin = site_admin(site)
    assert admin.execute_command("FUNCTION", "LIST", "LIBRARYNAME", "skyfn_q1")  # the queue functions stay


def test_the_router_login_reaches_only_its_own_keys_with_queue_commands(site):
    with site.user("alice") as alice, Executor(endpoint_id=site.endpoint_id, client=alice) as ex:
        assert ex.submit(square, 5).result(timeout=120) == 25
    _, alice_prefix = agent_login(site, "alice")
    login, prefix = agent_login(site, "bob")
    for command in (("DEL", prefix + "results"), ("XTRIM", prefix + "tasks", "MAXLEN", "0"),
                    ("XGROUP", "DESTROY", prefix + "tasks", "agents"), ("XSETID", prefix + "tasks", "99999-0"),
                    ("XRANGE", alice_prefix + "tasks", "-", "+"), ("XADD", alice_prefix + "results", "*", "b", "x"),
                    ("SET", prefix + "seen", "99999999999999-0"), ("XADD", "mu:routes", "*", "b", "x"),
                    ("HSET", "mu:routes", "t", "x"), ("GET", alice_prefix + "seen")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            login.execute_command(*command)
    assert login.ping() and login.xlen(prefix + "results") >= 0  # its own queue commands work
    with site.user("bob") as bob, Executor(endpoint_id=site.endpoint_id, client=bob) as ex:
        assert ex.submit(square, 6).result(timeout=120) == 36


def test_identities_file_is_readable_only_by_user_agents(site):
    from endpoint_agent.multiuser.configure import MultiUserConfig

    third_user_served(site)
    path = site.runtime_dir / "identities.json"
    st = os.stat(path)
    gid = MultiUserConfig(multi_user=True).peer_gid
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, gid, 0o640)
    carol = pwd.getpwnam(site.accounts["carol"])  # an account of the host without a user agent
    done = subprocess.run(["cat", str(path)], user=carol.pw_uid, group=carol.pw_gid, extra_groups=[carol.pw_gid],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "Permission denied" in done.stderr, done
    with site.user("dave") as dave, Executor(endpoint_id=site.endpoint_id, client=dave) as ex:
        mapping = ex.submit(read_json, str(path)).result(timeout=120)  # dave's agent (its peer-ref broker) reads it
    assert "dave-id" in mapping[str(pwd.getpwnam(site.accounts["dave"]).pw_uid)]


def read_json(path):
    import json

    with open(path) as f:
        return json.load(f)


def site_admin(site):
    from tests.mu_endpoint.tenant import router_port

    password = (site.endpoint_dir / "router" / "router.password").read_text().strip()
    return redis.Redis(host="127.0.0.1", port=router_port(site), username="skyfn-router", password=password,
                       socket_timeout=10)
