"""The consumer side of benchmarks/data.py and benchmarks/mapreduce.py, in its own process.

`consume(pipe, stores)` registers skyfn stores (name -> (connector config, secret hex)),
then answers each message (kind, pickled ref or proxy) with the monotonic time at which
the object was resolved (CLOCK_MONOTONIC: comparable across processes on one machine)
and its size, so the producer measures put -> resolved in another process.

`AuthRedisConnector` is ProxyStore 1.1.0's RedisConnector with a password (read from
SKYFN_DATA_REDIS_PASSWORD): its RedisConnector has no password option, and the benchmark's
redis-server, like every endpoint's, requires one. Only the client construction differs;
put/get/evict are ProxyStore's own code.
"""
from __future__ import annotations

import os
import pickle
import time
from typing import Callable, Optional

try:
    from proxystore.connectors.redis import RedisConnector as _PSRedis
except ImportError:  # proxystore absent: benchmarks/data.py says so
    _PSRedis = object


class AuthRedisConnector(_PSRedis):  # type: ignore[misc, valid-type]
    def __init__(self, hostname: str, port: int, clear: bool = False) -> None:
        import redis

        super().__init__(hostname, port, clear)
        self._redis_client.close()
        self._redis_client = redis.StrictRedis(host=hostname, port=port,
                                               password=os.environ["SKYFN_DATA_REDIS_PASSWORD"])


def materialize(obj) -> int:
    """Force a skyfn Ref or a ProxyStore Proxy to resolve; returns the object's size in bytes."""
    if type(obj).__module__.startswith("proxystore"):
        from proxystore.proxy import extract

        target = extract(obj)
    else:
        target = obj.__wrapped__
    return memoryview(target).nbytes


def consume(pipe, stores: dict, requests: Optional[dict[bytes, Callable[[], object]]] = None) -> None:
    """`requests`: other messages the producer may send (b"channels"), each answered with what
    its function returns."""
    from skyfn.data import Store, context
    from skyfn.data.connectors import from_config

    context.set_user("bench")
    for name, (config, secret) in stores.items():
        Store(name, from_config(config), secret=secret)
    while True:
        msg = pipe.recv_bytes()
        if not msg:
            break
        if requests and msg in requests:
            pipe.send(requests[msg]())
            continue
        obj = pickle.loads(msg)
        size = materialize(obj)
        pipe.send((time.monotonic(), size))
        del obj
