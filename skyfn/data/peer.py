"""The consumer's side of the peer-ref channel: resolve a ref another account on this host
shared with us, through that account's peer-ref broker (DESIGN.md section 12; the wire
contract and the directory layout are skyfn/protocol/peer_refs.py).

On a multi-user endpoint each user agent has its own stores, unreadable by other accounts.
When a task resolves a ref whose store this process does not know, and SKYFN_PEER_REFS_DIR
holds a socket for that store, skyfn.data.store.resolve_ref fetches the bytes here: the
broker (endpoint_agent/data/ref_broker.py) checks the capability with the store's secret
against the skyfn users of *our uid* (the kernel tells it, SO_PEERCRED), and refuses with a
reason (RefAccessDenied: not shared with you, forged, expired; RefResolutionError: no such
object).

Before trusting a broker this side checks, again with SO_PEERCRED, that the process serving
the socket runs as the uid that owns the account directory the socket is in, and that this
uid runs the ref's owner (SKYFN_PEER_IDENTITIES, kept by root): another account can neither
put a socket into the owner's directory (0755, the owner's) nor pass one in its own directory
off as the owner's store. Capabilities are never logged.

Also shared with the broker: `Identities` (the uid -> skyfn users file, re-read when it
changes), `peer_uid` and the line/bytes readers.
"""
from __future__ import annotations

import errno
import glob
import json
import os
import socket
import stat
import struct
import threading
import time
from typing import Any, Optional

from skyfn.data import capability
from skyfn.data.errors import RefAccessDenied, RefResolutionError
from skyfn.protocol.peer_refs import (MAX_HEADER_BYTES, PEER_IDENTITIES_ENV, PEER_REFS_DIR_ENV, PROTOCOL_VERSION,
                                      encode_line, parse_identities, socket_name)

TIMEOUT_S = 60.0         # per connect, send and receive: a broker silent for this long is given up on
BUSY_RETRIES = 6         # a busy broker is asked again this many times, backing off from 50 ms


# ---- shared with the broker -------------------------------------------------------------------

def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket (the kernel's word:
    the credentials it recorded at connect() or listen())."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return uid


class LineReader:
    """Reads newline-ended header lines and exact byte counts from a socket (its timeout applies)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray()

    def line(self) -> Optional[bytes]:
        """The next line without its newline; None when the other end closed before sending one."""
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                line = bytes(self.buf[:end])
                del self.buf[:end + 1]
                return line
            if len(self.buf) >= MAX_HEADER_BYTES:
                raise ValueError(f"a header line longer than {MAX_HEADER_BYTES} bytes")
            chunk = self.sock.recv(65536)
            if not chunk:
                if self.buf:
                    raise ConnectionError("the connection closed in the middle of a header line")
                return None
            self.buf += chunk

    def exactly(self, size: int) -> bytearray:
        """`size` bytes (a writable buffer: arrays decoded from it are writable views)."""
        out = bytearray(size)
        view = memoryview(out)
        have = min(len(self.buf), size)
        view[:have] = self.buf[:have]
        del self.buf[:have]
        while have < size:
            n = self.sock.recv_into(view[have:], min(size - have, 8 << 20))
            if n == 0:
                raise ConnectionError(f"the connection closed after {have} of {size} bytes")
            have += n
        return out


class Identities:
    """The SKYFN_PEER_IDENTITIES file: which skyfn users run as which uid. Re-read when it
    changes (mtime, size or inode). It decides who may read what, so it must belong to root
    (or to this process's own uid) and be writable by its owner only."""

    def __init__(self, path: str):
        self.path = path
        self._seen: Optional[tuple] = None
        self._map: dict[int, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def _load(self) -> dict[int, tuple[str, ...]]:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise ValueError(f"the peer identities file {self.path} ({PEER_IDENTITIES_ENV}) cannot be read: "
                             f"{exc.strerror}; the multi-user endpoint keeps it (root's, 0640, readable by its user agents' "
                             "group peer_gid)") from None
        sig = (st.st_mtime_ns, st.st_size, st.st_ino, st.st_uid, st.st_mode)
        with self._lock:
            if sig == self._seen:
                return self._map
        if st.st_uid not in (0, os.geteuid()):
            raise ValueError(f"the peer identities file {self.path} belongs to uid {st.st_uid}, not to root: it is "
                             f"not trusted (chown root {self.path})")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ValueError(f"the peer identities file {self.path} is writable by group or others (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}): it is not trusted (chmod 0644 {self.path})")
        try:
            with open(self.path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            raise ValueError(f"the peer identities file {self.path} cannot be read as JSON: {exc}") from None
        mapping = parse_identities(doc, f"the peer identities file {self.path}")
        with self._lock:
            self._seen, self._map = sig, mapping
        return mapping

    def users_of(self, uid: int) -> tuple[str, ...]:
        """The skyfn user ids that run as `uid` (none: the uid runs no skyfn user here)."""
        return self._load().get(uid, ())


_identities: dict[str, Identities] = {}
_identities_lock = threading.Lock()


def identities(path: Optional[str] = None) -> Identities:
    """The (cached) reader of the identities file at `path` or SKYFN_PEER_IDENTITIES."""
    path = path or os.environ.get(PEER_IDENTITIES_ENV)
    if not path:
        raise ValueError(f"{PEER_IDENTITIES_ENV} is not set: the multi-user endpoint sets it to the file that maps "
                         "uids to skyfn users")
    with _identities_lock:
        reader = _identities.get(path)
        if reader is None:
            reader = _identities[path] = Identities(path)
        return reader


# ---- the consumer ---------------------------------------------------------------------------------

def candidates(store: str) -> list[str]:
    """The sockets for `store` under SKYFN_PEER_REFS_DIR (any account's directory), or none."""
    directory = os.environ.get(PEER_REFS_DIR_ENV)
    if not directory:
        return []
    return sorted(glob.glob(os.path.join(glob.escape(directory), "*", socket_name(store))))


def serves(store: str) -> bool:
    """Some account's broker on this host has (or had) a socket for `store`."""
    return bool(candidates(store))


class _Refused(Exception):
    """A socket whose server this side does not trust (or cannot reach); the reason says which."""


def _connect(path: str, owner: str) -> socket.socket:
    """A connection to the broker at `path`, once its server is checked: it runs as the uid
    that owns the account directory the socket is in, and that uid runs `owner`."""
    account_dir = os.path.dirname(path)
    account = os.path.basename(account_dir)
    try:
        st = os.lstat(account_dir)
    except OSError as exc:
        raise _Refused(f"{account_dir}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise _Refused(f"{account_dir} is not a directory (a symlink or a file): not an account's directory")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(TIMEOUT_S)
    try:
        sock.connect(path)
        uid = peer_uid(sock)
        if uid != st.st_uid:
            raise _Refused(f"the socket {path} is served by uid {uid}, but the account directory {account_dir} "
                           f"belongs to uid {st.st_uid}: not trusted (a squatter)")
        users = identities().users_of(uid)
        if owner not in users:
            runs = f"runs {', '.join(users)}" if users else "runs no skyfn user"
            raise _Refused(f"the socket {path} is served by uid {uid} (account directory {account}), which {runs} "
                           f"on this host, not the ref's owner {owner}: not trusted (another account's socket under "
                           "this store's name)")
        return sock
    except _Refused:
        sock.close()
        raise
    except ValueError as exc:                       # the identities file
        sock.close()
        raise _Refused(str(exc)) from None
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            raise _Refused(f"no broker listens on {path} (its account's user agent is not running)") from None
        raise _Refused(f"{path}: {exc}") from None


def _request(info, request: dict) -> tuple[dict, Any]:
    """(reply, bytes or None) of one request to the broker of `info`'s store."""
    try:
        owner = capability.peek(info.capability).owner
    except (ValueError, KeyError, TypeError, AttributeError):
        raise RefResolutionError(info.store, info.key, "the ref's capability is malformed") from None
    paths = candidates(info.store)
    if not paths:
        raise RefResolutionError(info.store, info.key, f"store {info.store!r} is not known in this process and no "
                                 f"account's peer-ref broker serves it on this host ({PEER_REFS_DIR_ENV}): its "
                                 "owner's user agent is not running here")
    line = encode_line({"v": PROTOCOL_VERSION, **request})
    refused: list[str] = []
    delay = 0.05
    for attempt in range(BUSY_RETRIES + 1):
        busy = None
        for path in paths:
            try:
                sock = _connect(path, owner)
            except _Refused as exc:
                if str(exc) not in refused:
                    refused.append(str(exc))
                continue
            try:
                sock.sendall(line)
                reader = LineReader(sock)
                raw = reader.line()
                if raw is None:
                    raise ConnectionError("the broker closed the connection without a reply")
                head = json.loads(raw)
                data = reader.exactly(int(head["size"])) if head.get("ok") and request["op"] == "get" else None
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise RefResolutionError(info.store, info.key, f"the peer-ref broker at {path} failed: "
                                         f"{type(exc).__name__}: {exc}") from None
            finally:
                sock.close()
            if head.get("ok"):
                return head, data
            code, reason = head.get("code"), head.get("reason") or head.get("code") or "refused"
            if code == "busy":
                busy = reason
                break
            if code == "denied":
                raise RefAccessDenied(info.store, info.key, reason)
            raise RefResolutionError(info.store, info.key, reason)
        if busy is None:
            break
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
    else:
        raise RefResolutionError(info.store, info.key, f"{busy} (asked {BUSY_RETRIES + 1} times)")
    raise RefResolutionError(info.store, info.key, "no trusted peer-ref broker serves it on this host: "
                             + "; ".join(refused))


def fetch(info) -> Any:
    """The bytes of the ref `info` (a RefInfo) from its owner's broker on this host, as a
    writable buffer (decode with skyfn.data.codec); RefAccessDenied / RefResolutionError with
    the broker's reason. A ref made with evict=True is evicted by the broker as it serves it."""
    _, data = _request(info, {"op": "get", "store": info.store, "key": info.key, "cap": info.capability,
                              "evict": bool(info.evict)})
    return data


def exists(info) -> bool:
    """Whether the object of the ref `info` is still there, asked of its owner's broker (which
    answers only a reader the capability allows)."""
    head, _ = _request(info, {"op": "exists", "store": info.store, "key": info.key, "cap": info.capability})
    return bool(head.get("exists"))
