"""The lifetime of the Executor's argument refs (skyfn.data.autoref, issue 23) on a real redis-server.

ArgumentRefs puts every large argument with a TTL (default 24 h, SKYFN_ARG_REF_TTL, or the
Executor's arg_ref_ttl) and marks its refs `task_argument`; refs users make are not marked and
keep their own TTL, as do refs pickled by SDKs that predate the field. The worker's side --
finding a task's marked refs (only genuine ones of the task's own user) and evicting them --
runs here against the same Redis; the worker process itself is exercised end to end in
tests/e2e/test_argument_ref_lifetime.py.
"""
from __future__ import annotations

import pickle
import time

import numpy as np
import pytest
import redis

from skyfn.data import RedisConnector, Store, capability, context, is_ref, ref_info
from skyfn.data.autoref import (DEFAULT_TTL, TTL_ENV, ArgumentRefs, argument_ttl, evict_task_arguments,
                                task_argument_refs)
from skyfn.data.ref import Ref, RefInfo
from skyfn.data.store import cache
from skyfn.protocol.serialize import unpack_args

SECRET = "cd" * 32
BIG = 3 << 20  # bytes: above the 1 MiB threshold, and above the 1 MiB chunk size used here


@pytest.fixture
def store(redis_url, redis_server):
    context.set_user("alice")
    s = Store("argrefs-test", RedisConnector(port=redis_server.port, chunk_bytes=1 << 20), secret=SECRET)
    yield s
    s.close()
    context.set_task(None)
    context.set_user(None)
    cache.items.clear()
    cache.size = 0


@pytest.fixture
def r(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def _keys_of(r, info) -> list[bytes]:
    """The header key of a ref and its chunk keys."""
    return sorted(r.scan_iter(match=f"skyfn:d:{info.key}*"))


def test_argument_refs_are_put_with_the_default_ttl_and_marked(store, r, monkeypatch):
    monkeypatch.delenv(TTL_ENV, raising=False)
    refs = ArgumentRefs(store, "alice")
    assert refs.ttl == DEFAULT_TTL == 86400
    big, arr = bytes(BIG), np.arange(BIG // 8, dtype=np.float64)
    payload, made = refs.pack((big, 7), {"arr": arr, "small": [1, 2]})
    assert len(made) == 2 and all(info.task_argument for info in made)
    args, kwargs = unpack_args(payload)
    assert is_ref(args[0]) and is_ref(kwargs["arr"]) and args[1] == 7 and kwargs["small"] == [1, 2]
    assert [ref_info(args[0]), ref_info(kwargs["arr"])] == made  # what travels is what was tracked
    for info in made:
        keys = _keys_of(r, info)
        assert len(keys) >= 4  # the header and its 1 MiB chunks: every one expires
        ttls = [r.ttl(k) for k in keys]
        assert all(DEFAULT_TTL - 60 < t <= DEFAULT_TTL for t in ttls), ttls
        cap = capability.verify(store.secret, store.name, info.key, info.capability)
        assert cap.owner == "alice" and DEFAULT_TTL - 60 < cap.expires - time.time() <= DEFAULT_TTL
    assert bytes(args[0]) == big and np.array_equal(np.asarray(kwargs["arr"]), arr)


def test_the_ttl_comes_from_the_executor_option_else_the_environment(store, r, monkeypatch):
    monkeypatch.setenv(TTL_ENV, "300")
    assert ArgumentRefs(store, "alice").ttl == 300.0
    _, made = ArgumentRefs(store, "alice").pack((bytes(BIG),), {})
    assert all(280 < r.ttl(k) <= 300 for k in _keys_of(r, made[0]))
    _, made = ArgumentRefs(store, "alice", ttl=45).pack((bytes(BIG),), {})  # Executor(arg_ref_ttl=45)
    assert all(30 < r.ttl(k) <= 45 for k in _keys_of(r, made[0]))


@pytest.mark.parametrize("bad", [0, -5, float("nan"), float("inf")])
def test_argument_refs_always_expire(bad, monkeypatch):
    monkeypatch.delenv(TTL_ENV, raising=False)
    with pytest.raises(ValueError, match="arg_ref_ttl must be a positive, finite number of seconds"):
        argument_ttl(bad)


def test_a_malformed_environment_ttl_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(TTL_ENV, "a day")
    with pytest.raises(ValueError, match=f"{TTL_ENV}='a day' is not a number of seconds"):
        argument_ttl()
    monkeypatch.setenv(TTL_ENV, "-1")
    with pytest.raises(ValueError, match=f"{TTL_ENV} must be a positive"):
        argument_ttl()


def test_refs_users_make_are_not_marked_and_keep_their_lifetime(store, r):
    mine = store.ref(bytes(BIG))
    timed = store.ref(bytes(10), ttl=60)
    assert ref_info(mine).task_argument is False and ref_info(timed).task_argument is False
    assert all(r.ttl(k) == -1 for k in _keys_of(r, ref_info(mine)))  # no TTL asked: none given
    refs = ArgumentRefs(store, "alice", evict_user_refs=True)
    payload, tracked = refs.pack((mine,), {"t": timed})
    args, kwargs = unpack_args(payload)
    assert ref_info(args[0]) == ref_info(mine) and ref_info(kwargs["t"]) == ref_info(timed)  # passed as they are
    assert tracked == [ref_info(mine), ref_info(timed)]  # the Executor evicts them (evict_refs=True) ...
    context.set_task("alice")
    assert task_argument_refs(args, kwargs) == []  # ... but no worker does
    assert all(r.ttl(k) == -1 for k in _keys_of(r, ref_info(mine)))


def test_refs_pickled_by_older_sdks_load_unmarked(store):
    info = ref_info(store.ref(bytes(10), ttl=60))
    old = object.__new__(RefInfo)  # a RefInfo as an SDK without the field pickles it: no such entry in its state
    old.__dict__.update({k: v for k, v in vars(info).items() if k != "task_argument"})
    data = pickle.dumps(Ref(old))
    assert b"task_argument" not in data
    loaded = pickle.loads(data)
    assert ref_info(loaded).task_argument is False and "task_argument" not in vars(ref_info(loaded))
    assert ref_info(loaded).key == info.key and bytes(loaded) == bytes(10)
    context.set_task("alice")
    assert task_argument_refs((loaded,), {}) == []


def test_the_worker_evicts_a_tasks_own_genuine_argument_refs_once(store, r):
    payload, made = ArgumentRefs(store, "alice").pack((bytes(BIG), bytes(BIG)), {"z": bytes(BIG)})
    args, kwargs = unpack_args(payload)  # as the worker unpacks them
    keys = [k for info in made for k in _keys_of(r, info)]
    assert len(made) == 3 and len(keys) == 15  # a header and 4 chunks of 1 MiB each (3 MiB + framing)

    context.set_task("bob")  # another user's task holding them evicts nothing
    assert task_argument_refs(args, kwargs) == []
    context.set_task("alice")
    forged = RefInfo(store.name, store.connector.config(), made[0].key,
                     capability.sign(b"x" * 32, store.name, made[0].key, "alice"), task_argument=True)
    assert task_argument_refs((Ref(forged),), {}) == []  # not signed by the store: left alone

    found = task_argument_refs((*args, args[0]), kwargs)  # a ref passed twice is evicted once
    assert found == made
    assert evict_task_arguments(found) == 3
    assert sum(r.exists(k) for k in keys) == 0
    assert evict_task_arguments(found) == 3  # already gone (the Executor evicts after): not an error
    assert sum(r.exists(k) for k in keys) == 0
