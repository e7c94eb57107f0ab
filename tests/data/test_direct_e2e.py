"""The direct path end to end: the embedded runtime (`skyfn local up --detach` in a private
SKYFN_HOME) with two endpoints on this machine -- "local", whose config has
`data: {default: direct, direct: {rendezvous: ...}}` (its agent starts the object server),
and "other", with no stores (`data: {}`) -- and a real rendezvous server. Task A on "local"
returns a 100 MB array as a ref to its direct store; task B on "other" resolves it through
the object server over a punched channel (its worker knows neither the store nor its
secret) and gets equal values; once the producer evicts it, B's task fails naming the
ref, the store and the reason. The SDK on the agent's machine puts a large argument into the
direct store itself (the Executor's automatic refs), the task on "local" reads it from the
directory, and it is evicted when the task is done. (Through real NATs: test_direct_nat.py.)"""
from __future__ import annotations

import hashlib
import os
import time

import numpy as np
import pytest
import yaml

import rendezvous
from skyfn import Client, Executor
from skyfn.data import RefResolutionError, is_ref, ref_info

RDV_SECRET = "direct-e2e-rendezvous-secret"
N = 100 * 1024 * 1024 // 8


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from infra.local import agent, runtime

    base = tmp_path_factory.mktemp("direct-e2e")
    rdv = rendezvous.serve_in_thread("127.0.0.1", 0, RDV_SECRET)
    home = base / "home"
    for name, data in (("local", {"default": "direct", "direct": {"rendezvous": rdv.address,
                                                                   "directory": str(base / "objects")}}),
                       ("other", {})):              # no stores; its agent still tells workers their endpoint id
        cfg = home / "endpoints" / name
        cfg.mkdir(parents=True)
        (cfg / "config.yaml").write_text(yaml.safe_dump({"workers": 2, "heartbeat_period": 1, "grace_period": 1,
                                                         "data": data}))
    old = {k: os.environ.get(k) for k in ("SKYFN_HOME", "SKYFN_RENDEZVOUS_SECRET")}
    os.environ["SKYFN_HOME"] = str(home)
    os.environ["SKYFN_RENDEZVOUS_SECRET"] = RDV_SECRET       # both agents (and so their workers) inherit it
    runtime.up(home, detach=True, echo=lambda *_: None)
    try:
        agent.start("other", home)
        with Client() as client:
            yield {"client": client, "rdv": rdv, "home": home}
    finally:
        agent.stop("other", home)
        runtime.down(home, echo=lambda *_: None)
        rdv.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def produce(n, seed):
    import numpy as np

    from skyfn.data import default_store

    return default_store().ref(np.random.default_rng(seed).random(n), ttl=600)


def consume(arr):
    import hashlib

    import numpy as np

    from skyfn.data import ref_info
    from skyfn.data.connectors.direct import DirectConnector, channel_stats
    from skyfn.data.store import get_store

    info = ref_info(arr)
    a = np.asarray(arr)
    return {"sha256": hashlib.sha256(a.tobytes()).hexdigest(), "n": int(a.shape[0]),
            "store_known_here": get_store(info.store) is not None,
            "local": DirectConnector.from_config(info.connector).local,
            "modes": sorted({c["mode"] for chans in channel_stats().values() for c in chans})}


def evict_it(ref):
    from skyfn.data import default_store, ref_info

    default_store().evict(ref_info(ref).key)
    return True


def test_a_100mb_array_goes_from_one_endpoint_to_another_by_direct_ref(site):
    client = site["client"]
    expected = hashlib.sha256(np.random.default_rng(5).random(N).tobytes()).hexdigest()
    with Executor(endpoint="local", client=client) as on_a, Executor(endpoint="other", client=client) as on_b:
        ref = on_a.submit(produce, N, 5).result(timeout=180)
        assert is_ref(ref)
        info = ref_info(ref)
        assert info.store == f"direct@{client.endpoint_id('local')}" and info.size > 100 * 2**20
        assert info.connector["kind"] == "direct" and info.connector["name"] == f"objects.{client.endpoint_id('local')}"
        got = on_b.submit(consume, ref).result(timeout=180)
        assert got["sha256"] == expected and got["n"] == N
        assert got["store_known_here"] is False and got["local"] is False     # pulled, without the store's secret
        assert got["modes"] == ["direct"]
        assert site["rdv"].server.stats["calls"] >= 1
        # the SDK on the agent's machine: a large argument becomes a ref in the direct store (written
        # here), read by the task on "local" from the directory, evicted when the task is done
        arg = np.random.default_rng(8).random(N // 20)                      # 5 MiB: above the 1 MiB threshold
        got = on_a.submit(consume, arg).result(timeout=120)
        assert got["sha256"] == hashlib.sha256(arg.tobytes()).hexdigest() and got["local"] is True
        objects = site["home"].parent / "objects"
        deadline = time.time() + 10
        while [p for p in os.listdir(objects) if not p.endswith(".ttl")] and time.time() < deadline:
            time.sleep(0.05)
        assert [p for p in os.listdir(objects) if not p.endswith(".ttl")] == [ref_info(ref).key]   # A's result only
        # evicted by the producer: B's task fails naming the ref, the store and the reason
        gone = on_a.submit(produce, 1000, 6).result(timeout=60)
        assert on_a.submit(evict_it, gone).result(timeout=60) is True
        with pytest.raises(RefResolutionError) as err:
            on_b.submit(consume, gone).result(timeout=120)
    info = ref_info(gone)
    msg = str(err.value)
    assert info.key in msg and info.store in msg
    assert "no such object on the object server" in msg and "evicted by its owner" in msg
