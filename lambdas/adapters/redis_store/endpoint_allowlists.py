"""Endpoint allowlists in the hot store: the field `allow` (JSON; absent: any function) of
the endpoint's record `ep:<endpoint>` (registry_store.py writes the record), for
lambdas/core/identity/allowlist.py."""
from __future__ import annotations

from typing import Any, Optional

ALLOW_FIELD = "allow"


def _key(endpoint_id: str) -> str:
    return f"ep:{endpoint_id}"


def _text(value: Optional[bytes]) -> Optional[str]:
    return value.decode() if value is not None else None


class EndpointAllowlists:
    def __init__(self, client: Any):
        self.r = client

    def allowlist(self, endpoint_id: str) -> Optional[str]:
        """The encoded allowlist, None when the record has none."""
        return _text(self.r.hget(_key(endpoint_id), ALLOW_FIELD))

    def set_allowlist(self, endpoint_id: str, encoded: Optional[str]) -> None:
        """Keep the encoded allowlist; None removes it (any function)."""
        if encoded is None:
            self.r.hdel(_key(endpoint_id), ALLOW_FIELD)
        else:
            self.r.hset(_key(endpoint_id), ALLOW_FIELD, encoded)

    def allowlists_and_names(self, endpoint_ids: list[str]) -> dict[str, tuple[Optional[str], Optional[str]]]:
        """endpoint id -> (encoded allowlist, name), in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for ep in endpoint_ids:
            pipe.hmget(_key(ep), ALLOW_FIELD, "name")
        return {ep: (_text(allow), _text(name)) for ep, (allow, name) in zip(endpoint_ids, pipe.execute())}
