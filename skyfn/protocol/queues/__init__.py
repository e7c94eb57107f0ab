"""Task queues: the port (TaskQueue, Message), its two adapters (RedisStreamQueue on Redis
Streams, SqsQueue on Amazon SQS) and open_queue(), which turns a QueueDescriptor from
POST /endpoints into a TaskQueue.

The adapters are imported on first use (PEP 562 module __getattr__), so importing this
package pulls in neither redis nor boto3: the SDK stays light on a scientist's laptop.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from skyfn.protocol.queues.base import Message, TaskQueue

if TYPE_CHECKING:
    from skyfn.protocol.queues.redis_streams import RedisStreamQueue
    from skyfn.protocol.queues.sqs import SqsQueue

__all__ = ["Message", "TaskQueue", "RedisStreamQueue", "SqsQueue", "open_queue"]


def __getattr__(name: str) -> Any:
    if name == "RedisStreamQueue":
        from skyfn.protocol.queues.redis_streams import RedisStreamQueue

        return RedisStreamQueue
    if name == "SqsQueue":
        from skyfn.protocol.queues.sqs import SqsQueue

        return SqsQueue
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_queue(descriptor: Any, *, consumer: str = "default", visibility_timeout: float = 30.0,
               max_deliveries: int = 5, redis_client: Any = None) -> TaskQueue:
    """A TaskQueue for a descriptor: a dict or a skyfn.protocol.api.QueueDescriptor with
    ``kind`` ("redis" or "sqs"), ``name`` (stream key or queue name) and ``url`` (redis://
    URL or SQS queue URL). ``redis_client`` reuses an existing connection pool for Redis
    queues (the url is then not used to connect)."""
    if isinstance(descriptor, Mapping):
        fields = descriptor
    else:
        fields = {key: getattr(descriptor, key, None) for key in ("kind", "name", "url")}
    kind, name, url = fields.get("kind"), fields.get("name"), fields.get("url")
    if not name:
        raise ValueError(f"queue descriptor has no name: {descriptor!r}")
    if kind == "redis":
        from skyfn.protocol.queues.redis_streams import RedisStreamQueue

        if redis_client is None and not url:
            raise ValueError(f"redis queue descriptor {name!r} has no url and no redis_client was given")
        return RedisStreamQueue(name, url=url, client=redis_client, consumer=consumer,
                                visibility_timeout=visibility_timeout, max_deliveries=max_deliveries)
    if kind == "sqs":
        from skyfn.protocol.queues.sqs import SqsQueue

        return SqsQueue(name, visibility_timeout=visibility_timeout, max_deliveries=max_deliveries, url=url or None)
    raise ValueError(f"unknown queue kind {kind!r} in descriptor {descriptor!r}: expected 'redis' or 'sqs'")
