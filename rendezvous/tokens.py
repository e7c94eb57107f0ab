"""Group tokens: HMAC-SHA256 signatures that let a peer join one group until an expiry.

Format (docs/comm.md): "<expiry_unix_int>.<hex hmac-sha256(secret, f'{group}\\n{expiry}')>".
A call token (`make_call_token`) admits one caller's CALL of one listener name: the
signed text is f'{name}\\n{caller}\\n{expiry}' (no group id holds a newline, so neither kind
of token passes for the other).
The service mints them with the rendezvous secret; the server checks them with
`verify_token`. Tokens and secrets are never logged.
"""
from __future__ import annotations

import hmac
import re
import time
from typing import Optional, Union

GROUP_RE = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
_TOKEN_RE = re.compile(r"([0-9]{1,12})\.([0-9a-f]{64})")


class TokenError(Exception):
    """A token that does not admit its holder; `code` is the wire error code."""

    def __init__(self, code: str, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _key(secret: Union[str, bytes]) -> bytes:
    if isinstance(secret, str):
        secret = secret.encode()
    if not secret:
        raise ValueError("the rendezvous secret is empty: pass a non-empty --secret "
                         "(or set SKYFN_RENDEZVOUS_SECRET)")
    return secret


def _signature(key: bytes, group: str, expiry: int) -> str:
    return hmac.digest(key, f"{group}\n{expiry}".encode(), "sha256").hex()   # one-shot C path


def make_token(secret: Union[str, bytes], group: str, ttl_s: float = 3600,
               now: Optional[float] = None) -> str:
    """A token admitting peers to `group` for `ttl_s` seconds from `now` (default: time.time())."""
    if not isinstance(group, str) or not GROUP_RE.fullmatch(group):
        raise ValueError(f"invalid group id {group!r}: use 1-128 characters of A-Z a-z 0-9 . _ : @ -")
    expiry = int((time.time() if now is None else now) + ttl_s)
    return f"{expiry}.{_signature(_key(secret), group, expiry)}"


def verify_token(secret: Union[str, bytes], group: str, token: str,
                 now: Optional[float] = None) -> None:
    """Return if `token` admits a peer to `group` now; raise TokenError(bad_token|expired_token)."""
    m = _TOKEN_RE.fullmatch(token)
    if m is None:
        raise TokenError("bad_token", "token is not '<expiry>.<64 hex digits>'; mint it with "
                                      "rendezvous.make_token(secret, group)")
    expiry = int(m.group(1))
    if not hmac.compare_digest(_signature(_key(secret), group, expiry), m.group(2)):
        raise TokenError("bad_token", "token signature does not match this group and server secret")
    if expiry < (time.time() if now is None else now):
        raise TokenError("expired_token", "token expired; mint a new one for this group")


def make_call_token(secret: Union[str, bytes], name: str, caller: str, ttl_s: float = 900,
                    now: Optional[float] = None) -> str:
    """A token admitting `caller` (one direct session: skyfn.protocol.direct_path) to CALL the
    listener `name` for `ttl_s` seconds; the server hands `caller` on to the listener."""
    for what, value in (("listener name", name), ("caller", caller)):
        if not isinstance(value, str) or not GROUP_RE.fullmatch(value):
            raise ValueError(f"invalid {what} {value!r}: use 1-128 characters of A-Z a-z 0-9 . _ : @ -")
    expiry = int((time.time() if now is None else now) + ttl_s)
    return f"{expiry}.{_signature(_key(secret), _call_text(name, caller), expiry)}"


def _call_text(name: str, caller: str) -> str:
    return f"{name}\n{caller}"


def verify_call_token(secret: Union[str, bytes], name: str, caller: str, token: str,
                      now: Optional[float] = None) -> None:
    """Return if `token` admits `caller` to CALL `name` now; raise TokenError(bad_token|expired_token)."""
    m = _TOKEN_RE.fullmatch(token)
    if m is None:
        raise TokenError("bad_token", "call token is not '<expiry>.<64 hex digits>'")
    expiry = int(m.group(1))
    if not hmac.compare_digest(_signature(_key(secret), _call_text(name, caller), expiry), m.group(2)):
        raise TokenError("bad_token", f"call token was not made for caller {caller} of listener {name} "
                                      "(another session, user or endpoint, or another server secret)")
    if expiry < (time.time() if now is None else now):
        raise TokenError("expired_token", "call token expired; open a new session")
