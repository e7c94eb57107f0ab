"""Sealed result packs: how the service knows which endpoint sent a ResultPack.

Every agent's results travel through one results queue (a Redis stream every queue login
may add to, or the SQS results queue every agent session may send to), so the queue cannot
say who sent an entry, and the pack's own `endpoint_id` is whatever the sender wrote. An
endpoint's agent therefore *seals* each pack body with a MAC under its endpoint's results
key, and the service applies a pack only as the endpoint whose key checks out, whatever
the body names (lambdas/core/identity/result_seals.py).

- The results key is derived from the endpoint credential (skyfn.protocol.credentials):
  HMAC-SHA256 keyed by SHA-256 of the credential's secret (the hash the service keeps of
  it, and no queue login can read) over a fixed label. The agent computes it from its
  credential; an agent that registers behind a user authorizer (no credential handed out)
  gets it in its registration answer (EndpointRegistered.results_key). Rotating the
  credential rotates the key.
- The sealed form is one header line, then the pack body unchanged (no second JSON
  encoding of results): ``skyfn-seal 1 <endpoint id> <hex MAC>\\n<body>``; the MAC covers
  the endpoint id and the body.
- A lane's user agent seals with its lane's key instead (skyfn.protocol.lanes). A pack
  sealed by neither is refused.
"""
from __future__ import annotations

import hashlib
import hmac
import re
from typing import Optional

HEAD = b"skyfn-seal 1 "
_LABEL = b"skyfn results key v1"
_LINE = re.compile(rb"skyfn-seal 1 ([A-Za-z0-9-]{1,64}) ([0-9a-f]{64})")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def results_key(secret_digest: str) -> str:
    """The results key (hex) of an endpoint whose credential's secret has SHA-256 `secret_digest` (hex)."""
    if not _HEX64.fullmatch(secret_digest or ""):
        raise ValueError("a credential digest is 64 lowercase hex digits")
    return hmac.new(bytes.fromhex(secret_digest), _LABEL, hashlib.sha256).hexdigest()


def key_of_credential(credential: str) -> Optional[str]:
    """The results key of an endpoint credential (`skyfn-agent.<id>.<secret>`), None if malformed."""
    from skyfn.protocol.credentials import parse

    parsed = parse(credential)
    if parsed is None:
        return None
    return results_key(hashlib.sha256(parsed[1].encode()).hexdigest())


def _mac(key: str, endpoint_id: str, body: bytes) -> str:
    return hmac.new(bytes.fromhex(key), endpoint_id.encode() + b"\n" + body, hashlib.sha256).hexdigest()


def seal(endpoint_id: str, key: str, body: bytes) -> bytes:
    """The sealed form of a ResultPack body sent by `endpoint_id`'s agent."""
    return HEAD + f"{endpoint_id} {_mac(key, endpoint_id, body)}\n".encode() + body


def is_sealed(raw: bytes | str) -> bool:
    head = raw[:len(HEAD)]
    return (head if isinstance(head, bytes) else head.encode()) == HEAD


def open_sealed(raw: bytes | str) -> Optional[tuple[str, str, bytes]]:
    """(endpoint id, MAC, body) of a sealed pack, or None when it is not well formed."""
    data = raw if isinstance(raw, bytes) else raw.encode()
    line, nl, body = data.partition(b"\n")
    m = _LINE.fullmatch(line)
    if not nl or m is None:
        return None
    return m.group(1).decode(), m.group(2).decode(), body


def verify(key: str, endpoint_id: str, body: bytes, mac: str) -> bool:
    return hmac.compare_digest(_mac(key, endpoint_id, body), mac)
