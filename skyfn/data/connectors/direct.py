"""The direct path: the producer's endpoint keeps the bytes, consumers pull them peer to peer.

    DirectConnector(rendezvous="rdv.example.org:7300", name="objects.ep-1", directory="/dev/shm/skyfn-ep-1",
                    endpoint_id="ep-1")

On the producer's endpoint `put`/`evict`/`exists` work on a local directory (memory-backed
under /dev/shm by default; any directory spills to disk), with TTLs, through the file
connector's layout. The endpoint's object server (`endpoint_agent/data/object_server.py`) holds
a LISTEN connection to the rendezvous server under `name`; a consumer on another endpoint
CALLs that name, both join the fresh 2-rank group the server makes, punch a TCP channel
through their NATs (or relay through the server when they cannot), and the consumer asks
for (store, key, capability, its user). The object server checks the capability with the
store's secret and that the user is the owner or a reader, then sends the bytes (one
zero-copy message from an mmap of the file) or an error frame naming the reason. No third
party ever stores the data. Channels are kept per process and reused (`CHANNEL_REUSE_S`).

A process on the producer's endpoint reads and writes the directory itself, without a
channel: one whose SKYFN_ENDPOINT_ID (the agent sets it for its workers) is the connector's
`endpoint_id`; a process of another endpoint (another SKYFN_ENDPOINT_ID) always pulls; a
process outside any endpoint (the SDK) is local when it can write the directory (on the
agent's machine), else it pulls. `local=True`/`False` overrides that (not in `config()`).

`config()` carries no secret. The rendezvous token for `name` is minted from the
rendezvous secret in the environment variable named by `secret_env` (default
SKYFN_RENDEZVOUS_SECRET) or the file `secret_file`, else taken from `token_env` (default
SKYFN_DIRECT_TOKEN) or `token_file` (a token is made for one name).

The channel protocol (requests, replies, tags) is skyfn/protocol/objects.py, which the
object server speaks too. This connector only moves bytes: the store (skyfn/data/store.py)
checks capabilities, decodes and caches, also for refs of stores this process does not know.
"""
from __future__ import annotations

import atexit
import json
import mmap
import os
import tempfile
import threading
import time
from typing import Any, ClassVar, Optional, Sequence

from skyfn.data import context
from skyfn.data.connectors.base import KEY_CHARS
from skyfn.data.errors import DataConfigError, DataError, RefAccessDenied, RefResolutionError
from skyfn.protocol.objects import PROTOCOL_VERSION, SECRET_ENV, TAG_DATA, TAG_REPLY, TAG_REQUEST, TOKEN_ENV

CHANNEL_REUSE_S = 100.0       # a consumer reuses an idle channel this long (servers close after 120 s idle)
MAX_IDLE_CHANNELS = 4         # idle channels kept per object server and process


def default_directory(name: str) -> str:
    """Memory-backed (/dev/shm) when this machine has it, else the temporary directory."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return os.path.join(base, f"skyfn-direct-{safe}")


def rendezvous_token(name: str, token_env: str = TOKEN_ENV, token_file: Optional[str] = None,
                     secret_env: str = SECRET_ENV, secret_file: Optional[str] = None) -> str:
    """The group token that admits LISTEN / CALL of `name`: minted from the rendezvous secret
    when this process has it (`secret_env`, `secret_file`: it admits any name), else a token
    made for this name (`token_env`, `token_file`)."""
    problems = []

    def read(path: Optional[str], what: str) -> Optional[str]:
        if not path:
            return None
        try:
            with open(os.path.expanduser(path)) as f:
                return f.read().strip() or None
        except OSError as exc:
            problems.append(f"cannot read {what} {path}: {exc.strerror}")
            return None

    secret = (os.environ.get(secret_env) if secret_env else None) or read(secret_file, "secret_file")
    if secret:
        from rendezvous.tokens import make_token

        return make_token(secret, name)
    token = (os.environ.get(token_env) if token_env else None) or read(token_file, "token_file")
    if token:
        return token
    raise DataConfigError(f"direct connector {name!r} has no rendezvous token: set {secret_env} (or secret_file) to "
                          f"the rendezvous server's secret, or set {token_env} to rendezvous.make_token(secret, "
                          f"{name!r}) (or name a token_file)" + (f" ({'; '.join(problems)})" if problems else ""))


def object_path(directory: str, key: str) -> str:
    """Where `key` lives in the directory (the file connector's layout; `.ttl` beside it)."""
    if not isinstance(key, str) or not key or not set(key) <= KEY_CHARS or key.startswith("."):
        raise ValueError(f"key {key!r} is not a plain name (letters, digits, '-', '_', '.')")
    return os.path.join(directory, key)


def expiry_of(path: str) -> Optional[float]:
    try:
        with open(path + ".ttl") as f:
            return float(f.read())
    except (FileNotFoundError, ValueError):
        return None


def map_object(path: str, writable: bool = False):
    """The bytes of the object file at `path` without reading them: an mmap (copy-on-write when
    `writable`), b"" for an empty file; None when there is no such file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return bytearray() if writable else b""
        return mmap.mmap(fd, size, access=mmap.ACCESS_COPY if writable else mmap.ACCESS_READ)
    finally:
        os.close(fd)


# ---- consumer side: channels to object servers, kept per process -------------------------

class _Channel:
    __slots__ = ("comm", "used")

    def __init__(self, comm):
        self.comm = comm
        self.used = time.monotonic()


_idle: dict[tuple[str, str], list[_Channel]] = {}
_idle_lock = threading.Lock()
_idle_pid = os.getpid()


def _take(key: tuple[str, str]) -> Optional[_Channel]:
    global _idle_pid
    with _idle_lock:
        if _idle_pid != os.getpid():      # forked: the parent's channels are not ours
            _idle.clear()
            _idle_pid = os.getpid()
        stack = _idle.get(key) or []
        now = time.monotonic()
        while stack:
            ch = stack.pop()
            if now - ch.used < CHANNEL_REUSE_S:
                return ch
            _close_quietly(ch)
    return None


def _give(key: tuple[str, str], ch: _Channel) -> None:
    ch.used = time.monotonic()
    with _idle_lock:
        stack = _idle.setdefault(key, [])
        if len(stack) < MAX_IDLE_CHANNELS:
            stack.append(ch)
            return
    _close_quietly(ch)


def _close_quietly(ch: _Channel) -> None:
    try:
        ch.comm.close()
    except Exception:  # noqa: BLE001 - closing a dead channel
        pass


def channel_stats() -> dict[str, list[dict]]:
    """For diagnostics: per object server name, the comm stats (mode direct|relay, address,
    bytes) of this process's idle channels to it."""
    with _idle_lock:
        snapshot = {name: list(stack) for (_, name), stack in _idle.items()} if _idle_pid == os.getpid() else {}
    return {name: [dict(ch.comm.stats()[0]) for ch in stack] for name, stack in snapshot.items()}


@atexit.register
def close_channels() -> None:
    """Close every idle channel of this process (also run at exit)."""
    with _idle_lock:
        stacks = list(_idle.values()) if _idle_pid == os.getpid() else []
        _idle.clear()
    for stack in stacks:
        for ch in stack:
            _close_quietly(ch)


class DirectConnector:
    """See the module docstring."""

    kind: ClassVar[str] = "direct"

    def __init__(self, rendezvous: str, name: str, directory: Optional[str] = None, *,
                 endpoint_id: Optional[str] = None, token_env: str = TOKEN_ENV, token_file: Optional[str] = None,
                 secret_env: str = SECRET_ENV, secret_file: Optional[str] = None, timeout: float = 120.0,
                 punch_timeout: float = 3.0, local: Optional[bool] = None):
        from rendezvous.client import parse_address
        from rendezvous.protocol import MAX_NAME
        from rendezvous.tokens import GROUP_RE

        if not isinstance(name, str) or len(name) > MAX_NAME or not GROUP_RE.fullmatch(name):
            raise DataConfigError(f"direct connector: name {name!r} is not a listener name: use 1-{MAX_NAME} "
                                  "characters of A-Z a-z 0-9 . _ : @ -")
        try:
            parse_address(rendezvous)
        except (ValueError, AttributeError):
            raise DataConfigError(f"direct connector {name!r}: rendezvous {rendezvous!r} is not 'host:port' "
                                  "(the rendezvous server the object server listens at)") from None
        if not timeout or float(timeout) <= 0 or not punch_timeout or float(punch_timeout) <= 0:
            raise DataConfigError(f"direct connector {name!r}: timeout and punch_timeout must be > 0 seconds")
        self.rendezvous, self.name = rendezvous, name
        self.directory = os.path.abspath(os.path.expanduser(directory or default_directory(name)))
        self.endpoint_id = endpoint_id
        self.token_env, self.token_file = token_env, token_file
        self.secret_env, self.secret_file = secret_env, secret_file
        self.timeout, self.punch_timeout = float(timeout), float(punch_timeout)
        self._local = local
        self._files = None

    def __repr__(self) -> str:
        return f"DirectConnector({self.name!r} at {self.rendezvous}, {'local' if self.local else 'remote'})"

    # ---- where am I ---------------------------------------------------------------------

    @property
    def local(self) -> bool:
        """True on the producer's endpoint (see the module docstring)."""
        if self._local is not None:
            return self._local
        here = context.endpoint_id()
        if self.endpoint_id and here:
            return here == self.endpoint_id
        return os.path.isdir(self.directory) and os.access(self.directory, os.W_OK | os.X_OK)

    def _local_files(self):
        if self._files is None:
            if not self.local:
                raise DataError(f"direct store {self.name!r}: put/evict run on the producer's endpoint "
                                f"({self.endpoint_id or 'the host of ' + self.directory}), where its object server "
                                "keeps the bytes; this process reads them through the object server")
            from skyfn.data.connectors.file import FileConnector

            self._files = FileConnector(self.directory)
        return self._files

    # ---- the Connector protocol ---------------------------------------------------------------

    def put(self, key: str, frames: Sequence, ttl: Optional[float] = None) -> None:
        self._local_files().put(key, frames, ttl=ttl)

    def get(self, key: str) -> Optional[Any]:
        """Local: the bytes (copy-on-write mmap) or None. Elsewhere a ref is needed: the object
        server serves only to a capability (Store.resolve passes it through get_for)."""
        if self.local:
            return self._read_local(key)
        raise DataError(f"direct store {self.name!r}: reading key {key!r} from another endpoint needs its ref "
                        "(resolve the Ref, or store.resolve(ref_info(ref))): the object server serves only "
                        "to a signed capability")

    def get_for(self, info, user: Optional[str]) -> Optional[Any]:
        """The bytes of `info` (a RefInfo) for `user`: read here on the producer's endpoint,
        else pulled from its object server, which checks the capability and the user
        (RefAccessDenied / RefResolutionError naming the ref, the store and the reason)."""
        if self.local:
            data = self._read_local(info.key)
            if data is not None and info.evict:
                self.evict(info.key)
            return data
        head, data = self._request({"op": "get", "store": info.store, "key": info.key, "cap": info.capability,
                                    "user": user, "evict": bool(info.evict)}, info.store, info.key)
        return data

    def evict_for(self, info, user: Optional[str]) -> bool:
        """Evict the object of `info` (a RefInfo) as `user`: here on the producer's endpoint,
        else through its object server, which allows only the ref's owner. True if it was there."""
        if self.local:
            existed = self._local_files().exists(info.key)
            self.evict(info.key)
            return existed
        head, _ = self._request({"op": "evict", "store": info.store, "key": info.key, "cap": info.capability,
                                 "user": user}, info.store, info.key)
        return bool(head.get("evicted"))

    def exists(self, key: str) -> bool:
        if self.local:
            return self._local_files().exists(key)
        head, _ = self._request({"op": "exists", "key": key}, "?", key)
        return bool(head.get("exists"))

    def evict(self, key: str) -> None:
        """On the producer's endpoint; elsewhere a no-op (a ref made with evict=True is
        evicted by the object server when it serves it)."""
        if self.local:
            self._local_files().evict(key)

    def sweep(self) -> int:
        """Remove expired objects of the local directory; returns how many."""
        return self._local_files().sweep() if self.local else 0

    def config(self) -> dict:
        cfg = {"kind": self.kind, "rendezvous": self.rendezvous, "name": self.name, "directory": self.directory}
        if self.endpoint_id:
            cfg["endpoint_id"] = self.endpoint_id
        for k, default in (("token_env", TOKEN_ENV), ("token_file", None), ("secret_env", SECRET_ENV),
                           ("secret_file", None), ("timeout", 120.0), ("punch_timeout", 3.0)):
            if getattr(self, k) != default:
                cfg[k] = getattr(self, k)
        return cfg

    @classmethod
    def from_config(cls, config: dict) -> "DirectConnector":
        config = {k: v for k, v in config.items() if k != "kind"}
        try:
            rendezvous, name = config.pop("rendezvous"), config.pop("name")
        except KeyError as exc:
            raise DataConfigError(f"a direct connector config needs {exc.args[0]!r} (rendezvous 'host:port' and "
                                  "the object server's listener name)") from None
        try:
            return cls(rendezvous, name, **config)
        except TypeError as exc:
            raise DataConfigError(f"direct connector {name!r}: {exc} (allowed keys: rendezvous, name, directory, "
                                  "endpoint_id, token_env, token_file, secret_env, secret_file, timeout, "
                                  "punch_timeout)") from None

    def close(self) -> None:
        pass

    # ---- internals ------------------------------------------------------------------------------

    def _read_local(self, key: str):
        path = object_path(self.directory, key)
        expires = expiry_of(path)
        if expires is not None and time.time() > expires:
            self.evict(key)
            return None
        return map_object(path, writable=True)

    def _open(self, store: str, key: str) -> _Channel:
        from comm import Communicator
        from comm.errors import CommError
        from rendezvous import client
        from rendezvous.client import RendezvousError

        where = f"the object server {self.name!r} (rendezvous {self.rendezvous})"
        try:
            token = rendezvous_token(self.name, self.token_env, self.token_file, self.secret_env, self.secret_file)
            group, group_token = client.call(self.rendezvous, self.name, token, timeout=min(self.timeout, 30.0))
        except DataConfigError as exc:
            raise RefResolutionError(store, key, str(exc)) from None
        except RendezvousError as exc:
            hint = {"no_listener": "is it running? (the producer endpoint's agent starts it with `data: direct:`)",
                    "bad_token": f"the token for {self.name!r} was made with another secret or for another name "
                                 f"(a token admits one name; {self.secret_env} admits any)",
                    "expired_token": f"the token for {self.name!r} expired: mint a new one"}.get(exc.code, "")
            raise RefResolutionError(store, key, f"cannot reach {where}: {exc.code}: {exc.reason} {hint}".strip()) \
                from None
        except OSError as exc:
            raise RefResolutionError(store, key, f"cannot reach the rendezvous server {self.rendezvous} to call "
                                     f"{self.name!r}: {exc}") from None
        try:
            comm = Communicator.join(group, self.rendezvous, group_token, 2, rank=1, timeout=self.timeout,
                                     punch_timeout=self.punch_timeout)
        except CommError as exc:
            raise RefResolutionError(store, key, f"no channel to {where}: {exc}") from None
        return _Channel(comm)

    def _request(self, request: dict, store: str, key: str) -> tuple[dict, Any]:
        from comm.errors import CommError

        pool_key = (self.rendezvous, self.name)
        body = json.dumps({"v": PROTOCOL_VERSION, **request}).encode()
        for attempt in (0, 1):
            ch = _take(pool_key) if attempt == 0 else None
            fresh = ch is None
            if fresh:
                ch = self._open(store, key)
            try:
                ch.comm.send(body, 0, TAG_REQUEST)
                head = json.loads(bytes(ch.comm.recv(0, TAG_REPLY)))
                data = ch.comm.recv(0, TAG_DATA) if head.get("ok") and request["op"] == "get" else None
            except CommError as exc:
                _close_quietly(ch)
                if fresh:
                    raise RefResolutionError(store, key, f"the channel to the object server {self.name!r} failed: "
                                             f"{exc}") from None
                continue                       # an idle channel the server had closed: once more, fresh
            if head.get("code") == "busy":
                _close_quietly(ch)                     # the server closes it too: not worth keeping
            else:
                _give(pool_key, ch)
            if not head.get("ok"):
                reason = head.get("reason") or head.get("code") or "refused"
                if head.get("code") == "denied":
                    raise RefAccessDenied(store, key, reason)
                raise RefResolutionError(store, key, reason)
            return head, data
        raise AssertionError("unreachable")

