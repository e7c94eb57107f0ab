"""Helpers of the tenant-integrity tests (issue 36): what an attacker holds and how a third user
is shown to be served throughout.

Bob's attacks use what his own user agent holds -- its login to the router's Redis (a task of
his can read it from the agent's memory or its stdin, as issue 36 reproduced) -- read here from
the agent's record, which holds exactly that login."""
from __future__ import annotations

import json
import time

import redis

from skyfn import Executor


def square(x):
    return x * x


def nap(seconds):
    import time

    time.sleep(seconds)
    return seconds


def innocent(x):
    return x


def agent_of(site, role, timeout=60):
    """The live user agent entry (status file) of `role`'s account."""
    account = site.accounts[role]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for a in site.user_agents():
            if a["account"] == account and a["alive"] and a["pid"]:
                return a
        time.sleep(0.1)
    raise AssertionError(f"no live user agent of {account}: {site.user_agents()}")


def record_of(site, key):
    return json.loads((site.endpoint_dir / "router" / "agents" / f"{key}.json").read_text())


def router_port(site) -> int:
    return json.loads((site.endpoint_dir / "router" / "redis.json").read_text())["port"]


def agent_login(site, role):
    """(redis client logged in as `role`'s user agent on the router's Redis, its key prefix)."""
    rec = record_of(site, agent_of(site, role)["key"])
    client = redis.Redis(host="127.0.0.1", port=router_port(site), username=rec["acl_user"],
                         password=rec["password"], socket_timeout=10)
    return client, f"mu:{rec['account']}:{rec['digest'][:12]}:"


def wait_state(client, future, states, timeout=120):
    """Wait until the task of an Executor future (its id is set once submitted) is in `states`."""
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        if future.task_id is None:
            time.sleep(0.05)
            continue
        state = client.get_task(future.task_id)["state"]
        if state in states:
            return state
        time.sleep(0.1)
    raise AssertionError(f"task {future.task_id} is {state}, not one of {states} after {timeout} s")


def wait_for(predicate, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"{what} not met within {timeout} s")


def third_user_served(site, n=3):
    """dave's tasks run as dave: the endpoint serves a third user."""
    with site.user("dave") as dave, Executor(endpoint_id=site.endpoint_id, client=dave) as ex:
        assert [f.result(timeout=120) for f in [ex.submit(square, i) for i in range(n)]] == \
            [i * i for i in range(n)]
    assert site.proc.poll() is None, site.log_tail()
