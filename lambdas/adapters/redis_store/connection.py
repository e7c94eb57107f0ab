"""The service's connection to its hot store: one redis-py client per process, created on
first use and reused across invocations (as a Lambda container reuses it between events)."""
from __future__ import annotations

import functools

import redis

from lambdas.config import settings
from skyfn.protocol.queues.redis_streams import SOCKET_TIMEOUT_S


# what the handlers catch of the store's errors, without importing redis themselves
STORE_UNREACHABLE: type[Exception] = redis.exceptions.ConnectionError
STORE_FULL: type[Exception] = redis.exceptions.OutOfMemoryError  # maxmemory reached (noeviction)
STORE_ERRORS: tuple[type[Exception], ...] = (redis.exceptions.RedisError,)


@functools.lru_cache(maxsize=1)
def redis_client() -> redis.Redis:
    # the status long-poll and the queues block on these connections: SOCKET_TIMEOUT_S says why
    return redis.Redis.from_url(settings().redis_url, socket_keepalive=True, health_check_interval=30,
                                socket_timeout=SOCKET_TIMEOUT_S, retry_on_timeout=True, max_connections=256)


def reset() -> None:
    redis_client.cache_clear()
