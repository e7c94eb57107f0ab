"""The one small protocol every connector implements (ProxyStore's connectors/ shape).

A connector moves opaque bytes under string keys; everything above it (objects, refs,
capabilities, caching) is the Store's. A connector must be rebuildable in another process
from `config()` -- a JSON-able dict without secrets (secrets come from the environment or
files named in the config) -- because a Ref carries its store's connector config.
"""
from __future__ import annotations

from typing import Any, ClassVar, Optional, Protocol, Sequence, runtime_checkable

Buffer = Any  # bytes, bytearray, memoryview, or anything with the buffer protocol

# The characters of a plain key (no leading "."): the file layout the file and direct connectors share.
KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


@runtime_checkable
class Connector(Protocol):
    kind: ClassVar[str]

    def put(self, key: str, frames: Sequence[Buffer], ttl: Optional[float] = None) -> None:
        """Store the concatenation of `frames` under `key` (replacing it); expire after ttl seconds."""

    def get(self, key: str) -> Optional[Buffer]:
        """The bytes under `key`, or None when there are none (never stored, evicted, expired)."""

    def exists(self, key: str) -> bool: ...

    def evict(self, key: str) -> None:
        """Remove `key`; evicting a missing key is not an error."""

    def config(self) -> dict: ...

    @classmethod
    def from_config(cls, config: dict) -> "Connector": ...

    def close(self) -> None: ...
