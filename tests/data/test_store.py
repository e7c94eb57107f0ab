"""skyfn.data's core with real parts: Store over the redis (a real redis-server with a
password) and file connectors, Refs resolved in other processes, capabilities, TTLs,
chunking, the cache, and the errors users see."""
from __future__ import annotations

import pickle
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import redis

from skyfn.data import (DataConfigError, FileConnector, RedisConnector, RefAccessDenied, RefResolutionError, Store,
                        context, is_ref, is_resolved, ref_info)
from skyfn.data import capability
from skyfn.data.connectors import connector_class, from_config
from skyfn.data.store import cache

SECRET = "ab" * 32
PASSWORD = "data-test-password"


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = tmp_path_factory.mktemp("data-redis")
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--requirepass", PASSWORD,
                             "--save", "", "--appendonly", "no", "--dir", str(d)], stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port, password=PASSWORD)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.02)
    yield port
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def user():
    context.set_user("alice")
    cache.items.clear()
    cache.size = 0
    yield "alice"
    context.set_task(None)
    context.set_user(None)
    context.set_user_provider(None)


@pytest.fixture
def rstore(redis_port, user):
    store = Store("r-test", RedisConnector(port=redis_port, password=PASSWORD, chunk_bytes=1 << 20), secret=SECRET)
    yield store
    store.connector.client.flushall()
    store.close()


def _keys(store) -> int:
    return len(list(store.connector.client.scan_iter(match="skyfn:d:*")))


def test_a_ref_pickles_small_and_behaves_as_the_object(rstore):
    ref = rstore.ref({"a": [1, 2, 3], "b": "x"})
    data = pickle.dumps(ref)
    assert len(data) < 600 and not is_resolved(ref)
    back = pickle.loads(data)
    assert is_ref(back) and back["a"] == [1, 2, 3] and len(back) == 2 and "b" in back and is_resolved(back)
    arr = rstore.ref(np.arange(10.0))
    assert float((arr * 2).sum()) == 90.0 and arr.shape == (10,) and isinstance(arr, np.ndarray)
    assert np.asarray(arr)[3] == 3.0
    assert repr(pickle.loads(pickle.dumps(arr))).startswith("<skyfn Ref r-test/")


def test_large_values_are_chunked_and_evict_removes_every_chunk(rstore):
    arr = np.random.default_rng(1).random(450_000)  # 3.4 MiB: chunks of at most 1 MiB
    key = rstore.put(arr)
    assert _keys(rstore) >= 5  # the head and at least 4 chunks
    assert np.array_equal(rstore.get(key), arr)
    rstore.evict(key)
    assert _keys(rstore) == 0 and not rstore.exists(key) and rstore.get(key, "gone") == "gone"


def test_a_ref_resolves_in_another_process_for_its_owner_only(rstore, redis_port, tmp_path):
    arr = np.random.default_rng(2).random(300_000)
    ref = rstore.ref(arr, share_with=["carol"])
    (tmp_path / "ref.pkl").write_bytes(pickle.dumps(ref))
    script = f"""
import pickle, sys, numpy as np
from skyfn.data import Store, RedisConnector, context, RefAccessDenied
Store("r-test", RedisConnector(port={redis_port}, password={PASSWORD!r}), secret={SECRET!r})
context.set_task(sys.argv[1])
ref = pickle.loads(open({str(tmp_path / 'ref.pkl')!r}, "rb").read())
try:
    print(float(np.asarray(ref).sum()))
except RefAccessDenied as e:
    print("DENIED", e)
"""
    out = {who: subprocess.run([sys.executable, "-c", script, who], capture_output=True, text=True, timeout=60)
           for who in ("alice", "carol", "mallory")}
    assert float(out["alice"].stdout) == pytest.approx(arr.sum())
    assert float(out["carol"].stdout) == pytest.approx(arr.sum())
    key = ref_info(ref).key
    assert out["mallory"].stdout.strip() == (
        f"DENIED cannot resolve ref {key!r} of store 'r-test': it belongs to alice and is not shared with mallory: "
        "ask its owner to share it (store.ref(obj, share_with=[...]))")


def test_a_cached_object_is_still_checked_against_the_asking_user(rstore):
    ref = rstore.ref([1, 2])
    assert pickle.loads(pickle.dumps(ref)) == [1, 2]  # now cached in this process
    context.set_task("mallory")
    with pytest.raises(RefAccessDenied):
        pickle.loads(pickle.dumps(ref))[0]


def test_forged_and_altered_capabilities_are_refused(rstore):
    ref = rstore.ref("secret")
    info = ref_info(ref)
    forged = capability.sign(b"\0" * 32, info.store, info.key, "mallory")
    from skyfn.data.ref import Ref

    context.set_task("mallory")
    with pytest.raises(RefResolutionError, match="not signed by this store"):
        str(Ref(info.__class__(**{**info.__dict__, "capability": forged})))
    other = rstore.ref("other")
    with pytest.raises(RefResolutionError, match="not signed by this store"):  # a capability moved to another key
        str(Ref(info.__class__(**{**info.__dict__, "key": ref_info(other).key})))


def test_expired_refs_fail_with_the_store_key_and_reason(rstore, tmp_path, user):
    ref = rstore.ref([1], ttl=0.3)
    time.sleep(0.5)
    with pytest.raises(RefResolutionError) as err:
        pickle.loads(pickle.dumps(ref))[0]
    assert ref_info(ref).key in str(err.value) and "'r-test'" in str(err.value) and "expired" in str(err.value)
    fstore = Store("f-test", FileConnector(str(tmp_path / "files")), secret=SECRET)
    key = fstore.put({"x": 1}, ttl=0.2)
    assert fstore.exists(key)
    time.sleep(0.4)
    assert not fstore.exists(key) and fstore.get(key) is None


def test_a_ref_made_with_evict_resolves_once(rstore):
    ref = rstore.ref(np.ones(5), evict=True)
    assert pickle.loads(pickle.dumps(ref)).sum() == 5.0
    assert _keys(rstore) == 0
    with pytest.raises(RefResolutionError, match="already used"):
        pickle.loads(pickle.dumps(ref)).sum()


def test_unknown_store_and_connector_names_are_clear_errors(user):
    with pytest.raises(DataConfigError, match="unknown connector 'ftp': use one of direct, file, globus, redis, s3"):
        connector_class("ftp")
    with pytest.raises(DataConfigError, match="needs 'kind'"):
        from_config({"directory": "/tmp"})
    from skyfn.data.ref import Ref, RefInfo

    orphan = Ref(RefInfo("nowhere", {"kind": "redis"}, "k", "x.y"))
    with pytest.raises(RefResolutionError, match="store 'nowhere' is not known in this process"):
        orphan + 1


def test_a_ref_needs_an_owner(tmp_path):
    context.set_user(None)
    context.set_user_provider(None)  # an Executor of an earlier test may have left its client's whoami
    store = Store("f-owner", FileConnector(str(tmp_path)), secret=SECRET)
    with pytest.raises(DataConfigError, match="a ref needs an owner"):
        store.ref([1])


def test_a_redis_store_refuses_a_wrong_password(redis_port):
    with pytest.raises(redis.AuthenticationError):
        RedisConnector(port=redis_port, password="wrong").put("k", [b"x"])
