"""The hash the service keeps of each endpoint credential's secret (lambdas/core/identity/
agent_keys.py issues them), and the results key derived from it
(skyfn.protocol.result_seal): what the credential check and the results function's seal
check read. The hot store keeps them (lambdas/adapters/redis_store/credential_store.py), the
endpoint's DynamoDB item (`cred_hash`) the durable copy, read back when the hot one is lost.
"""
from __future__ import annotations

from typing import Optional

from lambdas.core import deps
from skyfn.protocol import result_seal


def stored_digest(endpoint_id: str) -> Optional[str]:
    """SHA-256 (hex) of the endpoint's current credential secret, None when it has none
    (revoked, or never registered)."""
    hot = deps.credential_hashes()
    digest = hot.digest(endpoint_id)
    if digest is not None:
        return digest
    digest = (deps.dynamo().get_endpoint(endpoint_id) or {}).get("cred_hash")
    if not digest:
        return None
    hot.keep(endpoint_id, digest)
    return digest


def results_key(endpoint_id: str) -> Optional[str]:
    """The key the endpoint's agent seals its result packs with (skyfn.protocol.result_seal),
    derived from its current credential; None when it has no credential."""
    digest = stored_digest(endpoint_id)
    return result_seal.results_key(digest) if digest else None
