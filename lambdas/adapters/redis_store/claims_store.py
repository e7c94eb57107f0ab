"""Each user's latest identity claims in the hot store (`claims:<user>`, hash username,
email, identity_provider), for lambdas/core/identity/submitters.py."""
from __future__ import annotations

from typing import Any

from lambdas.adapters.redis_store import lua_files

FIELDS = ("username", "email", "identity_provider")  # remember_claims.lua's ARGV, in this order


def _key(user: str) -> str:
    return f"claims:{user}"


class ClaimsStore:
    def __init__(self, client: Any):
        self._remember = lua_files.register(client, "remember_claims")
        self.r = client

    def remember(self, user: str, claims: dict[str, str]) -> bool:
        """Keep the user's claims (absent ones as ''); True when they changed (one round trip)."""
        return bool(self._remember(keys=[_key(user)], args=[claims.get(f) or "" for f in FIELDS]))

    def claims_of(self, user: str) -> dict[str, str]:
        """The user's kept claims ({} when none were seen)."""
        values = self.r.hmget(_key(user), *FIELDS)
        return {f: v.decode() for f, v in zip(FIELDS, values) if v}
