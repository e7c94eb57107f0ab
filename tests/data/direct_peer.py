"""A producer or consumer process of the direct-path tests, run inside a network namespace.

    python -m tests.data.direct_peer produce RENDEZVOUS NAME DIRECTORY NBYTES
    python -m tests.data.direct_peer consume RENDEZVOUS NAME DIRECTORY

Environment: SKYFN_ENDPOINT_ID (the producer's is the connector's endpoint id, so it is
local there; the consumer's differs, so it pulls through the object server),
SKYFN_RENDEZVOUS_SECRET (for the CALL token), SKYFN_TEST_STORE / SKYFN_TEST_STORE_SECRET
(the store's name and hex secret, given to the producer only: the consumer knows neither,
as a task on another endpoint would not, and resolves through the object server's check).

produce: puts a deterministic float64 array of NBYTES as alice's ref, and a second small
ref that it evicts at once; prints one JSON line {"ref": b64 pickle, "evicted": b64 pickle,
"sha256": ..., "put_s": ...}.
consume: reads that JSON line on stdin and prints one JSON line per check: the array as
alice (sha256, seconds, channel stats), a copy of the ref as mallory (refused by the object
server), the connector asked straight for mallory (refused there too), and the evicted
ref (missing there).
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import pickle
import sys
import time
import traceback


def _connector(rendezvous: str, name: str, directory: str):
    from skyfn.data.connectors.direct import DirectConnector

    return DirectConnector(rendezvous, name, directory, endpoint_id="ep-producer", timeout=60)


def produce(rendezvous: str, name: str, directory: str, nbytes: int) -> dict:
    import numpy as np

    from skyfn.data import Store

    store = Store(os.environ["SKYFN_TEST_STORE"], _connector(rendezvous, name, directory),
                  secret=os.environ["SKYFN_TEST_STORE_SECRET"])
    array = np.random.default_rng(12).random(nbytes // 8)
    t = time.monotonic()
    ref = store.ref(array, owner="alice", ttl=600)
    put_s = time.monotonic() - t
    gone = store.ref(b"short-lived", owner="alice", ttl=600)
    from skyfn.data.ref import ref_info

    store.evict(ref_info(gone).key)
    return {"ref": base64.b64encode(pickle.dumps(ref)).decode(), "evicted": base64.b64encode(pickle.dumps(gone)).decode(),
            "sha256": hashlib.sha256(array.tobytes()).hexdigest(), "put_s": put_s}


def _attempt(fn) -> dict:
    try:
        return {"ok": True, **fn()}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return {"ok": False, "type": type(exc).__name__, "error": str(exc)}


def consume(rendezvous: str, name: str, directory: str) -> None:
    import numpy as np

    from skyfn.data import context
    from skyfn.data.connectors.direct import channel_stats
    from skyfn.data.ref import ref_info
    from skyfn.data.store import get_store

    connector = _connector(rendezvous, name, directory)
    made = json.loads(sys.stdin.readline())
    ref = pickle.loads(base64.b64decode(made["ref"]))
    gone = pickle.loads(base64.b64decode(made["evicted"]))
    info = ref_info(ref)

    def as_alice():
        context.set_user("alice")
        t = time.monotonic()
        array = np.asarray(ref)
        seconds = time.monotonic() - t
        return {"sha256": hashlib.sha256(array.tobytes()).hexdigest(), "seconds": seconds,
                "shape": list(array.shape), "local": connector.local, "store_known": get_store(info.store) is not None,
                "channels": channel_stats()}

    def as_mallory_ref():
        from skyfn.data.store import cache

        context.set_user("mallory")
        cache.drop((info.store, info.key, info.capability))     # ask the object server, not this process's cache
        np.asarray(pickle.loads(base64.b64decode(made["ref"])))
        return {}

    def as_mallory_server():
        data = connector.get_for(info, "mallory")
        return {"size": len(data)}

    def evicted():
        context.set_user("alice")
        bytes(gone)
        return {}

    for check, fn in (("alice", as_alice), ("mallory_ref", as_mallory_ref),
                      ("mallory_server", as_mallory_server), ("evicted", evicted)):
        print(json.dumps({"check": check, **_attempt(fn)}), flush=True)


def main(argv: list[str]) -> int:
    try:
        if argv[0] == "produce":
            print(json.dumps(produce(argv[1], argv[2], argv[3], int(argv[4]))), flush=True)
        else:
            consume(argv[1], argv[2], argv[3])
    except Exception as exc:  # noqa: BLE001
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
