"""Forged results and updates for another user's task, from bob's side (issue 36).

Bob holds what his own user agent holds: the config it reads on stdin when the endpoint starts
it -- his lane's queue login to the service's Redis (XADD to the shared results stream) and his
lane's MAC key -- and its login to the router's Redis (read here from the agent's record in the
endpoint's state directory, which holds exactly those). While alice's task runs on the same
multi-user endpoint he adds to the service's results stream, about her task: an unsealed pack
naming the multi-user endpoint; a pack sealed with his own real lane key; packs sealed with a
wrong key, with his key under alice's lane name, with another lane's real key (dave's, as if
dave's agent were his too), and with his lane key as if it were the endpoint's results key;
and forged updates (RUNNING with a lease already expired, LEASE far in the future) and a
forged FAILED. He also puts a forged pack about her task on his own results stream in the
router's Redis, which the router forwards for agents without a lane.

The service consumes every entry, and none has an effect: alice's task ends with her own
value (the future's and `get_result`'s), produced by the endpoint it was sent to, never sent
back to the queue by an expired lease; her audit line is hers, once. The same seal and login
applied to bob's *own* running task do finish it -- the key is real, the refusal is the
binding. dave (the third user; carol of the fixture is a denied account) is served before,
during and after.
"""
from __future__ import annotations

import json
import secrets
import time

import redis

from skyfn import Executor
from skyfn.protocol import lanes, result_seal
from skyfn.protocol.messages import ResultPack, TaskResult, TaskUpdate
from skyfn.protocol.serialize import serialize
from tests.mu_endpoint.tenant import (agent_login, agent_of, nap, record_of, square, third_user_served, wait_for,
                                      wait_state)

NAP = 25  # alice's task runs this long: every forgery is consumed while it is RUNNING


def _lane_of(site, role) -> dict:
    """The lane grant `role`'s user agent got on stdin (lane name, MAC key, queue logins)."""
    rec = wait_for(lambda: (lambda r: r if r.get("lane") else None)(record_of(site, agent_of(site, role)["key"])),
                   what=f"a lane for {role}'s user agent")
    return rec["lane"]


def _service_admin(site) -> redis.Redis:
    return redis.Redis.from_url(site.state.read_runtime()["redis_url"], socket_timeout=10)


def _consumed(admin: redis.Redis, stream: str, timeout: float = 60.0) -> None:
    """Wait until the service's reader has taken and acknowledged every entry of the results stream."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        groups = admin.xinfo_groups(stream)
        if groups and all(g["lag"] == 0 and g["pending"] == 0 for g in groups):
            return
        time.sleep(0.1)
    raise AssertionError(f"the results stream was not consumed within {timeout} s: {admin.xinfo_groups(stream)}")


def _pack(endpoint_id, results=(), updates=()) -> bytes:
    return ResultPack(endpoint_id=endpoint_id, results=list(results), updates=list(updates)) \
        .model_dump_json(exclude_none=True).encode()


def test_bobs_lane_credentials_cannot_forge_alices_result_or_progress(site):
    third_user_served(site)  # before
    alice, bob = site.user("alice"), site.user("bob")
    ea = Executor(endpoint_id=site.endpoint_id, client=alice)
    eb = Executor(endpoint_id=site.endpoint_id, client=bob)
    ep = site.endpoint_id
    admin = _service_admin(site)
    try:
        # every agent up, with its lane
        assert ea.submit(square, 2).result(timeout=120) == 4
        assert eb.submit(square, 3).result(timeout=120) == 9
        third_user_served(site, n=1)
        mine, hers, daves = _lane_of(site, "bob"), _lane_of(site, "alice"), _lane_of(site, "dave")
        assert mine["endpoint_id"] == ep and len({mine["lane"], hers["lane"], daves["lane"]}) == 3
        results_stream = mine["results_queue"]["name"]
        login = redis.Redis.from_url(mine["results_queue"]["url"], socket_timeout=10)  # ln-<ep>-<bob's lane>
        router_login, prefix = agent_login(site, "bob")

        fa = ea.submit(nap, NAP)  # alice's task, running while bob forges
        fb = eb.submit(nap, 40)   # bob's own, for the control
        wait_state(alice, fa, ("RUNNING",))
        running_since = time.monotonic()
        wait_state(bob, fb, ("RUNNING",))
        tid = fa.task_id
        success = TaskResult(task_id=tid, state="SUCCEEDED", result=serialize("bob's value"),
                             events=[("SUCCEEDED", time.time())])
        failure = TaskResult(task_id=tid, state="FAILED", reason="bob says it failed",
                             events=[("FAILED", time.time())])
        forever = TaskUpdate(task_id=tid, state="LEASE", ts=time.time(), lease_seconds=1.0e7)
        wrong_key = secrets.token_hex(32)

        def variants(pack: bytes) -> dict[str, bytes]:
            """The pack as bob can send it: (1) unsealed, naming the multi-user endpoint; (2) sealed with
            his own real lane key; (3) sealed with a wrong key, with his key under alice's lane name,
            with another lane's real key (dave's), with his lane key as if it were the endpoint's."""
            return {"unsealed": pack,
                    "bob's seal": lanes.seal(mine["lane"], mine["mac_key"], pack),
                    "wrong key": lanes.seal(mine["lane"], wrong_key, pack),
                    "alice's lane, bob's key": lanes.seal(hers["lane"], mine["mac_key"], pack),
                    "dave's lane and key": lanes.seal(daves["lane"], daves["mac_key"], pack),
                    "endpoint seal, bob's key": result_seal.seal(ep, mine["mac_key"], pack),
                    "endpoint seal, wrong key": result_seal.seal(ep, wrong_key, pack)}

        def send(pack: bytes) -> None:
            for body in variants(pack).values():
                assert login.xadd(results_stream, {"b": body})  # his login may add: the service must refuse

        # a forged SUCCEEDED (with a RUNNING update), a forged FAILED (with a lease forever)
        send(_pack(ep, [success], [TaskUpdate(task_id=tid, state="RUNNING", ts=time.time())]))
        send(_pack(ep, [failure], [forever]))
        send(_pack(ep, updates=[forever]))
        # (5) the router forwards what an agent without a lane sends; bob's pack names alice's task
        router_login.xadd(prefix + "results", {"b": _pack(ep, [success])})
        router_login.xadd(prefix + "results", {"b": _pack(ep, [failure], [forever])})
        wait_for(lambda: router_login.xlen(prefix + "results") == 0, what="the router to take bob's pack")
        _consumed(admin, results_stream)
        lease = admin.zscore("leases", tid)
        assert lease is None or lease < time.time() + 3600, lease  # no forged lease forever
        now = alice.get_task(tid)
        if time.monotonic() - running_since < NAP - 2:
            assert now["state"] == "RUNNING", now
        assert now["state"] in ("RUNNING", "SUCCEEDED"), now

        # (4) forged progress: a lease already expired, again and again over more than a period of the
        # reaper (5 s), so that her agent's own lease extensions (every 4/3 s) cannot hide one that took
        deadline = time.monotonic() + 7
        while time.monotonic() < deadline:
            send(_pack(ep, updates=[TaskUpdate(task_id=tid, state="RUNNING", ts=time.time(), lease_seconds=-3600.0),
                                    TaskUpdate(task_id=tid, state="LEASE", ts=time.time(), lease_seconds=-3600.0)]))
            time.sleep(0.25)
        _consumed(admin, results_stream)
        time.sleep(1.0)
        assert int(admin.hget(f"t:{tid}", "r") or 0) == 0  # never requeued (nor failed) by a forged, expired lease
        now = alice.get_task(tid)
        if time.monotonic() - running_since < NAP - 2:
            assert now["state"] == "RUNNING", now
        assert now["state"] in ("RUNNING", "SUCCEEDED"), now

        third_user_served(site)  # during

        # the control: the same login and seal finish bob's *own* running task
        mine_done = TaskResult(task_id=fb.task_id, state="SUCCEEDED", result=serialize("bob's own"),
                               events=[("SUCCEEDED", time.time())])
        login.xadd(results_stream, {"b": lanes.seal(mine["lane"], mine["mac_key"], _pack(ep, [mine_done]))})
        _consumed(admin, results_stream)
        assert wait_state(bob, fb, ("SUCCEEDED",), timeout=30) == "SUCCEEDED"
        assert bob.get_result(fb.task_id, timeout=30) == "bob's own"

        assert fa.result(timeout=120) == NAP  # her own value
        assert alice.get_result(tid, timeout=30) == NAP
        final = alice.get_task(tid)
        assert final["state"] == "SUCCEEDED" and final.get("result_by", ep) == ep == final["endpoint_id"], final
        assert int(admin.hget(f"t:{tid}", "r") or 0) == 0

        lines = site.audit_of([tid])
        assert len(lines) == 1, lines  # her line, once
        line = lines[0]
        assert (line["identity"]["id"], line["account"], line["outcome"], line["function"]["name"]) == \
            ("alice-id", site.accounts["alice"], "SUCCEEDED", "nap"), line
        assert "reason" not in line
        assert not [d for d in site.disagreements() if (d.get("claimed") or {}).get("task_id") == tid]
    finally:
        ea.shutdown()
        eb.shutdown()
        alice.close()
        bob.close()
        admin.close()
    third_user_served(site)  # after
    assert json.loads((site.endpoint_dir / "status.json").read_text())["state"] == "running"
