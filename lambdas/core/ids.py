"""Identifiers: random UUIDs, made in bulk from one read of the OS random source
(a 10,000-task batch needs 10,000 of them on the hot path). Task ids are time-ordered
(skyfn/protocol/ids.py): the durable history finds a task from the time in its id."""
from __future__ import annotations

import hashlib
import uuid

from skyfn.protocol.ids import time_ms, uuid7s


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
    """Task ids: time-ordered (v7), the time of now."""
    return uuid7s(n)


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
    creates nothing twice even when the first attempt never stored its answer. A key that
    is itself a v7 UUID (the SDK's) gives v7 ids with the key's time; others give v4 ids."""
    seed = f"{kind}\0{owner}\0{key}".encode()
    ms = time_ms(key)
    if ms is not None:
        return uuid7s(n, ms, hashlib.shake_256(seed).digest(10 * n))
    return _as_uuid4s(hashlib.shake_256(seed).digest(16 * n))
