"""The data plane through the embedded runtime (issue 12): refs on the endpoint's own Redis.

The e2e endpoint's config has `data: {default: redis, redis: {start: true}}`: its agent
starts a redis-server with a generated password and publishes the store to its workers.
Shown here with real processes: a 100 MB array passed A -> B by ref gives equal values (the
endpoint's Redis, and a user's own S3 bucket on the runtime's moto and shared directory);
the Executor turns a large argument into a ref by itself and evicts it when the task is
done; another user's task holding a ref is refused with a clear error; an evicted ref fails
its task naming the ref, its store and the reason; after 1,000 tasks with refs the Redis
key count is back at its baseline; `get_redis_client()` works inside a task.
"""
from __future__ import annotations

import hashlib
import json
import time

import numpy as np
import pytest
import redis

from skyfn import Client, Executor
from skyfn.data import RefAccessDenied, RefResolutionError, is_ref, ref_info

N = 13_107_200  # float64: 100 MiB


def produce(n, seed):
    import numpy as np

    from skyfn.data import default_store

    arr = np.random.default_rng(seed).random(n)
    return default_store().ref(arr, ttl=600)


def consume(arr):
    import hashlib

    import numpy as np

    a = np.asarray(arr)
    return [hashlib.sha256(a.tobytes()).hexdigest(), str(a.dtype), int(a.shape[0])]


def share_with(n, seed, user):
    import numpy as np

    from skyfn.data import default_store

    return default_store().ref(np.random.default_rng(seed).random(n), ttl=600, share_with=[user])


def evict_it(ref):
    from skyfn.data import default_store, ref_info

    default_store().evict(ref_info(ref).key)
    return True


def length(x):
    return len(x)


def counter(name):
    from skyfn.data import get_redis_client

    r = get_redis_client()
    value = r.incr(f"user:{name}")
    r.expire(f"user:{name}", 60)
    return value


def produce_into(kind, where, secret, n, seed):
    """Task A with a store of the user's own (s3 bucket / shared directory), its secret passed along."""
    import numpy as np

    from skyfn.data import FileConnector, S3Connector, Store

    connector = S3Connector(where["bucket"], endpoint_url=where["url"]) if kind == "s3" else FileConnector(where)
    store = Store(f"mine-{kind}", connector, secret=secret)
    return store.ref(np.random.default_rng(seed).random(n), ttl=600)


def consume_from(kind, where, secret, arr):
    from skyfn.data import FileConnector, S3Connector, Store

    connector = S3Connector(where["bucket"], endpoint_url=where["url"]) if kind == "s3" else FileConnector(where)
    Store(f"mine-{kind}", connector, secret=secret)  # registered in this worker: the ref names it
    return consume(arr)


def _stores(home) -> dict:
    return json.loads((home / "endpoints" / "local" / "data" / "stores.json").read_text())


def _redis(home) -> redis.Redis:
    doc = _stores(home)
    conn = doc["stores"][doc["default"]]["connector"]
    with open(conn["password_file"]) as f:
        return redis.Redis(host=conn["host"], port=conn["port"], password=f.read().strip())


def _data_keys(r: redis.Redis) -> int:
    return sum(1 for _ in r.scan_iter(match="skyfn:d:*", count=1000))


def _digest(a: np.ndarray) -> list:
    return [hashlib.sha256(a.tobytes()).hexdigest(), str(a.dtype), int(a.shape[0])]


def test_the_endpoint_redis_has_a_password_and_its_store_file_is_private(local_home):
    doc = _stores(local_home)
    conn = doc["stores"][doc["default"]]["connector"]
    assert doc["default"].startswith("redis@")
    assert (local_home / "endpoints" / "local" / "data" / "stores.json").stat().st_mode & 0o077 == 0
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host=conn["host"], port=conn["port"]).ping()
    with open(conn["password_file"]) as f:
        password = f.read().strip()
    assert len(password) >= 32 and password not in json.dumps(doc)  # a file path in the doc, never the value


def test_pipeline_a_to_b_passes_100mb_by_ref(local_home, client, endpoint_id):
    expected = _digest(np.random.default_rng(7).random(N))
    with Executor(endpoint="local", client=client) as ex:
        ref = ex.submit(produce, N, 7).result(timeout=180)
        assert is_ref(ref)  # the result travelled as a ref: a few hundred bytes, not 100 MB
        info = ref_info(ref)
        assert info.size > 100 * 2**20 and info.store.startswith("redis@") and info.owner == client.whoami()
        assert ex.submit(consume, ref).result(timeout=180) == expected
        # the SDK resolves it too: the local endpoint's store is registered by the Executor
        assert _digest(np.asarray(ref)) == expected


def test_large_arguments_become_refs_and_are_evicted_when_their_task_is_done(local_home, client):
    r = _redis(local_home)
    before = _data_keys(r)
    arr = np.random.default_rng(3).random(N // 4)  # 25 MiB: above the 1 MiB threshold
    with Executor(endpoint="local", client=client) as ex:
        fut = ex.submit(consume, arr)
        assert _data_keys(r) > before  # stored on the endpoint's Redis, not sent inline
        assert fut.result(timeout=180) == _digest(arr)
        deadline = time.time() + 10
        while _data_keys(r) != before and time.time() < deadline:
            time.sleep(0.05)
        assert _data_keys(r) == before
        assert ex._arg_refs.outstanding() == 0
        assert ex.submit(length, [1, 2, 3]).result(timeout=60) == 3  # small ones stay inline


def test_another_users_task_cannot_resolve_a_ref(local_home, client, endpoint_id):
    from infra.local import runtime
    from infra.local.state import StateDir

    bob_token = runtime.mint_token(StateDir.at(local_home), "bob-data")
    fid_produce, fid_consume = client.register_function(produce), client.register_function(consume)
    client.share("endpoints", endpoint_id, "user:bob-data")
    client.share("functions", fid_consume, "user:bob-data")
    try:
        ref = client.get_result(client.run(fid_produce, 1000, 1, endpoint_id=endpoint_id), timeout=120)
        with Client(client.service_url, bob_token) as bob:
            tid = bob.run(fid_consume, ref, endpoint_id=endpoint_id)
            with pytest.raises(RefAccessDenied) as err:
                bob.get_result(tid, timeout=120)
            msg = str(err.value)
            assert ref_info(ref).key in msg and ref_info(ref).store in msg
            assert f"belongs to {client.whoami()}" in msg and "not shared with bob-data" in msg
            assert bob.get_task(tid)["state"] == "FAILED"
            # shared with bob: his task resolves it
            shared = client.get_result(client.run(client.register_function(share_with), 1000, 2, "bob-data",
                                                  endpoint_id=endpoint_id), timeout=120)
            assert bob.get_result(bob.run(fid_consume, shared, endpoint_id=endpoint_id), timeout=120)[2] == 1000
    finally:
        client.unshare("endpoints", endpoint_id, "user:bob-data")


def test_an_evicted_ref_fails_its_task_with_the_ref_store_and_reason(local_home, client):
    with Executor(endpoint="local", client=client) as ex:
        ref = ex.submit(produce, 100, 1).result(timeout=120)
        assert ex.submit(evict_it, ref).result(timeout=120) is True
        with pytest.raises(RefResolutionError) as err:
            ex.submit(consume, ref).result(timeout=120)
    info = ref_info(ref)
    assert info.key in str(err.value) and info.store in str(err.value)
    assert "evicted by its owner, past its TTL" in str(err.value)


def test_a_thousand_tasks_with_refs_leave_no_keys_behind(local_home, client):
    r = _redis(local_home)
    before = _data_keys(r)
    args = [np.full(300_000, i, dtype=np.float64) for i in range(10)]  # 2.3 MiB each: refs
    with Executor(endpoint="local", client=client) as ex:
        futures = [ex.submit(length, args[i % 10]) for i in range(1000)]
        assert [f.result(timeout=300) for f in futures] == [300_000] * 1000
        deadline = time.time() + 20
        while (_data_keys(r) != before or ex._arg_refs.outstanding()) and time.time() < deadline:
            time.sleep(0.1)
    assert ex._arg_refs.outstanding() == 0
    assert _data_keys(r) == before


def test_get_redis_client_inside_a_task(local_home, client):
    with Executor(endpoint="local", client=client) as ex:
        assert [ex.submit(counter, "c").result(timeout=60) for _ in range(3)] == [1, 2, 3]


@pytest.mark.parametrize("kind", ["s3", "file"])
def test_pipeline_a_to_b_through_a_users_own_s3_or_file_store(local_home, client, kind, tmp_path):
    import secrets

    import boto3

    from infra.local.state import StateDir

    secret = secrets.token_hex(32)
    if kind == "s3":
        url = StateDir.at(local_home).read_runtime()["aws_endpoint"]
        bucket = f"e2e-data-{secrets.token_hex(4)}"
        boto3.client("s3", endpoint_url=url).create_bucket(Bucket=bucket)
        where = {"bucket": bucket, "url": url}
    else:
        where = str(tmp_path / "shared")
    expected = _digest(np.random.default_rng(11).random(N))
    with Executor(endpoint="local", client=client) as ex:
        ref = ex.submit(produce_into, kind, where, secret, N, 11).result(timeout=300)
        assert is_ref(ref) and ref_info(ref).store == f"mine-{kind}" and ref_info(ref).size > 100 * 2**20
        assert ex.submit(consume_from, kind, where, secret, ref).result(timeout=300) == expected


def test_refs_survive_an_agent_killed_hard_and_its_redis_is_kept(local_home, client):
    """An agent killed with SIGKILL leaves its data Redis up; the next agent keeps that
    server (same pid, same port) instead of starting an empty second one."""
    import os
    import signal

    import psutil

    from infra.local import agent

    record = local_home / "endpoints" / "local" / "data" / "redis.json"
    before = json.loads(record.read_text())
    with Executor(endpoint="local", client=client) as ex:
        ref = ex.submit(produce, 1000, 5).result(timeout=120)
    pid = int(agent.pidfile(local_home, "local").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(pid)], timeout=15)
    agent.start("local", local_home)
    after = json.loads(record.read_text())
    assert (after["pid"], after["port"]) == (before["pid"], before["port"])
    # redis-server shows itself as "redis-server HOST:PORT": one server on the recorded port
    servers = [p for p in psutil.process_iter(["cmdline"])
               if p.info["cmdline"] and " ".join(p.info["cmdline"]).split()[-2:]
               in (["/usr/bin/redis-server", f"127.0.0.1:{after['port']}"], ["redis-server", f"127.0.0.1:{after['port']}"])]
    assert [p.pid for p in servers] == [after["pid"]]
    with Executor(endpoint="local", client=client) as ex:
        assert ex.submit(consume, ref).result(timeout=120)[2] == 1000
