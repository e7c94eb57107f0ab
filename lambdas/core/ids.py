"""Identifiers: random UUIDs, made in bulk from one read of the OS random source
(a 10,000-task batch needs 10,000 of them on the hot path)."""
from __future__ import annotations

import hashlib
import os
import uuid


def _as_uuid4s(raw: bytes) -> list[str]:
    """Each 16 bytes as the text of a version-4 UUID: what str(uuid.UUID(bytes=b, version=4))
    gives, several times faster (the version and variant bits set on the bytes, then hex)."""
    b = bytearray(raw)
    for i in range(0, len(b), 16):
        b[i + 6] = (b[i + 6] & 0x0F) | 0x40
        b[i + 8] = (b[i + 8] & 0x3F) | 0x80
    h = b.hex()
    return [f"{h[j:j + 8]}-{h[j + 8:j + 12]}-{h[j + 12:j + 16]}-{h[j + 16:j + 20]}-{h[j + 20:j + 32]}"
            for j in range(0, len(h), 32)]


def new_ids(n: int) -> list[str]:
    return _as_uuid4s(os.urandom(16 * n))


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
    return _as_uuid4s(hashlib.shake_256(f"{kind}\0{owner}\0{key}".encode()).digest(16 * n))
