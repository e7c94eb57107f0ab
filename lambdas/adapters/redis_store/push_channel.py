"""The results push's Redis channels (lambdas/core/tasks/push.py, SKYFN_PUSH=redis): one
PUBLISH on push:<owner> per message, fanned out to the owner's WebSocket connections by the
local gateway's hub (infra/local/standins/push_hub.py), which listens on all of them with one
pattern subscription (PushListener) and hands each message to its owner's connections only:
a message costs the owner's connections, not every connection's."""
from __future__ import annotations

from typing import Any, Iterable

import redis

from skyfn.protocol.push import CHANNEL_PREFIX


class PushChannels:
    def __init__(self, client: Any):
        self.r = client

    def publish(self, messages: Iterable[tuple[str, bytes]]) -> int:
        """Publish each (owner, message) on the owner's channel, all in one round trip;
        returns how many were published."""
        pipe = self.r.pipeline(transaction=False)
        n = 0
        for owner, body in messages:
            pipe.publish(CHANNEL_PREFIX + owner, body)
            n += 1
        pipe.execute()
        return n


class PushListener:
    """The hub's side, on a connection of its own (a subscribed connection sends nothing else)
    and one for the completion streams' cursors."""

    def __init__(self, url: str):
        self.r = redis.Redis.from_url(url, socket_keepalive=True)

    def subscribe(self) -> Any:
        """A pub/sub handle on every push:<owner> channel: its pmessages' channels name owners."""
        pubsub = self.r.pubsub(ignore_subscribe_messages=True)
        pubsub.psubscribe(CHANNEL_PREFIX + "*")
        return pubsub

    def cursor(self, owner: str) -> str:
        """The owner's completion-stream position (done:<owner>), "0-0" for none yet."""
        last = self.r.xrevrange(f"done:{owner}", count=1)
        return last[0][0].decode() if last else "0-0"
