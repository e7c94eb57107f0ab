"""Process-wide clients of the handlers, created on first use and reused across
invocations (as a Lambda container reuses them between events)."""
from __future__ import annotations

import functools
import threading

import redis

from lambdas.adapters.dynamodb import Dynamo
from lambdas.adapters.redis_store.store import TaskStore
from lambdas.config import settings
from skyfn.protocol.api import QueueDescriptor
from skyfn.protocol.queues import TaskQueue, open_queue
from skyfn.protocol.queues.redis_streams import SOCKET_TIMEOUT_S


@functools.lru_cache(maxsize=1)
def redis_client() -> redis.Redis:
    # the status long-poll and the queues block on these connections: SOCKET_TIMEOUT_S says why
    return redis.Redis.from_url(settings().redis_url, socket_keepalive=True, health_check_interval=30,
                                socket_timeout=SOCKET_TIMEOUT_S, retry_on_timeout=True, max_connections=256)


@functools.lru_cache(maxsize=1)
def store() -> TaskStore:
    s = settings()
    return TaskStore(redis_client(), result_ttl=s.result_ttl, unretrieved_ttl=s.unretrieved_ttl, memo_ttl=s.memo_ttl)


@functools.lru_cache(maxsize=1)
def dynamo() -> Dynamo:
    return Dynamo(settings().table_prefix)


_queues: dict[str, tuple[TaskQueue, QueueDescriptor]] = {}
_queues_lock = threading.Lock()


def _queue(name: str) -> tuple[TaskQueue, QueueDescriptor]:
    with _queues_lock:
        if name in _queues:
            return _queues[name]
        s = settings()
        if s.queue_kind == "redis":
            desc = QueueDescriptor(kind="redis", name=name, url=s.agent_redis_url)
            queue = open_queue(desc, consumer="service", visibility_timeout=s.lease_seconds,
                               max_deliveries=s.max_deliveries, redis_client=redis_client())
        else:
            from skyfn.protocol.queues import SqsQueue

            queue = SqsQueue(name, visibility_timeout=s.lease_seconds, max_deliveries=s.max_deliveries)
            queue.ensure()  # before its url is known
            desc = QueueDescriptor(kind="sqs", name=name, url=queue.url)
        if s.queue_kind == "redis":
            queue.ensure()
        _queues[name] = (queue, desc)
        return _queues[name]


def task_queue(endpoint_id: str) -> tuple[TaskQueue, QueueDescriptor]:
    return _queue(settings().task_queue_name(endpoint_id))


def lane_queue(endpoint_id: str, lane: str) -> tuple[TaskQueue, QueueDescriptor]:
    return _queue(settings().lane_queue_name(endpoint_id, lane))


def control_queue(endpoint_id: str) -> tuple[TaskQueue, QueueDescriptor]:
    return _queue(settings().control_queue_name(endpoint_id))


def results_queue() -> tuple[TaskQueue, QueueDescriptor]:
    return _queue(settings().results_queue_name)


def reset() -> None:
    """Forget every client (tests that change the environment call this)."""
    settings.cache_clear()
    redis_client.cache_clear()
    store.cache_clear()
    dynamo.cache_clear()
    with _queues_lock:
        _queues.clear()
