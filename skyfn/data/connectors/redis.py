"""The endpoint's Redis as a store (the intra-endpoint path of DESIGN.md section 6).

Values up to `chunk_bytes` live in one key; larger ones are split into chunks written and
read in one pipeline each (Redis refuses single values over 512 MiB, and one huge value
blocks the server for its whole copy). Layout under the prefix (default "skyfn:d:"):
`<prefix><key>` holds b"1" + the value, or b"n<chunk count>:<total bytes>"; chunks live at
`<prefix><key>:<i>`. Every key of an object carries the same TTL. Large values move
without copies in Python: chunks are cut along the encoder's frames and sent as
memoryviews, and read straight from the socket into one preallocated buffer.

The password is never part of `config()` (a ref carries the config): it comes from the
constructor, from the file named by `password_file`, or from the environment variable
named by `password_env` (default SKYFN_DATA_REDIS_PASSWORD). TLS with `ssl: true` (and
`ssl_ca_certs`).
"""
from __future__ import annotations

import os
from typing import ClassVar, Optional, Sequence

DEFAULT_PREFIX = "skyfn:d:"
DEFAULT_CHUNK = 8 << 20  # measured best for 100 MiB on this machine (4-8 MiB; 32 MiB puts took 2-4x as long)
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
                                  socket_connect_timeout=10, health_check_interval=30,
                                  protocol=2)  # RESP2: no push messages between replies (_read_chunks)

    def _k(self, key: str) -> str:
        return self.prefix + key

    def _chunks(self, views: list) -> list:
        """Chunk values of at most chunk_bytes, cut along the frames: a large frame is sliced
        (memoryviews, no copy); only runs of small frames are joined."""
        chunks, pending, pending_size = [], [], 0

        def flush():
            nonlocal pending, pending_size
            if pending:
                chunks.append(pending[0] if len(pending) == 1 else b"".join(pending))
            pending, pending_size = [], 0

        for v in views:
            if v.nbytes >= self.chunk_bytes // 4:
                flush()
            pos = 0
            while pos < v.nbytes:
                take = min(v.nbytes - pos, self.chunk_bytes - pending_size)
                pending.append(v[pos:pos + take])
                pending_size += take
                pos += take
                if pending_size >= self.chunk_bytes:
                    flush()
        flush()
        return chunks

    def put(self, key: str, frames: Sequence, ttl: Optional[float] = None) -> None:
        views = [memoryview(f).cast("B") for f in frames]
        size = sum(v.nbytes for v in views)
        px = () if ttl is None else (b"PX", max(1, int(ttl * 1000)))
        k = self._k(key)
        if size + 1 <= self.chunk_bytes:
            # The header of what this replaces (its chunks, if any, go), then the value: one
            # round trip, the frames sent as they are (one bulk string from many buffers).
            with _Raw(self.client) as raw:
                raw.send((b"GETRANGE", k, 0, 40), (b"SET", k, [b"1", *views], *px))
                old, _ = raw.reply(), raw.reply()
            count = 0
        else:
            chunks = self._chunks(views)  # redis-py sends memoryview arguments as they are
            pipe = self.client.pipeline(transaction=True)  # readers see all chunks or the old header
            pipe.getrange(k, 0, 40)
            for i, chunk in enumerate(chunks):
                pipe.set(f"{k}:{i}", chunk, px=px[1] if px else None)
            pipe.set(k, b"n%d:%d" % (len(chunks), size), px=px[1] if px else None)
            old = pipe.execute()[0]
            count = len(chunks)
        if old and old[:1] == b"n":
            stale = int(old[1:].partition(b":")[0])
            if stale > count:
                self.client.unlink(*[f"{k}:{i}" for i in range(count, stale)])

    def get(self, key: str):
        """A writable buffer (numpy arrays decoded from it are writable views), or None."""
        k = self._k(key)
        with _Raw(self.client) as raw:
            raw.send((b"GET", k))
            value = raw.reply()  # received into a fresh bytearray
        if value is None:
            return None
        if value[:1] == b"1":
            return memoryview(value)[1:]
        count, _, total = bytes(value[1:]).partition(b":")
        return _read_chunks(self.client, [f"{k}:{i}" for i in range(int(count))], int(total))

    def exists(self, key: str) -> bool:
        return bool(self.client.exists(self._k(key)))

    def evict(self, key: str) -> None:
        k = self._k(key)
        with _Raw(self.client) as raw:  # header and removal in one round trip
            raw.send((b"GETRANGE", k, 0, 40), (b"UNLINK", k))  # UNLINK: freed off the server's main thread
            head, _ = raw.reply(), raw.reply()
        if head and head[:1] == b"n":
            self.client.unlink(*[f"{k}:{i}" for i in range(int(bytes(head[1:]).partition(b":")[0]))])

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


def _read_chunks(client, keys: list, total: int):
    """GET `keys` in one round trip, each reply received straight into its place in one
    bytearray of `total` bytes (no per-chunk bytes objects, no reassembly copy). None if a
    chunk is missing (expired or evicted meanwhile)."""
    out = bytearray(total)
    view, pos, missing = memoryview(out), 0, False
    with _Raw(client) as raw:
        raw.send(*[(b"GET", key) for key in keys])
        for _ in keys:
            n = raw.bulk_length()
            if n < 0:
                missing = True
                continue
            if pos + n > total:
                raise ValueError(f"the chunks hold more than the {total} bytes their header announced")
            raw.read_into(view[pos:pos + n])
            pos += n
    if not missing and pos != total:
        raise ValueError(f"the chunks hold {pos} bytes, their header announced {total}")
    return None if missing else out


class _Raw:
    """A few RESP2 commands over one of redis-py's pooled connections (its authentication,
    TLS and reconnection), with the replies read here, from the socket, instead of by
    redis-py's parser: a bulk argument may be many buffers sent as they are, and a bulk reply
    is received straight into a buffer of its size. The parser has read nothing of these
    replies (the connector's client speaks RESP2: no push messages in between). On any
    error the connection is dropped, its position in the reply stream being unknown."""

    def __init__(self, client):
        self.pool = client.connection_pool
        self.conn = None
        self.sock = None
        self.carry = bytearray()  # bytes received past what was consumed

    def __enter__(self) -> "_Raw":
        self.conn = self.pool.get_connection()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or self.carry:
            self.conn.disconnect()
        self.pool.release(self.conn)

    def send(self, *commands) -> None:
        """Each command: a sequence of arguments, each bytes, str, int, or a list of buffers
        (one bulk string made of them)."""
        out, small = [], bytearray()
        for cmd in commands:
            small += b"*%d\r\n" % len(cmd)
            for arg in cmd:
                if isinstance(arg, list):
                    parts = [memoryview(a).cast("B") for a in arg]
                    small += b"$%d\r\n" % sum(p.nbytes for p in parts)
                    for p in parts:
                        if p.nbytes < 65536:
                            small += p
                        else:
                            out.append(bytes(small))
                            out.append(p)
                            small = bytearray()
                    small += b"\r\n"
                    continue
                if isinstance(arg, str):
                    arg = arg.encode()
                elif isinstance(arg, int):
                    arg = b"%d" % arg
                small += b"$%d\r\n" % len(arg)
                small += arg
                small += b"\r\n"
        if small:
            out.append(bytes(small))
        self.conn.send_packed_command(out)
        self.sock = self.conn._sock

    def _line(self) -> bytes:
        while True:
            end = self.carry.find(b"\r\n")
            if end >= 0:
                line = bytes(self.carry[:end])
                del self.carry[:end + 2]
                return line
            self._recv_more()

    def _recv_more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("redis closed the connection in the middle of a reply")
        self.carry += data

    def _error(self, line: bytes):
        import redis

        if line[:1] == b"-":
            msg = line[1:].decode(errors="replace")
            if msg.startswith("NOAUTH") or msg.startswith("WRONGPASS"):
                raise redis.AuthenticationError(msg)
            raise redis.ResponseError(msg)
        raise ValueError(f"unexpected reply from redis: {line[:40]!r}")

    def bulk_length(self) -> int:
        """The length of the next bulk reply (-1: nil)."""
        line = self._line()
        if line[:1] == b"$":
            return int(line[1:])
        if line == b"_":  # RESP3's null
            return -1
        self._error(line)

    def reply(self):
        """The next reply: a bytearray (bulk), bytes (status), int, or None (nil)."""
        line = self._line()
        kind = line[:1]
        if kind == b"$":
            n = int(line[1:])
            if n < 0:
                return None
            out = bytearray(n)
            self.read_into(memoryview(out))
            return out
        if kind == b"+":
            return line[1:]
        if kind == b":":
            return int(line[1:])
        if line == b"_":
            return None
        self._error(line)

    def read_into(self, dest: memoryview) -> None:
        """Exactly dest.nbytes bytes of a bulk reply, then its CRLF."""
        n = dest.nbytes
        got = min(n, len(self.carry))
        dest[:got] = self.carry[:got]
        del self.carry[:got]
        while got < n:
            r = self.sock.recv_into(dest[got:])
            if not r:
                raise ConnectionError("redis closed the connection in the middle of a reply")
            got += r
        while len(self.carry) < 2:
            self._recv_more()
        if self.carry[:2] != b"\r\n":
            raise ValueError("a redis bulk reply did not end with CRLF")
        del self.carry[:2]
