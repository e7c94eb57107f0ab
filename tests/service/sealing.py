"""Result packs as an endpoint's agent sends them: sealed with the endpoint's results key
(skyfn.protocol.result_seal), derived here from the credential its registration handed out,
as the agent derives it."""
from __future__ import annotations

from skyfn.protocol.messages import ResultPack
from skyfn.protocol.result_seal import key_of_credential, seal


def key_of(endpoint_id: str) -> str:
    """The endpoint's current results key, as the service derives it (for tests that kept no credential)."""
    from lambdas.core.identity import credential_hashes

    key = credential_hashes.results_key(endpoint_id)
    assert key is not None, f"endpoint {endpoint_id} has no credential"
    return key


def sealed(endpoint_id: str, pack: ResultPack | str | bytes, credential: str | None = None) -> str:
    """`pack` sealed as `endpoint_id`'s agent seals it: with the key of `credential` (the
    agent's), else with the endpoint's current key."""
    body = pack.model_dump_json().encode() if isinstance(pack, ResultPack) else \
        (pack if isinstance(pack, bytes) else pack.encode())
    key = key_of_credential(credential) if credential else key_of(endpoint_id)
    assert key is not None
    return seal(endpoint_id, key, body).decode()
