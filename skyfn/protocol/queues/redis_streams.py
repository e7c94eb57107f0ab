"""Redis Streams adapter of the task-queue port: the task queues of the embedded runtime
(and of any deployment that prefers Redis to SQS).

Layout in Redis, for a queue called ``name``:

- ``name``         the stream; one entry per message, body in field ``b``. Entries are
                   XDEL'd when deleted or dead-lettered, so XLEN is the depth.
- consumer group   ``group`` (default ``agents``) created at id 0, so messages sent before
                   the first consumer appeared are still delivered.
- ``name:leases``  sorted set, entry id -> lease deadline (ms, Redis server clock). Every
                   pending entry of the group has exactly one lease; both change only inside
                   a script or a MULTI, so a crashed client never leaves an unleased entry.
                   A sorted set rather than a hash so expired leases are a range query.
- ``name:dlq``     dead-letter stream; fields ``id`` (original entry id), ``b``, ``n``
                   (deliveries made).

Lease deadlines, not XPENDING idle times, decide expiry, because each receive and extend
may use its own visibility timeout. Deadlines use the Redis server's clock, so agents on
hosts with skewed clocks agree. A receive of N messages is one script call (reclaim expired
leases with XCLAIM, dead-letter the over-delivered, XREADGROUP the rest, lease them all); a
delete of N messages is one MULTI (XACK, XDEL, ZREM). Long polling blocks on XREAD from the
stream's last generated id (a plain read that takes nothing), then leases atomically
through the script; the wait is also cut short when the earliest lease expires, so an
expired message is redelivered to a waiting consumer as SQS would.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import redis

from skyfn.protocol.queues.base import Message, TaskQueue

log = logging.getLogger(__name__)

_RECEIVE = """
local stream, leases, dlq = KEYS[1], KEYS[2], KEYS[3]
local group, consumer = ARGV[1], ARGV[2]
local want = tonumber(ARGV[3])
local vt = tonumber(ARGV[4])
local max_deliveries = tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + vt
local out = {}

local function body_of(fields)
  for i = 1, #fields, 2 do
    if fields[i] == 'b' then return fields[i + 1] end
  end
  return ''
end

-- 1. leases that expired: redeliver, or dead-letter past max_deliveries
while #out < want do
  local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, want - #out)
  if #expired == 0 then break end
  for _, id in ipairs(expired) do
    local p = redis.call('XPENDING', stream, group, id, id, 1)
    if #p == 0 then
      redis.call('ZREM', leases, id)
    else
      local count = tonumber(p[1][4])
      if count >= max_deliveries then
        local entry = redis.call('XRANGE', stream, id, id)
        if #entry > 0 then
          redis.call('XADD', dlq, '*', 'id', id, 'b', body_of(entry[1][2]), 'n', count)
        end
        redis.call('XACK', stream, group, id)
        redis.call('XDEL', stream, id)
        redis.call('ZREM', leases, id)
      else
        -- plain XCLAIM (not JUSTID) increments the delivery counter
        local claimed = redis.call('XCLAIM', stream, group, consumer, 0, id)
        if #claimed == 0 or not claimed[1] or not claimed[1][2] then
          redis.call('XACK', stream, group, id)
          redis.call('ZREM', leases, id)
        else
          redis.call('ZADD', leases, deadline, id)
          out[#out + 1] = {id, body_of(claimed[1][2]), count + 1}
        end
      end
    end
  end
end

-- 2. new messages
if #out < want then
  local r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', want - #out, 'STREAMS', stream, '>')
  if r then
    for _, e in ipairs(r[1][2]) do
      redis.call('ZADD', leases, deadline, e[1])
      out[#out + 1] = {e[1], body_of(e[2]), 1}
    end
  end
end

-- 3. nothing to hand out: tell a long-polling caller where to wait from and until when
local last_id, next_expiry = '0-0', -1
if #out == 0 then
  local info = redis.call('XINFO', 'STREAM', stream)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then last_id = info[i + 1] end
  end
  local first = redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')
  if #first > 0 then next_expiry = tonumber(first[2]) end
end
return {out, last_id, next_expiry, now}
"""

_EXTEND = """
local stream, leases = KEYS[1], KEYS[2]
local group, consumer = ARGV[1], ARGV[2]
local t = redis.call('TIME')
local deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[3])
local extended = 0
for i = 4, #ARGV do
  local id = ARGV[i]
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  -- only a lease this consumer still holds; a reclaimed or deleted message is left alone
  if #p > 0 and p[1][2] == consumer and redis.call('ZSCORE', leases, id) then
    redis.call('ZADD', leases, 'XX', deadline, id)
    redis.call('XCLAIM', stream, group, consumer, 0, id, 'JUSTID')
    extended = extended + 1
  end
end
return extended
"""

_TAKE_DEAD = """
local entries = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', tonumber(ARGV[1]))
for _, e in ipairs(entries) do redis.call('XDEL', KEYS[1], e[1]) end
return entries
"""


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
        self._receive_script = self._client.register_script(_RECEIVE)
        self._extend_script = self._client.register_script(_EXTEND)
        self._take_dead_script = self._client.register_script(_TAKE_DEAD)
        self._ready = False

    def ensure(self) -> None:
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
        caller's own writes); they happen when the caller executes it."""
        self._ensure_once()
        for body in bodies:
            pipe.xadd(self.name, {"b": body})

    def receive(self, max_messages: int = 10, wait_seconds: float = 0.0,
                visibility_timeout: float | None = None) -> list[Message]:
        if max_messages < 1:
            raise ValueError(f"max_messages must be at least 1, not {max_messages}")
        vt = self.visibility_timeout if visibility_timeout is None else visibility_timeout
        _check_timeout(vt)
        self._ensure_once()
        give_up = time.monotonic() + max(0.0, wait_seconds)
        while True:
            messages, last_id, next_expiry_ms, now_ms = self._receive_once(max_messages, vt)
            if messages or wait_seconds <= 0:
                return messages
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                return []
            if next_expiry_ms >= 0:
                remaining = min(remaining, (next_expiry_ms - now_ms) / 1000.0)
            # XREAD BLOCK 0 would block forever: never ask for less than 1 ms
            self._client.xread({self.name: last_id}, count=1, block=max(1, int(remaining * 1000) + 1))

    def _receive_once(self, max_messages: int, vt: float) -> tuple[list[Message], str, int, int]:
        args = [self.group, self.consumer, max_messages, int(vt * 1000), self.max_deliveries]
        keys = [self.name, self.leases_key, self.dlq_key]
        try:
            out, last_id, next_expiry, now = self._receive_script(keys=keys, args=args)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc) and "no such key" not in str(exc):
                raise
            # the stream or group was removed behind our back (FLUSHDB, DEL): recreate it
            self.ensure()
            out, last_id, next_expiry, now = self._receive_script(keys=keys, args=args)
        messages = [Message(message_id=_text(i), body=_bytes(b), receipt=_text(i), delivery_count=int(n))
                    for i, b, n in out]
        return messages, _text(last_id), int(next_expiry), int(now)

    def extend(self, receipts: list[str], visibility_timeout: float | None = None) -> None:
        """Push the leases to now + timeout. Receipts whose lease this consumer no longer
        holds (deleted, or reclaimed by another consumer) are skipped."""
        if not receipts:
            return
        vt = self.visibility_timeout if visibility_timeout is None else visibility_timeout
        _check_timeout(vt)
        self._ensure_once()
        extended = self._extend_script(keys=[self.name, self.leases_key],
                                       args=[self.group, self.consumer, int(vt * 1000), *receipts])
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
        entries = self._take_dead_script(keys=[self.dlq_key], args=[max_messages])
        messages = []
        for entry_id, flat in entries:
            fields = _fields(flat)
            messages.append(Message(message_id=_text(fields.get("id", entry_id)), body=_bytes(fields.get("b", b"")),
                                    receipt=_text(entry_id), delivery_count=int(fields.get("n", 0))))
        return messages

    def depth(self) -> int:
        return int(self._client.xlen(self.name))

    def set_password(self, password: str) -> None:
        """Log in with `password` from now on (new connections of the pool; open ones stay
        logged in): an endpoint agent whose credential was rotated takes the new one up."""
        self._client.connection_pool.connection_kwargs["password"] = password

    def close(self) -> None:
        if self._owns_client:
            self._client.close()


def _check_timeout(seconds: float) -> None:
    if seconds < 0:
        raise ValueError(f"visibility_timeout must be >= 0 seconds, not {seconds}")
