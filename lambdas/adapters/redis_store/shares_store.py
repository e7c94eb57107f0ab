"""Shares of functions, endpoints and endpoint groups in the hot store, for
lambdas/core/identity/access.py (DynamoDB keeps the durable copy; core fills the hot one
from it when it is absent).

Keys: `share:<kind>:<id>` hash principal -> role (the field `-` alone: filled, no shares,
so DynamoDB is not read again), `inshares:<user>` set of `<kind>:<id>` shared with the user
directly.
"""
from __future__ import annotations

from typing import Any, Optional

from lambdas.adapters.redis_store import lua_files

_EMPTY = "-"  # the field of a filled hash with no grants


def _key(kind: str, obj_id: str) -> str:
    return f"share:{kind}:{obj_id}"


def _inshares(user: str) -> str:
    return f"inshares:{user}"


def _user_of(principal: str) -> Optional[str]:
    return principal[5:] if principal.startswith("user:") else None


def _decoded(raw: dict) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items() if k.decode() != _EMPTY}


class ShareStore:
    def __init__(self, client: Any):
        self.r = client
        self._fill = lua_files.register(client, "fill_shares")

    def shares_of(self, kind: str, obj_id: str) -> Optional[dict[str, str]]:
        """principal -> role of the object's shares; None when the hot copy is absent."""
        raw = self.r.hgetall(_key(kind, obj_id))
        return _decoded(raw) if raw else None

    def fill_shares(self, kind: str, obj_id: str, grants: dict[str, str]) -> dict[str, str]:
        """Fill the hot copy with `grants` (read from the durable one) unless it is present
        by now; returns what it holds after."""
        flat = [x for kv in grants.items() for x in kv] or [_EMPTY, ""]
        self._fill(keys=[_key(kind, obj_id)], args=flat)
        return _decoded(self.r.hgetall(_key(kind, obj_id)))

    def grant_share(self, kind: str, obj_id: str, principal: str, role: str) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(_key(kind, obj_id), principal, role)
        pipe.hdel(_key(kind, obj_id), _EMPTY)
        user = _user_of(principal)
        if user is not None:
            pipe.sadd(_inshares(user), f"{kind}:{obj_id}")
        pipe.execute()

    def revoke_share(self, kind: str, obj_id: str, principal: str, last: bool) -> None:
        """Remove the principal's share; `last`: it was the object's only one, so the hash is
        kept present (filled, empty)."""
        pipe = self.r.pipeline(transaction=True)
        pipe.hdel(_key(kind, obj_id), principal)
        user = _user_of(principal)
        if user is not None:
            pipe.srem(_inshares(user), f"{kind}:{obj_id}")
        pipe.execute()
        if last:
            self.r.hsetnx(_key(kind, obj_id), _EMPTY, "")

    def shared_with(self, user: str) -> list[tuple[str, str]]:
        """(kind, id) of every object shared with the user directly, sorted."""
        members = sorted(m.decode() for m in self.r.smembers(_inshares(user)))
        return [(kind, obj_id) for kind, _, obj_id in (m.partition(":") for m in members)]
