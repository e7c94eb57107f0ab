"""Per-caller rate limits: a token bucket per user (or endpoint agent) in Redis.

Each request takes one token; a bucket holds up to `burst` tokens and refills at `rate`
per second (SKYFN_RATE_PER_SECOND, SKYFN_RATE_BURST). The bucket is read, refilled and
taken from in one script on the hot store's clock (lua/take_token.lua), so every API process (every Lambda
container) shares the same limit. An empty bucket answers 429 with the limit, the rate
seen and a Retry-After; the SDK waits and retries.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from lambdas.config import settings
from lambdas.core import deps


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    retry_after: float   # seconds until one token is back (0 when allowed)
    rate: float
    burst: float


def take(principal: str) -> Verdict:
    s = settings()
    rate, burst = s.rate_per_second, s.rate_burst
    if rate <= 0:  # limits switched off
        return Verdict(True, 0.0, rate, burst)
    ok, tokens = deps.rate_limits().take(principal, rate, burst)
    if ok:
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
