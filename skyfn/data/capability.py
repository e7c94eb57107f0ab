"""Capabilities: who may resolve a ref, signed so that holding a ref is not enough.

A capability names the ref's owner, the users it is shared with and when it expires,
and carries an HMAC-SHA256 over (store, key, those fields) made with the store's secret.
Only holders of the store's secret (the endpoint's agent and workers, the SDK that put the
object) can make one; it is checked where the bytes are served (the resolver of a worker,
the direct connector's object server) against the user whose task asks: a ref that leaks
into another user's task is refused there with a clear error.

The right to *evict* is the owner's. A ref made with `evict=True` (use once) carries, signed,
that whoever it lets resolve it also removes it as they do (`x`); without it only the owner's
own resolve or evict removes the object, so a reader that sets `evict` on its copy of a ref
removes nothing (every place that serves bytes checks `Capability.may_evict`).

Format: "<base64url(JSON {o, r, e[, x]})>.<base64url(mac)>" -- a few dozen bytes in the ref.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from typing import Iterable, Optional


@dataclass(frozen=True)
class Capability:
    owner: str
    readers: tuple[str, ...]
    expires: Optional[float]
    evict: bool = False  # the owner made it use-once: resolving it (by anyone it allows) removes it

    def allows(self, user: Optional[str]) -> bool:
        return user is not None and (user == self.owner or user in self.readers)

    def may_evict(self, user: Optional[str]) -> bool:
        """Whether `user`'s resolve may remove the object: its owner, or anyone it allows when
        the owner made it use-once."""
        return user is not None and (user == self.owner or (self.evict and self.allows(user)))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: bytes, store: str, key: str, body: str) -> bytes:
    return hmac.new(secret, f"{store}\n{key}\n{body}".encode(), hashlib.sha256).digest()


def sign(secret: bytes, store: str, key: str, owner: str, readers: Iterable[str] = (),
         expires: Optional[float] = None, evict: bool = False) -> str:
    fields: dict = {"o": owner, "r": sorted(set(readers)), "e": expires}
    if evict:
        fields["x"] = True
    body = _b64(json.dumps(fields, separators=(",", ":")).encode())
    return f"{body}.{_b64(_mac(secret, store, key, body))}"


def verify(secret: bytes, store: str, key: str, token: str, now: Optional[float] = None) -> Capability:
    """The capability if `token` is genuine for (store, key); ValueError saying why not."""
    try:
        body, mac = token.split(".", 1)
        given = _unb64(mac)
    except (ValueError, AttributeError) as exc:
        raise ValueError("the ref's capability is malformed") from exc
    if not hmac.compare_digest(given, _mac(secret, store, key, body)):
        raise ValueError("the ref's capability was not signed by this store (forged, altered, or made for "
                         "another store or key)")
    fields = json.loads(_unb64(body))
    cap = Capability(owner=fields["o"], readers=tuple(fields.get("r") or ()), expires=fields.get("e"),
                     evict=fields.get("x") is True)
    if cap.expires is not None and (now if now is not None else time.time()) > cap.expires:
        raise ValueError(f"the ref expired at {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(cap.expires))}")
    return cap


def peek(token: str) -> Capability:
    """The fields of a capability without checking it (for messages and placement only)."""
    fields = json.loads(_unb64(token.split(".", 1)[0]))
    return Capability(owner=fields["o"], readers=tuple(fields.get("r") or ()), expires=fields.get("e"),
                      evict=fields.get("x") is True)
