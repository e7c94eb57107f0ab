"""Time-ordered identifiers (the UUIDv7 layout of RFC 9562): the first 48 bits are the
milliseconds since the epoch, then the version (7), 12 + 62 bits of randomness and the
variant. The service makes task ids this way and the SDK its idempotency keys and direct
session task ids, so that an id alone says when it was made: the durable history files a
task under the minute of its id (lambdas/adapters/dynamodb.py) and finds it again from the
id, without an index of its own."""
from __future__ import annotations

import os
import time
import uuid

_V7_TEXT_LEN = 36


def uuid7s(n: int, ms: int | None = None, random: bytes | None = None) -> list[str]:
    """n ids as UUID text. `ms`: their time (now if None); `random`: 10 bytes per id (the
    OS's if None), for ids derived from something else (a keyed retry makes the same ids)."""
    ms = int(time.time() * 1000) if ms is None else ms
    stamp = (ms & 0xFFFF_FFFF_FFFF).to_bytes(6, "big").hex()
    raw = bytearray(random if random is not None else os.urandom(10 * n))
    for i in range(0, 10 * n, 10):
        raw[i] = 0x70 | (raw[i] & 0x0F)
        raw[i + 2] = 0x80 | (raw[i + 2] & 0x3F)
    h = raw.hex()
    return [f"{stamp[:8]}-{stamp[8:]}-{h[j:j + 4]}-{h[j + 4:j + 8]}-{h[j + 8:j + 20]}" for j in range(0, len(h), 20)]


def uuid7() -> str:
    return uuid7s(1)[0]


def uuid7_hex() -> str:
    """A v7 UUID as 32 hex digits (the SDK's idempotency keys)."""
    return uuid7().replace("-", "")


def time_ms(value: str) -> int | None:
    """The milliseconds of a v7 UUID (text with or without dashes), None for anything else."""
    if len(value) == _V7_TEXT_LEN and value[14] == "7" and value[19] in "89abAB" and value[8] == "-":
        try:  # the usual case, without building a UUID (the history drain asks for every task)
            return int(value[:8] + value[9:13], 16)
        except ValueError:
            return None
    try:
        u = uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        return None
    if u.version != 7 or u.variant != uuid.RFC_4122:
        return None
    return u.int >> 80
