"""The endpoint's Redis as a store (the intra-endpoint path of DESIGN.md section 6).

Values up to `chunk_bytes` live in one key; larger ones are split into chunks written and
read in one pipeline each (Redis refuses single values over 512 MiB, and one huge value
blocks the server for its whole copy). Layout under the prefix (default "skyfn:d:"):
`<prefix><key>` holds b"1" + the value, or b"n" + the chunk count; chunks live at
`<prefix><key>:<i>`. Every key of an object carries the same TTL.

The password is never part of `config()` (a ref carries the config): it comes from the
constructor, from the file named by `password_file`, or from the environment variable
named by `password_env` (default SKYFN_DATA_REDIS_PASSWORD). TLS with `ssl: true` (and
`ssl_ca_certs`).
"""
from __future__ import annotations

import os
from typing import ClassVar, Optional, Sequence

DEFAULT_PREFIX = "skyfn:d:"
DEFAULT_CHUNK = 32 << 20
PASSWORD_ENV = "SKYFN_DATA_REDIS_PASSWORD"


class RedisConnector:
    kind: ClassVar[str] = "redis"

    def __init__(self, host: str = "127.0.0.1", port: int = 6379, *, password: Optional[str] = None,
                 password_env: str = PASSWORD_ENV, password_file: Optional[str] = None, username: Optional[str] = None,
                 db: int = 0, ssl: bool = False, ssl_ca_certs: Optional[str] = None, prefix: str = DEFAULT_PREFIX,
                 chunk_bytes: int = DEFAULT_CHUNK):
        import redis

        if password is None and password_file:
            with open(os.path.expanduser(password_file)) as f:
                password = f.read().strip()
        if password is None:
            password = os.environ.get(password_env) or None
        self.host, self.port, self.db, self.username = host, int(port), int(db), username
        self.ssl, self.ssl_ca_certs, self.prefix = bool(ssl), ssl_ca_certs, prefix
        self.password_env, self.password_file = password_env, password_file
        self.chunk_bytes = max(1 << 20, int(chunk_bytes))
        self.client = redis.Redis(host=host, port=int(port), db=int(db), username=username, password=password,
                                  ssl=bool(ssl), ssl_ca_certs=ssl_ca_certs, socket_timeout=120,
                                  socket_connect_timeout=10, health_check_interval=30)

    def _k(self, key: str) -> str:
        return self.prefix + key

    def put(self, key: str, frames: Sequence, ttl: Optional[float] = None) -> None:
        views = [memoryview(f).cast("B") for f in frames]
        size = sum(v.nbytes for v in views)
        px = None if ttl is None else max(1, int(ttl * 1000))
        k = self._k(key)
        if size + 1 <= self.chunk_bytes:
            self.client.set(k, b"".join([b"1", *views]), px=px)
            return
        whole = memoryview(b"".join(views)) if len(views) > 1 else views[0]
        n = (size + self.chunk_bytes - 1) // self.chunk_bytes
        pipe = self.client.pipeline(transaction=True)  # readers see all chunks or the old header
        for i in range(n):
            pipe.set(f"{k}:{i}", whole[i * self.chunk_bytes:(i + 1) * self.chunk_bytes], px=px)
        pipe.set(k, b"n" + str(n).encode(), px=px)
        pipe.execute()

    def get(self, key: str):
        k = self._k(key)
        head = self.client.get(k)
        if head is None:
            return None
        if head[:1] == b"1":
            return memoryview(head)[1:]
        n = int(head[1:])
        pipe = self.client.pipeline(transaction=False)
        for i in range(n):
            pipe.get(f"{k}:{i}")
        chunks = pipe.execute()
        if any(c is None for c in chunks):  # expired or evicted between the two reads
            return None
        out = bytearray(sum(len(c) for c in chunks))
        pos = 0
        for c in chunks:
            out[pos:pos + len(c)] = c
            pos += len(c)
        return out

    def exists(self, key: str) -> bool:
        return bool(self.client.exists(self._k(key)))

    def evict(self, key: str) -> None:
        k = self._k(key)
        head = self.client.get(k)
        keys = [k]
        if head is not None and head[:1] == b"n":
            keys += [f"{k}:{i}" for i in range(int(head[1:]))]
        self.client.delete(*keys)

    def config(self) -> dict:
        cfg = {"kind": self.kind, "host": self.host, "port": self.port, "db": self.db, "prefix": self.prefix,
               "chunk_bytes": self.chunk_bytes, "password_env": self.password_env}
        if self.password_file:
            cfg["password_file"] = self.password_file
        if self.username:
            cfg["username"] = self.username
        if self.ssl:
            cfg["ssl"] = True
            if self.ssl_ca_certs:
                cfg["ssl_ca_certs"] = self.ssl_ca_certs
        return cfg

    @classmethod
    def from_config(cls, config: dict) -> "RedisConnector":
        return cls(**config)

    def close(self) -> None:
        self.client.close()
