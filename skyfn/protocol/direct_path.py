"""Direct sessions reached through the rendezvous server: the contract between the service,
the SDK (skyfn/executor/direct_path.py) and the agent (endpoint_agent/direct/reach.py).

An agent whose direct socket cannot be connected to (behind a NAT or a site firewall;
`direct: {reach: rendezvous}`, or `auto`) holds a LISTEN connection at the rendezvous
server under `listener_name(endpoint_id)`, with a token the service signs for it
(POST /endpoints/{id}/direct/listen, the agent's own credential only). When a session is
opened the service also answers a `PathTicket`: the rendezvous address, the listener
name, the session's `caller` (`caller_of`: its id and its user's hash), a call token
binding both (rendezvous.tokens.make_call_token: the rendezvous server admits this caller
of this listener and nothing else, and tells the agent the caller) and a `path_key`
derived from the agent's session key for (endpoint, caller, expiry).

The SDK CALLs the name, both join the fresh 2-rank group, punch a TCP connection or fall
back to the relay (rendezvous/pair.py: rank 0 the agent, rank 1 the SDK). Before any
session traffic the agent proves nothing and the SDK proves its ticket, without showing
it to the relay:

    agent -> SDK   CHALLENGE   b"SKYD", u32 version, 32 random bytes (the nonce)
    SDK -> agent   PROOF       b"SKYD", u32 version, f64 ticket expiry,
                               hmac-sha256(path_key, b"skyfn-direct-path" + nonce)
    agent -> SDK   b"K"        accepted: the stream is now the session's ZeroMQ connection
                   b"E" u16 n  refused: n bytes of JSON {"code", "reason"}, then close

The agent recomputes the path key from its session key, the endpoint, the caller the
rendezvous server named and the expiry: a ticket for another endpoint, user or session (or
from an agent run whose key is gone) is refused here as well as at the rendezvous server.
From then on the stream carries the same CurveZMQ session as a TCP connection to the
agent's socket would (skyfn/protocol/direct.py): end-to-end encrypted and authenticated
with the key the service published, so a relay sees ciphertext only and a byte it alters
fails CurveZMQ's authentication, which drops the connection (never altered data).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
from typing import Optional

MAGIC = b"SKYD"
VERSION = 1
NONCE_BYTES = 32
CHALLENGE = struct.Struct("<4sI32s")
PROOF = struct.Struct("<4sId32s")
ACCEPTED = b"K"
REFUSED = b"E"
_LABEL = b"skyfn-direct-path"

REFUSE_BAD_TICKET = "bad_ticket"      # not derived from this agent's current key for this caller
REFUSE_EXPIRED = "expired"
REFUSE_MALFORMED = "malformed"
REFUSE_NOT_CALLER = "no_caller"       # the rendezvous server named no caller (a name token's CALL)
REFUSE_BUSY = "busy"                  # the agent serves as many paths as it may

MAX_NAME = 110


def listener_name(endpoint_id: str) -> str:
    """The name an endpoint's agent LISTENs under at the rendezvous server."""
    return f"direct.{endpoint_id}"[:MAX_NAME]


def caller_of(session_id: str, owner: str) -> str:
    """The session's caller string: its id and its user's hash (no user name on the wire)."""
    return f"{session_id}.u-{hashlib.sha256(owner.encode()).hexdigest()[:16]}"


def path_key(session_key: str, endpoint_id: str, caller: str, expires: float) -> str:
    """The key a session's SDK proves its ticket with; the agent derives it again."""
    text = f"skyfn-direct-path\n{endpoint_id}\n{caller}\n{float(expires)!r}".encode()
    return hmac.new(bytes.fromhex(session_key), text, hashlib.sha256).hexdigest()


def challenge() -> tuple[bytes, bytes]:
    """(nonce, the CHALLENGE frame)."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce, CHALLENGE.pack(MAGIC, VERSION, nonce)


def read_challenge(frame: bytes) -> bytes:
    magic, version, nonce = CHALLENGE.unpack(frame)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a skyfn direct path (magic {magic!r}, version {version})")
    return nonce


def proof(key_hex: str, nonce: bytes, expires: float) -> bytes:
    mac = hmac.new(bytes.fromhex(key_hex), _LABEL + nonce, hashlib.sha256).digest()
    return PROOF.pack(MAGIC, VERSION, float(expires), mac)


def check_proof(frame: bytes, nonce: bytes, session_key: str, endpoint_id: str, caller: str,
                now: float) -> Optional[tuple[str, str]]:
    """None when `frame` proves a ticket of `caller` for this endpoint, else (code, reason)."""
    try:
        magic, version, expires, mac = PROOF.unpack(frame)
    except struct.error:
        return REFUSE_MALFORMED, f"the proof is {PROOF.size} bytes, got {len(frame)}"
    if magic != MAGIC or version != VERSION:
        return REFUSE_MALFORMED, f"not a skyfn direct path proof (magic {magic!r}, version {version})"
    if not caller:
        return REFUSE_NOT_CALLER, "the call named no session: open a session at the service (it signs the call)"
    key = path_key(session_key, endpoint_id, caller, expires)
    good = hmac.new(bytes.fromhex(key), _LABEL + nonce, hashlib.sha256).digest()
    if not hmac.compare_digest(good, mac):
        return REFUSE_BAD_TICKET, ("the session's path ticket was not signed for this caller of this endpoint by "
                                   "this agent's current key (another session, user or endpoint, or the agent "
                                   "restarted): ask the service for a new session")
    if expires < now:
        return REFUSE_EXPIRED, "the session's path ticket expired: ask the service for a new session"
    return None


def refusal(code: str, reason: str) -> bytes:
    body = json.dumps({"code": code, "reason": reason}).encode()[:65535]
    return REFUSED + struct.pack("<H", len(body)) + body


# -- what the service signs (lambdas/core/tasks/sessions.py; test rigs call the same) ------------

def listen_ticket(secret: str, address: str, endpoint_id: str, ttl: float, now: float) -> dict:
    """The ListenTicket of an endpoint's agent: LISTEN under its name for `ttl` seconds."""
    from rendezvous.tokens import make_token

    name = listener_name(endpoint_id)
    return {"address": address, "name": name, "token": make_token(secret, name, ttl_s=ttl, now=now),
            "expires": float(int(now + ttl))}


def path_ticket(secret: str, address: str, endpoint_id: str, session_id: str, owner: str, session_key: str,
                expires: float, now: float) -> dict:
    """A session's PathTicket: the call token for its caller and the path key its agent derives."""
    from rendezvous.tokens import make_call_token

    name, caller = listener_name(endpoint_id), caller_of(session_id, owner)
    return {"address": address, "name": name, "caller": caller,
            "token": make_call_token(secret, name, caller, ttl_s=max(1.0, expires - now), now=now),
            "path_key": path_key(session_key, endpoint_id, caller, expires), "expires": expires}
