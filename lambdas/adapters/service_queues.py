"""The service's ends of the queues (tasks, lanes, control, results): Redis Streams or SQS
by `settings().queue_kind`, opened once per process and per name."""
from __future__ import annotations

import threading

from lambdas.adapters.redis_store import connection
from lambdas.config import settings
from skyfn.protocol.api import QueueDescriptor
from skyfn.protocol.queues import TaskQueue, open_queue

_queues: dict[str, tuple[TaskQueue, QueueDescriptor]] = {}
_queues_lock = threading.Lock()


def service_queue(name: str) -> tuple[TaskQueue, QueueDescriptor]:
    """The queue `name` (created if absent) and the descriptor agents are given for it."""
    with _queues_lock:
        if name in _queues:
            return _queues[name]
        s = settings()
        if s.queue_kind == "redis":
            desc = QueueDescriptor(kind="redis", name=name, url=s.agent_redis_url)
            queue = open_queue(desc, consumer="service", visibility_timeout=s.lease_seconds,
                               max_deliveries=s.max_deliveries, redis_client=connection.redis_client())
            queue.ensure()
        else:
            from skyfn.protocol.queues import SqsQueue

            queue = SqsQueue(name, visibility_timeout=s.lease_seconds, max_deliveries=s.max_deliveries)
            queue.ensure()  # before its url is known
            desc = QueueDescriptor(kind="sqs", name=name, url=queue.url)
        _queues[name] = (queue, desc)
        return _queues[name]


def reset() -> None:
    with _queues_lock:
        _queues.clear()
