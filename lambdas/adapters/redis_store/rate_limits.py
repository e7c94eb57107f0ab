"""Per-caller token buckets in the hot store (rl:<principal>), for lambdas/core/identity/limits.py."""
from __future__ import annotations

from typing import Any

from lambdas.adapters.redis_store import lua_files


class RateLimits:
    def __init__(self, client: Any):
        self._take = lua_files.register(client, "take_token")

    def take(self, principal: str, rate: float, burst: float) -> tuple[bool, float]:
        """One token from `principal`'s bucket: (taken, tokens left after)."""
        ok, tokens = self._take(keys=[f"rl:{principal}"], args=[repr(rate), repr(burst)])
        return bool(int(ok)), float(tokens)
