"""The peer-ref channel's wire contract: how a task on a multi-user endpoint resolves a ref
another account's user agent shared with it, on the same host (DESIGN.md sections 6 and 12).

Each user agent of a multi-user endpoint has its own data plane (its own redis-server, its
password in the account's own 0600 file), so another account cannot read its stores at all.
A ref the owner shares (its signed capability names the reader) resolves instead through the
owner's *peer-ref broker* (endpoint_agent/data/ref_broker.py), which the consumer's SDK
(skyfn/data/peer.py) reaches over a Unix socket:

  <SKYFN_PEER_REFS_DIR>/<account>/<socket_name(store)>     socket_name = sha256(store)[:24] hex + ".sock"

SKYFN_PEER_REFS_DIR: a directory the multi-user endpoint's root process creates (root's,
0755) with one subdirectory per account (that account's, 0755, made by the root process):
only the account's broker can bind a socket there. SKYFN_PEER_IDENTITIES: a JSON file the
root process keeps (root's, 0644), {"<uid>": ["<skyfn user id>", ...]}: which skyfn users
run as which uid. Both sides trust the kernel, not the request: the broker takes the asking
user from the connecting process's uid (SO_PEERCRED) through that file, and the consumer
checks the broker's uid owns the account directory and runs the ref's owner.

One request per exchange, on a connection that may carry several in turn:
  consumer -> broker  one JSON line: {"v": 1, "op": "get"|"exists", "store", "key", "cap", "evict": bool}
  broker -> consumer  one JSON line: {"ok": true, "size": n} then exactly n bytes (the object, "get")
                                     | {"ok": true, "exists": bool} ("exists")
                                     | {"ok": false, "code": "denied"|"missing"|"invalid"|"busy"|"failed",
                                        "reason": ...}

"evict" asks the broker to remove the object as it serves it; it does so only when the signed
capability grants it (skyfn.data.capability: the owner, or any reader of a ref its owner made
use-once), else it serves and keeps the object.

"denied": the capability does not let the connecting uid's users read it (not shared,
forged, expired); "missing": no such object; "invalid": a malformed request, another
protocol version or a store the broker does not serve; "busy": the broker serves as many
connections as it may (retry); "failed": the broker could not read its own store (its Redis
is down). A header line is at most MAX_HEADER_BYTES; the broker closes
a connection idle for its timeout.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any

PEER_REFS_DIR_ENV = "SKYFN_PEER_REFS_DIR"        # the directory of the account directories of brokers' sockets
PEER_IDENTITIES_ENV = "SKYFN_PEER_IDENTITIES"    # the root-kept JSON file {"<uid>": ["<skyfn user id>", ...]}
PROTOCOL_VERSION = 1                             # "v" of every request
OPS = ("get", "exists")
ERROR_CODES = ("denied", "missing", "invalid", "busy", "failed")
MAX_HEADER_BYTES = 64 << 10                      # a request or reply line, the newline included
SOCKET_PATH_MAX = 107                            # sockaddr_un.sun_path holds 108 bytes, the NUL included
SOCKET_SUFFIX = ".sock"
HASH_CHARS = 24


def socket_name(store: str) -> str:
    """The file name of the socket that serves `store` (a hash: store names are long, and
    carry characters a file name should not)."""
    return hashlib.sha256(store.encode()).hexdigest()[:HASH_CHARS] + SOCKET_SUFFIX


def socket_path(directory: str, account: str, store: str) -> str:
    """`<directory>/<account>/<socket_name(store)>`; ValueError when it is longer than a Unix
    socket path may be."""
    path = os.path.join(directory, account, socket_name(store))
    if len(path.encode()) > SOCKET_PATH_MAX:
        raise ValueError(f"the peer-ref socket path {path} is {len(path.encode())} bytes, more than the "
                         f"{SOCKET_PATH_MAX} a Unix socket path may have: set {PEER_REFS_DIR_ENV} to a shorter "
                         "directory (e.g. /run/skyfn-peer-refs)")
    return path


def encode_line(doc: dict) -> bytes:
    """A request or reply header: compact JSON and a newline."""
    line = json.dumps(doc, separators=(",", ":")).encode() + b"\n"
    if len(line) > MAX_HEADER_BYTES:
        raise ValueError(f"a peer-ref header line is {len(line)} bytes, more than {MAX_HEADER_BYTES}")
    return line


def refusal(code: str, reason: str) -> dict:
    return {"ok": False, "code": code, "reason": reason}


def parse_identities(doc: Any, where: str) -> dict[int, tuple[str, ...]]:
    """The SKYFN_PEER_IDENTITIES document as {uid: (skyfn user id, ...)}; ValueError naming
    `where` and what is wrong."""
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: expected a JSON object {{\"<uid>\": [\"<skyfn user id>\", ...]}}, got "
                         f"{type(doc).__name__}")
    out: dict[int, tuple[str, ...]] = {}
    for uid, ids in doc.items():
        if not isinstance(uid, str) or not uid.isdigit():
            raise ValueError(f"{where}: key {uid!r} is not a uid (decimal digits)")
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            raise ValueError(f"{where}: the value of uid {uid} must be a list of skyfn user ids (non-empty "
                             "strings)")
        out[int(uid)] = tuple(ids)
    return out


__all__ = ["PEER_REFS_DIR_ENV", "PEER_IDENTITIES_ENV", "PROTOCOL_VERSION", "OPS", "ERROR_CODES", "MAX_HEADER_BYTES",
           "SOCKET_PATH_MAX", "socket_name", "socket_path", "encode_line", "refusal", "parse_identities"]
