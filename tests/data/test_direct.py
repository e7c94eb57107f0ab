"""The direct connector and its object server on loopback: a real rendezvous server (in a
thread), a real ObjectServer joining real comm channels, producer and consumer connectors
told apart by their endpoint ids (SKYFN_ENDPOINT_ID). Through NATs: test_direct_nat.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import rendezvous
from endpoint_agent.data.object_server import ObjectServer, parse_direct_config
from skyfn.data import RefAccessDenied, RefResolutionError, Store, capability, codec, context
from skyfn.data.connectors import from_config
from skyfn.data.connectors.direct import DirectConnector, channel_stats, close_channels
from skyfn.data.errors import DataConfigError, DataError
from skyfn.data.ref import ref_info
from skyfn.data.store import cache

RDV_SECRET = "direct-test-secret"
STORE_SECRET = bytes(range(32))


@pytest.fixture(scope="module")
def rdv():
    handle = rendezvous.serve_in_thread("127.0.0.1", 0, RDV_SECRET)
    yield handle
    handle.stop()


@pytest.fixture
def site(rdv, tmp_path, unique, monkeypatch):
    """An object server for store `st-<unique>`, the producer's store (local) and a consumer's
    store (another endpoint: it pulls through the server)."""
    monkeypatch.setenv("SKYFN_RENDEZVOUS_SECRET", RDV_SECRET)
    monkeypatch.setenv("SKYFN_ENDPOINT_ID", "ep-consumer")
    name, store = f"objects.{unique}", f"st-{unique}"
    directory = str(tmp_path / "objects")
    server = ObjectServer(rdv.address, name, directory, {store: STORE_SECRET},
                          lambda: rendezvous.make_token(RDV_SECRET, name), endpoint_id="ep-producer",
                          timeout=20).start()
    producer = Store(store, DirectConnector(rdv.address, name, directory, endpoint_id="ep-producer", local=True),
                     secret=STORE_SECRET, register=False)
    consumer = Store(store, DirectConnector(rdv.address, name, directory, endpoint_id="ep-producer"),
                     secret=STORE_SECRET, register=False)
    context.set_user("alice")
    yield server, producer, consumer
    context.set_user(None)
    close_channels()
    server.stop()


def fresh(store: Store, ref):
    """Resolve through the connector, not this process's cache."""
    info = ref_info(ref)
    cache.drop((info.store, info.key))
    return store.resolve(info)


def test_config_round_trips_without_secrets(rdv, tmp_path):
    conn = DirectConnector(rdv.address, "objects.ep-1", str(tmp_path), endpoint_id="ep-1", token_file="~/tok",
                           timeout=30)
    cfg = conn.config()
    assert cfg == {"kind": "direct", "rendezvous": rdv.address, "name": "objects.ep-1", "directory": str(tmp_path),
                   "endpoint_id": "ep-1", "token_file": "~/tok", "timeout": 30.0}
    again = from_config(cfg)
    assert again.config() == cfg and isinstance(again, DirectConnector)
    with pytest.raises(DataConfigError, match="needs 'rendezvous'"):
        from_config({"kind": "direct", "name": "x"})
    with pytest.raises(DataConfigError, match="unexpected keyword argument 'colour'.*allowed keys: rendezvous"):
        from_config({"kind": "direct", "rendezvous": "h:1", "name": "x", "colour": "red"})
    with pytest.raises(DataConfigError, match="is not a listener name"):
        DirectConnector("h:1", "bad/name")
    with pytest.raises(DataConfigError, match="is not 'host:port'"):
        DirectConnector("nohost", "x")


def test_who_is_local(rdv, tmp_path, monkeypatch):
    conn = DirectConnector(rdv.address, "objects.ep-1", str(tmp_path), endpoint_id="ep-1")
    monkeypatch.setenv("SKYFN_ENDPOINT_ID", "ep-1")
    assert conn.local                                   # a worker of the producer's endpoint
    monkeypatch.setenv("SKYFN_ENDPOINT_ID", "ep-2")
    assert not conn.local                               # another endpoint, even on a shared file system
    with pytest.raises(DataError, match="put/evict run on the producer's endpoint \\(ep-1\\)"):
        conn.put("k", [b"x"])
    monkeypatch.delenv("SKYFN_ENDPOINT_ID")
    assert conn.local                                   # the SDK on the agent's machine: the directory is here
    far = DirectConnector(rdv.address, "objects.ep-1", str(tmp_path / "absent"), endpoint_id="ep-1")
    assert not far.local                                # the SDK on a laptop pulls


def test_local_put_get_exists_evict_and_ttl(rdv, tmp_path):
    conn = DirectConnector(rdv.address, "objects.l", str(tmp_path / "o"), local=True)
    conn.put("a", [b"he", b"llo"])
    conn.put("b", [b"gone soon"], ttl=0.05)
    assert bytes(conn.get("a")) == b"hello" and conn.exists("a") and conn.exists("b")
    time.sleep(0.1)
    assert conn.get("b") is None and not conn.exists("b")
    conn.evict("a")
    conn.evict("a")                                     # evicting a missing key is not an error
    assert conn.get("a") is None and not conn.exists("a")
    assert sorted(os.listdir(tmp_path / "o")) == []


def test_array_pulled_through_the_object_server_equal(site):
    server, producer, consumer = site
    array = np.random.default_rng(3).random(1 << 20)              # 8 MiB
    ref = producer.ref(array, owner="alice", ttl=60)
    assert not consumer.connector.local
    got = fresh(consumer, ref)
    assert np.array_equal(got, array) and got.flags.writeable
    (channel,) = channel_stats()[server.name]
    assert channel["mode"] == "direct" and channel["bytes_received"] >= array.nbytes
    # the channel is reused: a second pull does not call again
    assert np.array_equal(fresh(consumer, ref), array)
    assert server.stats["calls"] == 1 and server.stats["served"] == 2
    assert consumer.exists(ref_info(ref).key) and not consumer.exists("0" * 32)


def test_another_users_task_is_refused_by_the_object_server(site):
    server, producer, consumer = site
    ref = producer.ref(np.arange(10), owner="alice", share_with=["bob"], ttl=60)
    info = ref_info(ref)
    assert list(codec.decode(consumer.connector.get_for(info, "bob"))) == list(range(10))   # a reader
    with pytest.raises(RefAccessDenied) as err:
        consumer.connector.get_for(info, "mallory")
    assert str(err.value) == (f"cannot resolve ref {info.key!r} of store {info.store!r}: it belongs to alice and is "
                              "not shared with mallory: ask its owner to share it (store.ref(obj, share_with=[...])); "
                              f"refused by the object server {server.name} of endpoint ep-producer")
    with pytest.raises(RefAccessDenied, match="not shared with an unknown user"):
        consumer.connector.get_for(info, None)
    forged = capability.sign(b"not the store's secret" * 2, info.store, info.key, "mallory")
    with pytest.raises(RefAccessDenied, match=r"not signed by this store .*\(checked by the object server"):
        consumer.connector.get_for(type(info)(**{**info.__dict__, "capability": forged}), "mallory")
    with pytest.raises(RefResolutionError, match="serves store st-.*, not 'other': the ref names another store"):
        consumer.connector.get_for(type(info)(**{**info.__dict__, "store": "other"}), "alice")
    assert server.stats["refused"] == 3


def test_evicted_expired_and_use_once_refs_fail_with_the_reason(site):
    server, producer, consumer = site
    ref = producer.ref(b"x" * 1000, owner="alice", ttl=60)
    producer.evict(ref_info(ref).key)
    with pytest.raises(RefResolutionError) as err:
        fresh(consumer, ref)
    assert str(err.value) == (f"cannot resolve ref {ref_info(ref).key!r} of store {producer.name!r}: no such object on "
                              f"the object server {server.name} of endpoint ep-producer: evicted by its owner, past "
                              "its TTL, or already used (a ref made with evict=True resolves once)")
    # a TTL that passed on the producer's side (a capability without expiry, to reach the server)
    producer.connector.put("short", [b"soon gone"], ttl=0.05)
    cap = capability.sign(STORE_SECRET, producer.name, "short", "alice")
    time.sleep(0.1)
    info = type(ref_info(ref))(producer.name, consumer.connector.config(), "short", cap)
    with pytest.raises(RefResolutionError, match=r"its TTL passed at 20\d\d-.* UTC: the object server .* no longer"):
        consumer.connector.get_for(info, "alice")
    once = producer.ref(np.arange(5), owner="alice", evict=True)
    assert list(fresh(consumer, once)) == [0, 1, 2, 3, 4]
    assert not producer.exists(ref_info(once).key)                    # evicted by the object server as it served
    with pytest.raises(RefResolutionError, match="already used"):
        fresh(consumer, once)


def test_several_consumers_are_served_at_once(site):
    server, producer, consumer = site
    arrays = [np.full(1 << 18, i, dtype=np.int64) for i in range(6)]
    refs = [producer.ref(a, owner="alice", ttl=60) for a in arrays]
    results, errors = {}, []
    barrier = threading.Barrier(len(refs))

    def pull(i):
        context.set_user("alice")
        try:
            barrier.wait()
            results[i] = np.array_equal(fresh(consumer, refs[i]), arrays[i])
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=pull, args=(i,)) for i in range(len(refs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and results == {i: True for i in range(len(refs))}
    assert server.stats["calls"] >= 2 and server.stats["served"] == len(refs)   # concurrent pulls, own channels


def test_a_channel_the_server_closed_is_replaced(rdv, tmp_path, unique, monkeypatch):
    monkeypatch.setenv("SKYFN_RENDEZVOUS_SECRET", RDV_SECRET)
    monkeypatch.setenv("SKYFN_ENDPOINT_ID", "ep-consumer")
    name, directory = f"objects.idle-{unique}", str(tmp_path / "o")
    with ObjectServer(rdv.address, name, directory, {"s": STORE_SECRET}, lambda: rendezvous.make_token(RDV_SECRET, name),
                      timeout=0.5) as server:
        producer = Store("s", DirectConnector(rdv.address, name, directory, local=True), secret=STORE_SECRET,
                         register=False)
        consumer = Store("s", DirectConnector(rdv.address, name, directory, endpoint_id="ep-producer"),
                         secret=STORE_SECRET, register=False)
        ref = producer.ref([1, 2, 3], owner="alice")
        context.set_user("alice")
        assert fresh(consumer, ref) == [1, 2, 3]
        time.sleep(1.5)                                  # the server closes the idle channel after 0.5 s
        assert fresh(consumer, ref) == [1, 2, 3]         # the pooled one fails, a fresh call succeeds
        assert server.stats["calls"] == 2
    close_channels()


def test_no_listener_and_no_token_are_clear(rdv, tmp_path, monkeypatch):
    monkeypatch.setenv("SKYFN_ENDPOINT_ID", "ep-consumer")
    monkeypatch.setenv("SKYFN_RENDEZVOUS_SECRET", RDV_SECRET)
    conn = DirectConnector(rdv.address, "objects.nobody", str(tmp_path), endpoint_id="ep-producer")
    store = Store("s", conn, secret=STORE_SECRET, register=False)
    ref = Store("s", DirectConnector(rdv.address, "objects.nobody", str(tmp_path), local=True), secret=STORE_SECRET,
                register=False).ref(1, owner="alice")
    context.set_user("alice")
    with pytest.raises(RefResolutionError, match="cannot reach the object server 'objects.nobody' .*no_listener: no "
                                                 "object server listens as objects.nobody"):
        fresh(store, ref)
    monkeypatch.delenv("SKYFN_RENDEZVOUS_SECRET")
    with pytest.raises(RefResolutionError, match="has no rendezvous token: set SKYFN_RENDEZVOUS_SECRET .* or set "
                                                 "SKYFN_DIRECT_TOKEN"):
        fresh(store, ref)
    monkeypatch.setenv("SKYFN_DIRECT_TOKEN", rendezvous.make_token("wrong", "objects.nobody"))
    with pytest.raises(RefResolutionError, match="bad_token.*made with another secret or for another name"):
        fresh(store, ref)
    context.set_user(None)


def _cli(args, env, timeout=30):
    return subprocess.run([sys.executable, "-m", "endpoint_agent.data.object_server", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **env})


def test_standalone_server_errors_name_the_fix(rdv, tmp_path, unique):
    base = ["--rendezvous", rdv.address, "--name", f"objects.cli-{unique}", "--store", "s",
            "--directory", str(tmp_path / "o")]
    env = {"SKYFN_RENDEZVOUS_SECRET": RDV_SECRET}
    done = _cli(base, env)
    assert done.returncode == 1 and "no secret for store 's': set SKYFN_DIRECT_STORE_SECRET" in done.stderr
    done = _cli(base, {"SKYFN_RENDEZVOUS_SECRET": "", "SKYFN_DIRECT_STORE_SECRET": "00" * 32})
    assert done.returncode == 1 and "has no rendezvous token" in done.stderr
    done = _cli(base, {"SKYFN_RENDEZVOUS_SECRET": "wrong", "SKYFN_DIRECT_STORE_SECRET": "00" * 32})
    assert done.returncode == 1 and "refused LISTEN: bad_token" in done.stderr
    assert "wrong" not in done.stderr.replace("wrong secret", "")
    # a running one holds the name; a second is refused with name_taken, then the first stops cleanly
    ready = tmp_path / "ready.json"
    first = subprocess.Popen([sys.executable, "-m", "endpoint_agent.data.object_server", *base, "--ready-file", str(ready)],
                             env={**os.environ, **env, "SKYFN_DIRECT_STORE_SECRET": "00" * 32},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = json.loads(first.stdout.readline())
        assert line["listening"] == f"objects.cli-{unique}" and ready.exists()
        done = _cli(base, {**env, "SKYFN_DIRECT_STORE_SECRET": "00" * 32})
        assert done.returncode == 1 and "refused LISTEN: name_taken" in done.stderr
    finally:
        first.terminate()
        assert first.wait(15) == 0
    assert RDV_SECRET not in first.stderr.read()


def test_endpoint_config_section():
    cfg = parse_direct_config({"rendezvous": "rdv.example.org:7300", "token_file": "~/t"})
    conn = cfg.connector_config("ep-9")
    assert conn["name"] == "objects.ep-9" and conn["endpoint_id"] == "ep-9" and conn["kind"] == "direct"
    assert conn["token_file"] == os.path.expanduser("~/t") and "secret" not in json.dumps(conn).replace("secret_", "")
    assert from_config(conn).config()["rendezvous"] == "rdv.example.org:7300"
    with pytest.raises(ValueError, match=r"data.direct.rendezvous is required \(the rendezvous server as host:port\)"):
        parse_direct_config({})
    with pytest.raises(ValueError, match="unknown key data.direct.port; allowed keys: rendezvous, name, directory"):
        parse_direct_config({"rendezvous": "h:1", "port": 3})
    with pytest.raises(ValueError, match="data.direct.rendezvous: 'h' is not allowed"):
        parse_direct_config({"rendezvous": "h"})
    with pytest.raises(ValueError, match="port 70000 is not a TCP port"):
        parse_direct_config({"rendezvous": "h:70000"})
    with pytest.raises(ValueError, match="must be a mapping"):
        parse_direct_config("h:1")


def test_a_task_on_another_endpoint_resolves_without_the_stores_secret(site):
    """The consumer's process does not know the store (no secret): the Ref resolves through
    the object server's check, is cached under that capability, and the cache refuses others."""
    import pickle

    from skyfn.data.store import get_store

    server, producer, consumer = site
    array = np.arange(1 << 16, dtype=np.float32)
    ref = pickle.loads(pickle.dumps(producer.ref(array, owner="alice", share_with=["bob"], ttl=60)))
    assert get_store(producer.name) is None
    context.set_user("bob")
    assert np.array_equal(np.asarray(ref), array) and server.stats["served"] == 1
    again = pickle.loads(pickle.dumps(ref))
    assert np.array_equal(np.asarray(again), array) and server.stats["served"] == 1     # this process's cache
    context.set_user("mallory")
    with pytest.raises(RefAccessDenied, match="belongs to alice and is not shared with mallory"):
        np.asarray(pickle.loads(pickle.dumps(ref)))
    assert server.stats["served"] == 1
    context.set_user("alice")
    gone = producer.ref(b"bytes", owner="alice")
    producer.evict(ref_info(gone).key)
    with pytest.raises(RefResolutionError, match="no such object on the object server"):
        bytes(pickle.loads(pickle.dumps(gone)))


def test_endpoint_data_section_takes_direct(tmp_path):
    from endpoint_agent.config import ConfigError, parse_config

    cfg = parse_config({"data": {"default": "direct", "direct": {"rendezvous": "rdv.example.org:7300"}}})
    assert cfg.data.direct.rendezvous == "rdv.example.org:7300" and cfg.data.default == "direct"
    with pytest.raises(ConfigError, match="unknown key data.direct.rendevous; allowed keys: rendezvous"):
        parse_config({"data": {"direct": {"rendevous": "h:1"}}})
    with pytest.raises(ConfigError, match="store name 'direct' is the endpoint's direct store"):
        parse_config({"data": {"stores": {"direct": {"connector": "file", "directory": str(tmp_path)}}}})


def test_agent_data_plane_starts_and_stops_the_object_server(rdv, tmp_path, monkeypatch):
    """`data: direct:` in an endpoint's config: EndpointData (what the agent runs) starts the
    object server as a child, publishes the store `direct@<endpoint>` to workers, and stops it."""
    from endpoint_agent.data.config import DataConfig
    from endpoint_agent.data.plane import EndpointData
    from skyfn.data.store import load_stores_file, read_stores_file

    monkeypatch.setenv("SKYFN_RENDEZVOUS_SECRET", RDV_SECRET)
    monkeypatch.setenv("SKYFN_DATA_STORES", "")
    monkeypatch.setenv("SKYFN_ENDPOINT_ID", "")
    config = DataConfig.model_validate({"default": "direct", "direct": {"rendezvous": rdv.address,
                                                                         "directory": str(tmp_path / "objects")}})
    data = EndpointData(config, tmp_path / "ep", "ep-7").start()
    try:
        name = "objects.ep-7"
        assert rdv.server.listeners.get(name) is not None               # listening before the agent goes on
        doc = read_stores_file(str(data.stores_file))
        assert doc["default"] == "direct@ep-7"
        conn = doc["stores"]["direct@ep-7"]["connector"]
        assert conn["kind"] == "direct" and conn["name"] == name and conn["endpoint_id"] == "ep-7"
        (store,) = load_stores_file(str(data.stores_file))              # as a worker of ep-7 loads it
        assert store.connector.local                                    # the agent set SKYFN_ENDPOINT_ID=ep-7
        ref = store.ref({"answer": 42}, owner="alice")
        monkeypatch.setenv("SKYFN_ENDPOINT_ID", "ep-8")                 # now a task on another endpoint
        context.set_user("alice")
        assert fresh(Store(store.name, from_config(conn), secret=store.secret, register=False), ref) == {"answer": 42}
        assert RDV_SECRET not in (tmp_path / "ep" / "data" / "object_server.log").read_text()
    finally:
        context.set_user(None)
        close_channels()
        data.stop()
    assert data.objects is None
    deadline = time.monotonic() + 10
    while rdv.server.listeners.get("objects.ep-7") is not None:
        assert time.monotonic() < deadline, "the object server still listens after stop"
        time.sleep(0.05)


def test_the_object_server_listens_again_after_the_rendezvous_server_restarts(tmp_path, unique, monkeypatch):
    monkeypatch.setenv("SKYFN_RENDEZVOUS_SECRET", RDV_SECRET)
    monkeypatch.setenv("SKYFN_ENDPOINT_ID", "ep-consumer")
    first = rendezvous.serve_in_thread("127.0.0.1", 0, RDV_SECRET)
    port = first.port
    name, directory = f"objects.restart-{unique}", str(tmp_path / "o")
    server = ObjectServer(first.address, name, directory, {"s": STORE_SECRET},
                          lambda: rendezvous.make_token(RDV_SECRET, name), ping_interval=0.2).start()
    second = None
    try:
        producer = Store("s", DirectConnector(first.address, name, directory, local=True), secret=STORE_SECRET,
                         register=False)
        consumer = Store("s", DirectConnector(first.address, name, directory, endpoint_id="ep-producer"),
                         secret=STORE_SECRET, register=False)
        ref = producer.ref("before", owner="alice")
        context.set_user("alice")
        assert fresh(consumer, ref) == "before"
        close_channels()
        first.stop()
        second = rendezvous.serve_in_thread("127.0.0.1", port, RDV_SECRET)     # the same address, a new server
        deadline = time.monotonic() + 15
        while second.server.listeners.get(name) is None:
            assert time.monotonic() < deadline, "the object server did not listen at the new server"
            time.sleep(0.05)
        assert fresh(consumer, producer.ref("after", owner="alice")) == "after"
    finally:
        context.set_user(None)
        close_channels()
        server.stop()
        if second is not None:
            second.stop()


def test_consumers_beyond_max_channels_are_told_busy(rdv, tmp_path, unique, monkeypatch):
    from comm import Communicator
    from rendezvous import client

    monkeypatch.setenv("SKYFN_RENDEZVOUS_SECRET", RDV_SECRET)
    monkeypatch.setenv("SKYFN_ENDPOINT_ID", "ep-consumer")
    name, directory = f"objects.busy-{unique}", str(tmp_path / "o")
    token = rendezvous.make_token(RDV_SECRET, name)
    with ObjectServer(rdv.address, name, directory, {"s": STORE_SECRET}, lambda: token, max_channels=1) as server:
        producer = Store("s", DirectConnector(rdv.address, name, directory, local=True), secret=STORE_SECRET,
                         register=False)
        consumer = Store("s", DirectConnector(rdv.address, name, directory, endpoint_id="ep-producer"),
                         secret=STORE_SECRET, register=False)
        ref = producer.ref("payload", owner="alice")
        context.set_user("alice")
        group, group_token = client.call(rdv.address, name, token)
        hold = Communicator.join(group, rdv.address, group_token, 2, rank=1, timeout=20)   # the only slot
        deadline = time.monotonic() + 10
        while server._active < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(RefResolutionError, match="serves 1 consumers already; retry later"):
            fresh(consumer, ref)
        assert channel_stats().get(name, []) == []       # a busy channel is not kept
        hold.close()
        while server._active > 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert fresh(consumer, ref) == "payload"         # a slot is free again: served
        close_channels()
    context.set_user(None)


def test_agent_start_fails_clearly_when_the_name_is_taken(rdv, tmp_path, monkeypatch):
    from endpoint_agent.data.config import DataConfig
    from endpoint_agent.data.plane import EndpointData

    monkeypatch.setenv("SKYFN_RENDEZVOUS_SECRET", RDV_SECRET)
    monkeypatch.setenv("SKYFN_DATA_STORES", "")
    monkeypatch.setenv("SKYFN_ENDPOINT_ID", "")
    from rendezvous import client

    holder = client.listen(rdv.address, "objects.ep-dup", rendezvous.make_token(RDV_SECRET, "objects.ep-dup"))
    try:
        config = DataConfig.model_validate({"direct": {"rendezvous": rdv.address, "directory": str(tmp_path / "o")}})
        with pytest.raises(RuntimeError, match="the object server exited with code 1 before listening: error: object "
                                               "server objects.ep-dup of endpoint ep-dup: the rendezvous server .* "
                                               "refused LISTEN: name_taken: an object server already listens as "
                                               "objects.ep-dup"):
            EndpointData(config, tmp_path / "ep", "ep-dup").start()
    finally:
        holder.close()


def test_only_the_owner_evicts_through_the_object_server(site):
    """From another endpoint (or a laptop) the owner evicts a ref through the object server,
    as the Executor does after the tasks consuming it (skyfn.data.autoref); others cannot."""
    from skyfn.data.store import evict_ref

    server, producer, consumer = site
    ref = producer.ref(np.arange(3), owner="alice", share_with=["bob"], ttl=60)
    info = ref_info(ref)
    for user in ("bob", "mallory"):
        context.set_user(user)
        with pytest.raises(RefAccessDenied, match=f"only its owner alice may evict it, not {user}"):
            evict_ref(info)
    assert producer.exists(info.key)
    context.set_user("alice")
    assert evict_ref(info) is True and not producer.exists(info.key)
    assert evict_ref(info) is False                    # already gone: not an error


def test_the_executors_refs_of_another_endpoint_are_evicted_there(site):
    from concurrent.futures import Future

    from skyfn.data.autoref import ArgumentRefs

    server, producer, consumer = site
    ref = producer.ref(np.arange(3), owner="alice", ttl=60)
    refs = ArgumentRefs(store=None, owner="alice", evict_user_refs=True)   # Executor(evict_refs=True) on a laptop
    context.set_user("alice")
    payload, tracked = refs.pack((ref,), {})
    assert tracked == [ref_info(ref)]
    task = Future()
    refs.track(task, tracked)
    assert producer.exists(ref_info(ref).key)
    task.set_result(None)                              # the last task consuming it finished
    assert not producer.exists(ref_info(ref).key) and refs.outstanding() == 0
