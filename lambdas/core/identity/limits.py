"""Per-caller rate limits: a token bucket per user (or endpoint agent) in Redis.

Each request takes one token; a bucket holds up to `burst` tokens and refills at `rate`
per second (SKYFN_RATE_PER_SECOND, SKYFN_RATE_BURST). The bucket is read, refilled and
taken from in one script on the Redis server's clock, so every API process (every Lambda
container) shares the same limit. An empty bucket answers 429 with the limit, the rate
seen and a Retry-After; the SDK waits and retries.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from lambdas.config import settings
from lambdas.core import deps

_TAKE = """
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(v[1]) or burst
local ts = tonumber(v[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local ok = 0
if tokens >= 1 then
  tokens = tokens - 1
  ok = 1
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 60)
return {ok, tostring(tokens)}
"""


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after: float   # seconds until one token is back (0 when allowed)
    rate: float
    burst: float


@functools.lru_cache(maxsize=4)
def _take_script(client):
    """_TAKE registered with `client`: called by EVALSHA, the script body is not resent."""
    return client.register_script(_TAKE)


def take(principal: str) -> Verdict:
    s = settings()
    rate, burst = s.rate_per_second, s.rate_burst
    if rate <= 0:  # limits switched off
        return Verdict(True, 0.0, rate, burst)
    ok, tokens = _take_script(deps.redis_client())(keys=[f"rl:{principal}"], args=[repr(rate), repr(burst)])
    if int(ok):
        return Verdict(True, 0.0, rate, burst)
    return Verdict(False, max(0.001, (1 - float(tokens)) / rate), rate, burst)


def retry_after_header(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


def with_value_seen(err: dict) -> str:
    """A validation message that names the size seen next to the limit (pydantic names
    only the limit for strings: "String should have at most 1048576 characters")."""
    msg = str(err.get("msg", ""))
    value = err.get("input")
    if err.get("type") == "string_too_long" and isinstance(value, str):
        where = ".".join(str(p) for p in err.get("loc", ()))
        hint = ""
        if where.endswith("payload"):
            hint = ": large arguments go through S3 (the SDK does this by itself; see docs/security.md, Limits)"
        elif where.endswith("function"):
            hint = ": ship large data as arguments or files, not inside the function"
        return f"{msg}, got {len(value)}{hint}"
    return msg
