"""The SHA-256 (hex) of each endpoint credential's secret in the hot store
(`agentcred:<endpoint id>`), what every credential and seal check reads, for
lambdas/core/identity/agent_keys.py and credential_hashes.py (the endpoint's DynamoDB item
keeps the durable copy)."""
from __future__ import annotations

from typing import Any, Optional


def _key(endpoint_id: str) -> str:
    return f"agentcred:{endpoint_id}"


class CredentialHashes:
    def __init__(self, client: Any):
        self.r = client

    def digest(self, endpoint_id: str) -> Optional[str]:
        got = self.r.get(_key(endpoint_id))
        return got.decode() if got is not None else None

    def keep(self, endpoint_id: str, digest: str) -> None:
        self.r.set(_key(endpoint_id), digest)

    def forget(self, endpoint_id: str) -> None:
        self.r.delete(_key(endpoint_id))
