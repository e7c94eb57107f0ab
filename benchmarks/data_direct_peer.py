"""Producer and consumer processes of `benchmarks/data_direct.py --netns`, one per namespace.

    python -m benchmarks.data_direct_peer producer|consumer RENDEZVOUS NAME DIRECTORY REDIS_HOST REDIS_PORT

Environment: SKYFN_ENDPOINT_ID, SKYFN_RENDEZVOUS_SECRET, SKYFN_DATA_REDIS_PASSWORD and
SKYFN_BENCH_STORE_SECRET (hex; the consumer uses it for the Redis store only: direct refs
it resolves through the object server's check). One JSON object per line both ways:

    producer  <- {"kind": "redis"|"direct", "nbytes": n}   -> {"ref": base64 pickle, "t0": monotonic}
    consumer  <- {"ref": ...}                                -> {"t1": monotonic, "size": n}
    consumer  <- {"channels": true}                          -> {"channels": channel_stats()}

The payload (a numpy uint8 array of n random bytes) is made before t0, so a sample is
put -> resolved on one CLOCK_MONOTONIC (shared by every namespace of the machine).
"""
from __future__ import annotations

import base64
import json
import os
import pickle
import sys
import time


def main(argv: list[str]) -> int:
    import numpy as np

    from skyfn.data import Store, context
    from skyfn.data.connectors.direct import DirectConnector, channel_stats
    from skyfn.data.connectors.redis import RedisConnector

    role, rdv, name, directory, redis_host, redis_port = argv[:6]
    secret = os.environ["SKYFN_BENCH_STORE_SECRET"]
    context.set_user("bench")
    redis_store = Store("bench-redis", RedisConnector(host=redis_host, port=int(redis_port)), secret=secret)
    stores = {"redis": redis_store}
    if role == "producer":
        stores["direct"] = Store("bench-direct", DirectConnector(rdv, name, directory, endpoint_id="bench-producer"),
                                 secret=secret)
    payloads: dict[int, np.ndarray] = {}
    for line in sys.stdin:
        msg = json.loads(line)
        if role == "producer":
            n = msg["nbytes"]
            if n not in payloads:
                payloads[n] = np.frombuffer(os.urandom(n), dtype=np.uint8)
            t0 = time.monotonic()
            ref = stores[msg["kind"]].ref(payloads[n], evict=True, owner="bench")
            out = {"ref": base64.b64encode(pickle.dumps(ref)).decode(), "t0": t0}
        elif "channels" in msg:
            out = {"channels": channel_stats()}
        else:
            ref = pickle.loads(base64.b64decode(msg["ref"]))
            size = memoryview(ref.__wrapped__).nbytes
            out = {"t1": time.monotonic(), "size": size}
            del ref
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
