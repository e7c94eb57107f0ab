"""The direct channels agents publish (`epdirect:<endpoint>`, JSON with a time to live; the
heartbeat writes it, lambdas/adapters/redis_store/registry_store.py), read and withdrawn for
lambdas/core/identity/direct_info.py."""
from __future__ import annotations

from typing import Any, Optional

from lambdas.adapters.redis_store.registry_store import direct_key


class DirectChannels:
    def __init__(self, client: Any):
        self.r = client

    def withdraw(self, endpoint_ids: list[str]) -> None:
        if endpoint_ids:
            self.r.delete(*(direct_key(e) for e in endpoint_ids))

    def published(self, endpoint_id: str) -> Optional[bytes]:
        """The channel's JSON, None when none is published."""
        return self.r.get(direct_key(endpoint_id))
