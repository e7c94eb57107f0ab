"""Identifiers: random UUIDs, made in bulk from one read of the OS random source
(a 10,000-task batch needs 10,000 of them on the hot path)."""
from __future__ import annotations

import hashlib
import os
import uuid


def new_ids(n: int) -> list[str]:
    raw = os.urandom(16 * n)
    return [str(uuid.UUID(bytes=raw[i:i + 16], version=4)) for i in range(0, 16 * n, 16)]


def new_id() -> str:
    return str(uuid.uuid4())


def is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
        return True
    except ValueError:
        return False


def keyed_ids(owner: str, key: str, n: int, kind: str = "task") -> list[str]:
    """n UUIDs determined by (owner, idempotency key, kind): a retried submission gets the
    same ids as the attempt that may have stored its tasks before failing, so retrying
    creates nothing twice even when the first attempt never stored its answer."""
    raw = hashlib.shake_256(f"{kind}\0{owner}\0{key}".encode()).digest(16 * n)
    return [str(uuid.UUID(bytes=raw[i:i + 16], version=4)) for i in range(0, 16 * n, 16)]
