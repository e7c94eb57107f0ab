"""The evict right is in the signed capability (issue 36): a reader that marks its copy of a ref
`evict=True` reads it and removes nothing, in a store it knows and through the owner's peer-ref
broker; a ref its owner made use-once is removed by the reader's resolve; the right cannot be
added to a capability without the store's secret."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

from endpoint_agent.data.ref_broker import RefBroker, _Served
from skyfn.data import FileConnector, Store, capability, context
from skyfn.data.ref import ref_info

SECRET = "ab" * 32


@pytest.fixture
def store(tmp_path):
    context.set_user("alice")
    try:
        yield Store("ev-test", FileConnector(str(tmp_path / "files")), secret=SECRET, register=False)
    finally:
        context.set_user(None)


def _as(user, fn):
    context.set_user(user)
    try:
        return fn()
    finally:
        context.set_user("alice")


def test_a_readers_evict_in_a_known_store_removes_nothing(store):
    shared = store.ref([1, 2, 3], share_with=["bob"])
    marked = dataclasses.replace(ref_info(shared), evict=True)
    assert _as("bob", lambda: store.resolve(marked)) == [1, 2, 3]
    assert store.exists(marked.key)
    assert store.resolve(ref_info(shared)) == [1, 2, 3]          # the owner still reads it
    once = ref_info(store.ref([4], share_with=["bob"], evict=True))
    assert capability.verify(bytes.fromhex(SECRET), store.name, once.key, once.capability).evict
    assert _as("bob", lambda: store.resolve(once)) == [4]
    assert not store.exists(once.key)                              # use-once, as its owner signed it
    own = dataclasses.replace(ref_info(store.ref([5])), evict=True)
    assert store.resolve(own) == [5] and not store.exists(own.key)  # the owner's own evict


def test_the_evict_right_cannot_be_added_without_the_secret(store):
    info = ref_info(store.ref([1], share_with=["bob"]))
    body, mac = info.capability.split(".", 1)
    fields = json.loads(capability._unb64(body))
    forged = capability._b64(json.dumps({**fields, "x": True}, separators=(",", ":")).encode()) + "." + mac
    with pytest.raises(ValueError, match="not signed by this store"):
        capability.verify(bytes.fromhex(SECRET), store.name, info.key, forged)
    assert not capability.peek(info.capability).evict and capability.peek(info.capability).may_evict("alice")
    assert not capability.peek(info.capability).may_evict("bob")


def test_the_peer_ref_broker_honours_evict_only_when_the_capability_grants_it(store, tmp_path):
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps({"4242": ["bob"], str(os.geteuid()): ["alice"]}))
    ids.chmod(0o644)
    broker = RefBroker({}, str(tmp_path / "refs"), str(ids), account="alice")
    broker.served[store.name] = _Served(store.name, store.connector, bytes.fromhex(SECRET), str(tmp_path / "s"))
    kept = ref_info(store.ref(list(range(10)), share_with=["bob"]))
    once = ref_info(store.ref([7], share_with=["bob"], evict=True))

    def get(info, uid=4242):
        raw = json.dumps({"v": 1, "op": "get", "store": info.store, "key": info.key, "cap": info.capability,
                          "evict": True}).encode()
        return broker.handle(raw, uid)

    head, data = get(kept)
    assert head["ok"] and data is not None
    assert store.exists(kept.key)                                  # bob's evict: served, kept
    assert get(kept)[0]["ok"]
    head, _ = get(once)
    assert head["ok"] and not store.exists(once.key)               # the owner made it use-once
    head, _ = get(once)
    assert head == {"ok": False, "code": "missing", "reason": head["reason"]}
