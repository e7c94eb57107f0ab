"""Redis Streams adapter of the task-queue port: the task queues of the embedded runtime
(and of any deployment that prefers Redis to SQS).

Layout in Redis, for a queue called ``name``:

- ``name``         the stream; one entry per message, body in field ``b``. Entries are
                   XDEL'd when deleted or dead-lettered, so XLEN is the depth.
- consumer group   ``group`` (default ``agents``) created at id 0, so messages sent before
                   the first consumer appeared are still delivered.
- ``name:leases``  sorted set, entry id -> lease deadline (ms, Redis server clock). Every
                   pending entry of the group has exactly one lease; both change only inside
                   a Redis function or a MULTI, so a crashed client never leaves an unleased entry.
                   A sorted set rather than a hash so expired leases are a range query.
- ``name:dlq``     dead-letter stream; fields ``id`` (original entry id), ``b``, ``n``
                   (deliveries made).

Lease deadlines, not XPENDING idle times, decide expiry, because each receive and extend
may use its own visibility timeout. Deadlines use the Redis server's clock, so agents on
hosts with skewed clocks agree. A receive of N messages is one function call (reclaim expired
leases with XCLAIM, dead-letter the over-delivered, XREADGROUP the rest, lease them all); a
delete of N messages is one MULTI (XACK, XDEL, ZREM). Long polling blocks on XREAD from the
stream's last generated id (a plain read that takes nothing), then leases atomically
through the function; the wait is also cut short when the earliest lease expires, so an
expired message is redelivered to a waiting consumer as SQS would. The XREAD and the
receive call after it go in one pipeline: Redis runs the call the moment the wait ends,
with no round trip to the consumer in between. A receive that took the stream's last
messages (fewer new ones came than were asked for) remembers the last one: the consumer's
next long poll starts with that wait from there, not with a call that could only find
nothing new (none is made while the consumer's process is busy with what it just
received); an expired lease of another message is then taken when that first wait ends,
within `wait_seconds`. The functions are a
library loaded into Redis (redis_lib.py), called with FCALL: a consumer needs no right to
run scripts of its own.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import redis

from skyfn.protocol.queues import redis_lib
from skyfn.protocol.queues.base import Message, TaskQueue

log = logging.getLogger(__name__)

def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bytes(value: Any) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _fields(flat: list) -> dict[str, Any]:
    return {_text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


# redis-py 8 gives a connection a 5 s socket timeout unless told otherwise; long polls block
# on the connection for up to 20 s (SQS's maximum wait), so every client that blocks must
# wait longer than its longest block, or a quiet queue reads as a timeout error.
SOCKET_TIMEOUT_S = 30.0
# an entry id this far ahead of the server's clock was chosen, not made by `XADD *`
FUTURE_ID_SLACK_S = 60.0


class RedisStreamQueue(TaskQueue):
    """A task queue on a Redis stream and consumer group. See the module docstring.

    ``client`` lets several queues share one connection pool; it must return bytes
    (decode_responses=False) and must not have a socket timeout shorter than the long
    polls, which block on that connection."""

    def __init__(self, name: str, url: str | None = None, client: "redis.Redis | None" = None,
                 consumer: str = "default", group: str = "agents", visibility_timeout: float = 30.0,
                 max_deliveries: int = 5):
        if not name:
            raise ValueError("RedisStreamQueue needs a non-empty stream name")
        if client is None and not url:
            raise ValueError(f"RedisStreamQueue({name!r}) needs a redis:// url or a redis client")
        if max_deliveries < 1:
            raise ValueError(f"max_deliveries must be at least 1, not {max_deliveries}")
        _check_timeout(visibility_timeout)
        super().__init__(name, visibility_timeout, max_deliveries)
        self._owns_client = client is None
        self._client = client if client is not None else redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT_S)
        self.url = url
        self.consumer = consumer
        self.group = group
        self.leases_key = f"{name}:leases"
        self.dlq_key = f"{name}:dlq"
        self._ready = False
        self._drained_at: str | None = None  # the last message a receive took when it emptied the stream
        self._redeliver_due: float | None = None  # (monotonic) when a lease seen by an empty wait expires

    def ensure(self) -> None:
        """The stream and its consumer group (and, with a login that may, the queue
        functions in Redis: redis_lib). Only a consumer needs this: a send does not."""
        redis_lib.ensure_loaded(self._client)
        try:
            self._client.xgroup_create(self.name, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._ready = True

    def _ensure_once(self) -> None:
        if not self._ready:
            self.ensure()

    def send(self, bodies: list[bytes]) -> list[str]:
        if not bodies:
            return []
        pipe = self._client.pipeline(transaction=False)
        self.send_on(pipe, bodies)
        return [_text(i) for i in pipe.execute()]

    def send_on(self, pipe: Any, bodies: list[bytes]) -> None:
        """Queue the sends on a caller's pipeline of the same Redis (one round trip with the
        caller's own writes); they happen when the caller executes it. A send creates
        nothing but the stream: its consumer group, made at id 0 by the first receive,
        still gets every message sent before (and a producer's login, such as an agent's
        on the results stream, may only add entries)."""
        for body in bodies:
            pipe.xadd(self.name, {"b": body})

    def receive(self, max_messages: int = 10, wait_seconds: float = 0.0,
                visibility_timeout: float | None = None) -> list[Message]:
        if max_messages < 1:
            raise ValueError(f"max_messages must be at least 1, not {max_messages}")
        vt = self.visibility_timeout if visibility_timeout is None else visibility_timeout
        _check_timeout(vt)
        self._ensure_once()
        start = time.monotonic()
        give_up = start + max(0.0, wait_seconds)
        drained_at, self._drained_at = self._drained_at, None
        due, self._redeliver_due = self._redeliver_due, None
        first_wait = wait_seconds if due is None else min(wait_seconds, due - start)
        if drained_at is not None and first_wait > 0:  # nothing new was left after it: wait first
            got = self._wait_then_receive(drained_at, first_wait, max_messages, vt)
        else:
            got = self._receive_once(max_messages, vt)
        while True:
            messages, last_id, next_expiry_ms, now_ms = got
            if messages or wait_seconds <= 0:
                self._drained_at = _drained_at(messages, max_messages)
                return messages
            now = time.monotonic()
            until_expiry = (next_expiry_ms - now_ms) / 1000.0 if next_expiry_ms >= 0 else None
            remaining = give_up - now
            if remaining <= 0:
                # an empty wait: the next one starts by waiting after the stream's last entry
                # (one XREAD and one receive, not a receive first), until a lease is due
                self._drained_at = last_id
                self._redeliver_due = None if until_expiry is None else now + until_expiry
                return []
            if until_expiry is not None:
                remaining = min(remaining, until_expiry)
            got = self._wait_then_receive(last_id, remaining, max_messages, vt)

    def _args(self, max_messages: int, vt: float) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of the receive function."""
        return ([self.name, self.leases_key, self.dlq_key],
                [self.group, self.consumer, max_messages, int(vt * 1000), self.max_deliveries])

    def _wait_then_receive(self, after_id: str, seconds: float, max_messages: int,
                           vt: float) -> tuple[list[Message], str, int, int]:
        """Block until the stream has an entry after `after_id` or `seconds` pass (XREAD
        takes nothing), then receive: both in one pipeline, so Redis runs the receive the
        moment the wait ends, without a round trip to this client in between."""
        keys, args = self._args(max_messages, vt)
        pipe = self._client.pipeline(transaction=False)
        # XREAD BLOCK 0 would block forever: never ask for less than 1 ms
        pipe.xread({self.name: after_id}, count=1, block=max(1, int(seconds * 1000) + 1))
        pipe.execute_command("FCALL", redis_lib.RECEIVE, len(keys), *keys, *args)
        try:
            reply = pipe.execute()[1]
        except redis.ResponseError:  # no group (recreated) or no library (loaded): the plain call mends it
            return self._receive_once(max_messages, vt)
        return _received(reply)

    def _receive_once(self, max_messages: int, vt: float) -> tuple[list[Message], str, int, int]:
        keys, args = self._args(max_messages, vt)
        try:
            reply = redis_lib.call(self._client, redis_lib.RECEIVE, keys, args)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc) and "no such key" not in str(exc):
                raise
            # the stream or group was removed behind our back (FLUSHDB, DEL): recreate it
            self.ensure()
            reply = redis_lib.call(self._client, redis_lib.RECEIVE, keys, args)
        return _received(reply)

    def extend(self, receipts: list[str], visibility_timeout: float | None = None) -> None:
        """Push the leases to now + timeout. Receipts whose lease this consumer no longer
        holds (deleted, or reclaimed by another consumer) are skipped."""
        if not receipts:
            return
        vt = self.visibility_timeout if visibility_timeout is None else visibility_timeout
        _check_timeout(vt)
        self._ensure_once()
        extended = 0
        for i in range(0, len(receipts), redis_lib.MAX_EXTEND):
            extended += int(redis_lib.call(self._client, redis_lib.EXTEND, [self.name, self.leases_key],
                                           [self.group, self.consumer, int(vt * 1000),
                                            *receipts[i:i + redis_lib.MAX_EXTEND]]))
        if extended < len(receipts):
            log.debug("queue %s: %d of %d leases were no longer held and not extended",
                      self.name, len(receipts) - int(extended), len(receipts))

    def delete(self, receipts: list[str]) -> None:
        if not receipts:
            return
        self._ensure_once()
        pipe = self._client.pipeline(transaction=True)
        pipe.xack(self.name, self.group, *receipts)
        pipe.xdel(self.name, *receipts)
        pipe.zrem(self.leases_key, *receipts)
        pipe.execute()

    def dead_letters(self, max_messages: int = 10) -> list[Message]:
        if max_messages < 1:
            raise ValueError(f"max_messages must be at least 1, not {max_messages}")
        entries = redis_lib.call(self._client, redis_lib.TAKE_DEAD, [self.dlq_key],
                                 [min(max_messages, redis_lib.MAX_TAKE_DEAD)])
        messages = []
        for entry_id, flat in entries:
            fields = _fields(flat)
            messages.append(Message(message_id=_text(fields.get("id", entry_id)), body=_bytes(fields.get("b", b"")),
                                    receipt=_text(entry_id), delivery_count=int(fields.get("n", 0))))
        return messages

    def repair_future_ids(self, slack_s: float = FUTURE_ID_SLACK_S) -> bool:
        """Undo entries added with an explicit id far in the future (more than `slack_s`
        ahead of the server's clock): after one, every `XADD *` fails, and Redis's ACL
        cannot keep a producer that may XADD from choosing the id. For the stream's owner
        (the service's login, which may delete and set ids): the future entries are
        deleted, the stream's last id goes back to now, and so does the consumer group's
        position where it had passed it (every entry below was delivered before the
        future one; a future entry already read and deleted leaves only the clock to put
        back). True when there was anything to undo."""
        secs, micros = self._client.time()
        now_ms = int(secs) * 1000 + int(micros) // 1000
        try:
            last = _text(self._client.xinfo_stream(self.name)["last-generated-id"])
        except redis.ResponseError:  # no stream yet
            return False
        limit_ms = now_ms + int(slack_s * 1000)
        if int(last.split("-")[0]) <= limit_ms:
            return False
        future = [_text(e[0]) for e in self._client.xrange(self.name, min=f"{limit_ms + 1}-0")]
        if future:
            self._client.xdel(self.name, *future)
        top = self._client.xrevrange(self.name, count=1)
        now_id = f"{now_ms}-0"
        new_last = max([now_id] + [_text(e[0]) for e in top], key=_id_key)
        self._client.execute_command("XSETID", self.name, new_last)
        for g in self._client.xinfo_groups(self.name):
            if _id_key(_text(g["last-delivered-id"])) > _id_key(new_last):
                self._client.xgroup_setid(self.name, _text(g["name"]), new_last)
        self._drained_at = self._redeliver_due = None
        log.warning("stream %s: %d entr%s with an id in the future (last id %s) deleted; last id set back to %s",
                    self.name, len(future), "y" if len(future) == 1 else "ies", last, new_last)
        return True

    def depth(self) -> int:
        return int(self._client.xlen(self.name))

    def set_password(self, password: str) -> None:
        """Log in with `password` from now on (new connections of the pool; open ones stay
        logged in): an endpoint agent whose credential was rotated takes the new one up."""
        self._client.connection_pool.connection_kwargs["password"] = password

    def close(self) -> None:
        if self._owns_client:
            self._client.close()


def _received(reply: list) -> tuple[list[Message], str, int, int]:
    """(messages, last id, next lease expiry ms, now ms) from the receive function's reply."""
    out, last_id, next_expiry, now = reply
    messages = [Message(message_id=_text(i), body=_bytes(b), receipt=_text(i), delivery_count=int(n))
                for i, b, n in out]
    return messages, _text(last_id), int(next_expiry), int(now)


def _drained_at(messages: list[Message], asked: int) -> str | None:
    """The id of the last new message of a receive that emptied the stream: fewer came
    than were asked for, so the function's XREADGROUP read up to the stream's last entry
    (a first delivery is new; redelivered ones are older entries). None when more may be
    waiting, or when no new one came to tell where the stream ended."""
    if len(messages) >= asked:
        return None
    for m in reversed(messages):
        if m.delivery_count == 1:
            return m.message_id
    return None


def _check_timeout(seconds: float) -> None:
    if seconds < 0:
        raise ValueError(f"visibility_timeout must be >= 0 seconds, not {seconds}")
