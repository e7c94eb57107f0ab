"""What one user of a multi-user endpoint cannot reach of another's (issue 23): bob's task cannot
read alice's home or her stores file, cannot read her keys in Redis by any client (her data
Redis refuses him at authentication; the router's Redis answers NOPERM for her queues even with
his own agent's credentials), and cannot signal her processes; a ref alice shares with bob
resolves for him, and one she does not share is refused."""
from __future__ import annotations

import json
import pwd
from pathlib import Path

import pytest

from skyfn import Executor


def probe(targets):
    """Run in bob's task: try each of alice's things, report what happened."""
    import os

    import redis

    out = {}
    for what, arg in targets:
        try:
            if what == "read":
                open(arg, "rb").read(1)
            elif what == "list":
                os.listdir(arg)
            elif what == "kill":
                os.kill(arg, 0)
            elif what == "redis-nopass":
                redis.Redis(host=arg[0], port=arg[1], socket_timeout=5).get("x")
            elif what == "redis-own-password":
                from skyfn.data import get_redis_client

                mine = get_redis_client().connection_pool.connection_kwargs
                redis.Redis(host=arg[0], port=arg[1], username=mine.get("username"), password=mine.get("password"),
                            socket_timeout=5).get("x")
            elif what == "router":
                client = redis.Redis.from_url(arg[0], socket_timeout=5)
                client.ping()  # his own credentials work...
                client.xrange(arg[1])  # ...but not on her streams
            out[f"{what}"] = "allowed"
        except Exception as exc:  # noqa: BLE001 - what was refused, and how
            out[f"{what}"] = f"{type(exc).__name__}: {exc}"
    return out


def make_refs(bob_id):
    import numpy as np

    from skyfn.data import default_store

    store = default_store()
    shared = store.ref(np.arange(100_000, dtype=np.int64), share_with=[bob_id], ttl=600)
    private = store.ref(np.arange(10, dtype=np.int64), ttl=600)
    return shared, private


def total(x):
    return int(x.sum())


def _agent(site, account):
    return next(a for a in site.user_agents() if a["account"] == account and a["alive"])


def _record(site, key):
    return json.loads((site.endpoint_dir / "router" / "agents" / f"{key}.json").read_text())


def _stores(account):
    home = pwd.getpwnam(account).pw_dir
    files = list(Path(home, ".skyfn", "work", "endpoints").glob("*/data/stores.json"))
    assert len(files) == 1, files
    return files[0], json.loads(files[0].read_text())


def test_bob_cannot_reach_alice_and_a_shared_ref_resolves(site):
    alice, bob = site.user("alice"), site.user("bob")
    ea = Executor(endpoint_id=site.endpoint_id, client=alice)
    eb = Executor(endpoint_id=site.endpoint_id, client=bob)
    try:
        shared, private = ea.submit(make_refs, "bob-id").result(timeout=120)
        assert eb.submit(probe, []).result(timeout=120) == {}  # bob's user agent is up
        a_acct, b_acct = site.accounts["alice"], site.accounts["bob"]
        a_agent, b_agent = _agent(site, a_acct), _agent(site, b_acct)
        stores_file, stores = _stores(a_acct)
        redis_store = next(s for s in stores["stores"].values() if s["connector"]["kind"] == "redis")
        host, port = redis_store["connector"]["host"], redis_store["connector"]["port"]
        a_stream = _record(site, a_agent["key"])
        b_rec = _record(site, b_agent["key"])
        router_port = json.loads((site.endpoint_dir / "router" / "redis.json").read_text())["port"]
        bob_url = f"redis://{b_rec['acl_user']}:{b_rec['password']}@127.0.0.1:{router_port}/0"
        alice_home = pwd.getpwnam(a_acct).pw_dir
        targets = [("list", alice_home), ("read", str(stores_file)), ("kill", a_agent["pid"]),
                   ("redis-nopass", [host, port]), ("redis-own-password", [host, port]),
                   ("router", [bob_url, f"mu:{a_acct}:{a_stream['digest'][:12]}:tasks"])]
        got = eb.submit(probe, targets).result(timeout=120)
        assert got["list"].startswith("PermissionError"), got
        assert got["read"].startswith("PermissionError"), got
        assert got["kill"].startswith("PermissionError"), got
        assert "Authentication" in got["redis-nopass"] or "NOAUTH" in got["redis-nopass"], got
        assert "Authentication" in got["redis-own-password"] or "WRONGPASS" in got["redis-own-password"], got
        assert "NoPermission" in got["router"] or "NOPERM" in got["router"] or "no permissions" in got["router"], got
        # a ref alice shares with bob resolves in his task, through her agent's peer-ref broker
        assert eb.submit(total, shared).result(timeout=120) == sum(range(100_000))
        with pytest.raises(Exception) as info:
            eb.submit(total, private).result(timeout=120)
        assert "RefAccessDenied" in repr(info.value) or "not shared" in str(info.value), info.value
    finally:
        ea.shutdown()
        eb.shutdown()
        alice.close()
        bob.close()
