"""Test setup for endpoint liveness: an endpoint whose last heartbeat was long ago, as the
store holds it (its record's hb and its place in the liveness index,
lambdas/adapters/redis_store/liveness_store.py)."""
from __future__ import annotations

import time

from lambdas.adapters.redis_store.connection import redis_client
from lambdas.adapters.redis_store.liveness_store import BEATS


def heard_long_ago(endpoint_id: str, seconds: float = 3600) -> None:
    """The endpoint's last heartbeat `seconds` ago (its status left as it is)."""
    at = time.time() - seconds
    r = redis_client()
    r.hset(f"ep:{endpoint_id}", "hb", f"{at:.6f}")
    r.zadd(BEATS, {endpoint_id: at})
