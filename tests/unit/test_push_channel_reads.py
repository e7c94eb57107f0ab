"""The SDK's push channel (skyfn/push.py) reads into its own buffer (issue 37): a message
larger than one read arrives whole over several reads, and the small ones around it come
as they were sent, in order. Real pieces: the local gateway's WebSocket API
(infra/local/standins/push_hub.py) on a real redis-server, the SDK's PushChannel."""
from __future__ import annotations

import select
import time

import orjson
import redis

from infra.local.standins.gateway import Gateway
from infra.local.standins.push_hub import PushHub
from skyfn.push import RECV_BYTES, PushChannel
from skyfn.protocol.push import CHANNEL_PREFIX


def _read_all(channel: PushChannel, want: int, timeout: float = 20.0) -> list[dict]:
    got: list[dict] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        if select.select([channel.fileno()], [], [], 0.5)[0]:
            msgs = channel.read()
            assert msgs is not None, "the connection closed"
            got.extend(msgs)
    return got


def test_a_push_larger_than_one_read_arrives_whole(redis_url, unique):
    owner = f"user-{unique}"
    hub = PushHub(redis_url, authenticate=lambda token: owner if token == "good" else None)
    gateway = Gateway(lambda event, context: {"statusCode": 404, "body": ""}, websocket=hub).start()
    hub.start()
    channel = PushChannel(f"ws://127.0.0.1:{gateway.port}/ws", "good")
    r = redis.Redis.from_url(redis_url)
    try:
        channel.connect()
        big = {"type": "done", "pad": "x" * (3 * RECV_BYTES + 12345)}
        sent = [{"type": "done", "n": 1}, big, {"type": "done", "n": 2}]
        for msg in sent:
            r.publish(CHANNEL_PREFIX + owner, orjson.dumps(msg))
        assert _read_all(channel, len(sent)) == sent
    finally:
        channel.close()
        r.close()
        gateway.stop()
        hub.stop()
