"""A directory as a store: one file per key (a shared file system between producer and consumer).

Writes go to a temporary name and are renamed into place, so a reader never sees half an
object. TTLs are kept in a sidecar expiry stamp checked on read (and swept by `sweep()`).
"""
from __future__ import annotations

import os
import time
from typing import ClassVar, Optional, Sequence

from skyfn.data.connectors.base import KEY_CHARS


class FileConnector:
    kind: ClassVar[str] = "file"

    def __init__(self, directory: str):
        self.directory = os.path.abspath(os.path.expanduser(directory))
        os.makedirs(self.directory, mode=0o700, exist_ok=True)

    def _path(self, key: str) -> str:
        if not key or not set(key) <= KEY_CHARS or key.startswith("."):
            raise ValueError(f"key {key!r} is not a plain name (letters, digits, '-', '_', '.')")
        return os.path.join(self.directory, key)

    def put(self, key: str, frames: Sequence, ttl: Optional[float] = None) -> None:
        path = self._path(key)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            for frame in frames:
                f.write(frame)
        if ttl is not None:
            with open(path + ".ttl", "w") as f:
                f.write(repr(time.time() + ttl))
        os.replace(tmp, path)

    def _expired(self, path: str) -> bool:
        try:
            with open(path + ".ttl") as f:
                return time.time() > float(f.read())
        except FileNotFoundError:
            return False

    def get(self, key: str):
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                buf = bytearray(size)
                view = memoryview(buf)
                got = 0
                while got < size:
                    n = f.readinto(view[got:])
                    if not n:
                        break
                    got += n
        except FileNotFoundError:
            return None
        if self._expired(path):
            self.evict(key)
            return None
        return buf

    def exists(self, key: str) -> bool:
        path = self._path(key)
        if not os.path.exists(path):
            return False
        if self._expired(path):
            self.evict(key)
            return False
        return True

    def evict(self, key: str) -> None:
        path = self._path(key)
        for p in (path, path + ".ttl"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    def sweep(self) -> int:
        """Remove expired objects; returns how many."""
        n = 0
        for name in os.listdir(self.directory):
            if name.endswith(".ttl") and self._expired(os.path.join(self.directory, name[:-4])):
                self.evict(name[:-4])
                n += 1
        return n

    def config(self) -> dict:
        return {"kind": self.kind, "directory": self.directory}

    @classmethod
    def from_config(cls, config: dict) -> "FileConnector":
        return cls(config["directory"])

    def close(self) -> None:
        pass
