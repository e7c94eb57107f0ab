"""The Redis function library of the Redis Streams queue adapter (redis_streams.py).

The multi-key steps of a queue (receive, extend, take dead letters) run inside Redis as
*functions* of one library, loaded once by a login that may (the service's, FUNCTION LOAD)
and called with FCALL by everyone. An endpoint's queue login may call these functions but
may not run a script of its own (no EVAL, EVALSHA, SCRIPT or FUNCTION: an agent could stall
the shared Redis with `EVAL "while true do end" 0`), and every command a function runs is
checked against the caller's ACL rules, so an agent's call reaches only its own queue's keys
(lambdas/adapters/queue_logins.py lists what a queue login may run).

Every loop in the library is bounded by a cap below, whatever the caller passes, so no
call holds Redis for long. Functions persist in Redis (its AOF and RDB files, and
replicas); a server that lost them (FUNCTION FLUSH, a fresh server) gets them again from
the next caller allowed to load them. The version is in the names: a changed library is a
new name, so agents of two versions can share one Redis.

Function names and what they take (KEYS / ARGV):
- skyfn_q1_receive  KEYS stream, leases, dlq; ARGV group, consumer, want, visibility ms,
                    max deliveries -> {{id, body, deliveries}...}, last id, next expiry, now
- skyfn_q1_extend   KEYS stream, leases; ARGV group, consumer, visibility ms, ids...
                    -> leases extended
- skyfn_q1_take_dead KEYS dlq; ARGV count -> entries (taken off the dead-letter stream)
"""
from __future__ import annotations

from typing import Any

import redis

LIBRARY = "skyfn_q1"
RECEIVE, EXTEND, TAKE_DEAD = f"{LIBRARY}_receive", f"{LIBRARY}_extend", f"{LIBRARY}_take_dead"
MAX_RECEIVE = 1000  # messages one receive hands out (a caller asking for more gets this many)
MAX_EXTEND = 1000   # ids one extend call takes (the adapter sends more in several calls)
MAX_TAKE_DEAD = 1000

SOURCE = f"""#!lua name={LIBRARY}
local MAX_RECEIVE, MAX_EXTEND, MAX_TAKE_DEAD = {MAX_RECEIVE}, {MAX_EXTEND}, {MAX_TAKE_DEAD}

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function body_of(fields)
  for i = 1, #fields, 2 do
    if fields[i] == 'b' then return fields[i + 1] end
  end
  return ''
end

local function receive(keys, args)
  local stream, leases, dlq = keys[1], keys[2], keys[3]
  local group, consumer = args[1], args[2]
  local want = math.min(math.max(tonumber(args[3]) or 1, 1), MAX_RECEIVE)
  local vt = tonumber(args[4])
  local max_deliveries = tonumber(args[5])
  local now = now_ms()
  local deadline = now + vt
  local out = {{}}

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
            out[#out + 1] = {{id, body_of(claimed[1][2]), count + 1}}
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
        out[#out + 1] = {{e[1], body_of(e[2]), 1}}
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
  return {{out, last_id, next_expiry, now}}
end

local function extend(keys, args)
  local stream, leases = keys[1], keys[2]
  local group, consumer = args[1], args[2]
  if #args - 3 > MAX_EXTEND then
    return redis.error_reply('ERR at most ' .. MAX_EXTEND .. ' leases a call')
  end
  local deadline = now_ms() + tonumber(args[3])
  local extended = 0
  for i = 4, #args do
    local id = args[i]
    local p = redis.call('XPENDING', stream, group, id, id, 1)
    -- only a lease this consumer still holds; a reclaimed or deleted message is left alone
    if #p > 0 and p[1][2] == consumer and redis.call('ZSCORE', leases, id) then
      redis.call('ZADD', leases, 'XX', deadline, id)
      redis.call('XCLAIM', stream, group, consumer, 0, id, 'JUSTID')
      extended = extended + 1
    end
  end
  return extended
end

local function take_dead(keys, args)
  local count = math.min(math.max(tonumber(args[1]) or 1, 1), MAX_TAKE_DEAD)
  local entries = redis.call('XRANGE', keys[1], '-', '+', 'COUNT', count)
  for _, e in ipairs(entries) do redis.call('XDEL', keys[1], e[1]) end
  return entries
end

redis.register_function('{RECEIVE}', receive)
redis.register_function('{EXTEND}', extend)
redis.register_function('{TAKE_DEAD}', take_dead)
"""


class NotLoaded(RuntimeError):
    """The library is missing from Redis and this login may not load it."""


def load(client: "redis.Redis") -> None:
    """Load (or replace) the library; a login without FUNCTION LOAD raises NoPermissionError."""
    client.execute_command("FUNCTION", "LOAD", "REPLACE", SOURCE)


def call(client: "redis.Redis", function: str, keys: list[str], args: list[Any]) -> Any:
    """FCALL `function`; when Redis does not have the library, load it once and call again."""
    try:
        return client.execute_command("FCALL", function, len(keys), *keys, *args)
    except redis.ResponseError as exc:
        if "function not found" not in str(exc).lower():
            raise
    try:
        load(client)
    except redis.exceptions.NoPermissionError as exc:
        raise NotLoaded(f"Redis has no function {function} and this login may not load it ({exc}): the service "
                        "loads the queue functions when it starts and whenever it next uses a queue") from exc
    return client.execute_command("FCALL", function, len(keys), *keys, *args)


def ensure_loaded(client: "redis.Redis") -> bool:
    """Load the library unless Redis has it; False when this login may not look or load
    (an agent's queue login: it relies on the service having loaded it)."""
    try:
        if not client.execute_command("FUNCTION", "LIST", "LIBRARYNAME", LIBRARY):
            load(client)
        return True
    except redis.exceptions.NoPermissionError:
        return False
