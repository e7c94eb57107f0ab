"""Who sent a result pack: the check of an endpoint's seal (skyfn.protocol.result_seal).

The results queue cannot tell the service who added an entry, so an agent's pack counts as
its endpoint's only when its MAC checks out under that endpoint's results key; the pack is
then applied as that endpoint, whatever `endpoint_id` its body names
(lambdas/results.py). A lane's packs are checked by lambdas/core/identity/lanes.py; a pack
sealed by neither is refused.

Keys are derived from the endpoint credential's stored hash (credential_hashes.results_key) and
kept in this process for KEY_TTL seconds, so the results path makes no extra round trip to
Redis for them: a MAC that does not check out under a kept key is checked once more under
a freshly read one (the credential was rotated); a pack costs at most one read. A revoked credential's seals are accepted
for at most KEY_TTL more seconds -- and only for the endpoint's own tasks, which the store
checks next; on Redis Streams revoking also deletes the login, so nothing more arrives.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from pydantic import ValidationError

from lambdas.core.identity import credential_hashes
from skyfn.protocol import result_seal
from skyfn.protocol.messages import ResultPack

KEY_TTL = 10.0
_MAX_KEPT = 100_000  # endpoints whose key this process keeps (more: the oldest go first)


class SealRefused(Exception):
    """A result pack the service does not apply; the message says why, never a key."""


class _Keys:
    """endpoint id -> (results key, when read), read through `load` on a miss or when stale."""

    def __init__(self, load: Callable[[str], Optional[str]], ttl: float = KEY_TTL):
        self.load, self.ttl = load, ttl
        self._kept: dict[str, tuple[Optional[str], float]] = {}
        self._lock = threading.Lock()

    def get(self, endpoint_id: str, fresh: bool = False) -> tuple[Optional[str], bool]:
        """(the key, whether it was read just now)."""
        now = time.monotonic()
        kept = None if fresh else self._kept.get(endpoint_id)
        if kept is not None and now - kept[1] < self.ttl:
            return kept[0], False
        key = self.load(endpoint_id)
        with self._lock:
            if len(self._kept) >= _MAX_KEPT:
                for old in list(self._kept)[:_MAX_KEPT // 10]:
                    self._kept.pop(old, None)
            self._kept[endpoint_id] = (key, now)
        return key, True

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


keys = _Keys(credential_hashes.results_key)


def open_pack(raw: bytes | str) -> ResultPack:
    """The pack of an endpoint-sealed body, with `endpoint_id` set to the endpoint whose key
    sealed it. SealRefused when it is malformed, the endpoint has no credential, or the MAC
    does not check out."""
    opened = result_seal.open_sealed(raw)
    if opened is None:
        raise SealRefused("not a well-formed sealed pack (skyfn-seal 1 <endpoint> <mac>, a newline, the pack)")
    endpoint_id, mac, body = opened
    key, just_read = keys.get(endpoint_id)
    if (key is None or not result_seal.verify(key, endpoint_id, body, mac)) and not just_read:
        key, _ = keys.get(endpoint_id, fresh=True)  # rotated (or registered) since it was kept?
    if key is None:
        raise SealRefused(f"endpoint {endpoint_id} has no credential (revoked, or never registered)")
    if not result_seal.verify(key, endpoint_id, body, mac):
        raise SealRefused(f"endpoint {endpoint_id}: the MAC does not match the pack (not sealed with its "
                          "current credential)")
    try:
        pack = ResultPack.model_validate_json(body)
    except ValidationError as exc:
        raise SealRefused(f"endpoint {endpoint_id}: the sealed body is not a ResultPack "
                          f"({exc.error_count()} problems)") from None
    if pack.endpoint_id != endpoint_id:  # the sender is who sealed it, whatever the body says
        pack = pack.model_copy(update={"endpoint_id": endpoint_id})
    return pack
