"""Idempotency keys of submissions in the hot task store: idem:<owner>:<key> holds b'pending'
while an attempt runs, then that attempt's answer (lambdas/core/tasks/idempotency.py)."""
from __future__ import annotations

import redis


class IdempotencyKeys:
    """The idem:<owner>:<key> operations of TaskStore."""

    r: redis.Redis

    def idempotent_claim_or_get(self, owner: str, key: str, seconds: int = 300) -> bytes | None:
        """Claim the key (None: claimed now) or get what it holds: b'pending' while another
        attempt holds the claim, else that attempt's stored answer. One round trip
        (SET NX GET, Redis 7)."""
        return self.r.set(f"idem:{owner}:{key}", b"pending", nx=True, ex=seconds, get=True)

    def idempotent_claim(self, owner: str, key: str, seconds: int = 300) -> bool:
        return bool(self.r.set(f"idem:{owner}:{key}", b"pending", nx=True, ex=seconds))

    def idempotent_store(self, owner: str, key: str, answer: bytes, seconds: int = 86400) -> None:
        self.r.set(f"idem:{owner}:{key}", answer, ex=seconds)

    def idempotent_release(self, owner: str, key: str) -> None:
        self.r.delete(f"idem:{owner}:{key}")
