"""Direct sessions: the wire contract between the SDK and an endpoint agent's direct socket.

An interactive call through the service takes seven process hops (SDK, gateway, API,
Redis, agent, results, push hub); a direct session takes the three that Parsl HTEX takes
(SDK -> agent's interchange -> manager -> worker), while the service still decides who
may run what and still keeps the record:

1. The agent publishes, with each heartbeat, where its direct socket listens, the socket's
   CurveZMQ public key and a random session key (`skyfn.protocol.api.DirectInfo`). Only the agent itself can
   publish them (the heartbeat is authenticated as the agent); they expire with the
   heartbeat, so an agent gone silent takes no new sessions.
2. The SDK asks the service for a session (`POST /endpoints/{id}/sessions` with the
   function ids it will call). The service applies the same checks as `POST /tasks`
   (endpoint access, the endpoint's allowlist, function ownership), records the session
   and answers a token: claims signed with the agent's session key (HMAC-SHA256). The
   claims name the endpoint, the user, the expiry, the digest of every function body
   the session may run and each function's registered owner and name (what the agent's
   `{owner, name}` allowlist entries match, as they match a polled pack's function_meta).
3. The SDK connects to the agent (CurveZMQ: encrypted, the agent authenticated by its
   key) and sends task packs with the token. The agent verifies the token (signature,
   endpoint, expiry) and each function body against its digest, runs the tasks like any
   others and sends each result straight back.
4. The agent also reports every direct result through its results queue, with the
   session id: the service records the task (owner taken from its own session record, not
   from the agent) in the hot store and the history, as for any task.

Frames are multipart ZeroMQ messages whose first frame is an op code:

    SDK -> agent   [SUBMIT, token, pack]    pack: JSON {"tasks": [TaskSpec], "functions": {id: body}}
                   [PING, asked]           asked (optional): JSON [task id] the SDK still waits for
    agent -> SDK   [RESULTS, results]       results: JSON [TaskResult] (task_id, state, result, ...)
                   [REFUSED, refusal]       refusal: JSON {"task_ids": [...], "reason": str, "code": str}
                   [PONG, info]             info: JSON {"started": agent start time, "load": tasks held,
                                                        "capacity": tasks it takes at once,
                                                        "unknown": [asked ids the agent does not hold],
                                                        "never": [asked ids that never arrived]}

The SDK keeps at most twice the agent's capacity (at least MIN_WINDOW) of its tasks at the
agent and holds the rest, so a long map does not land in the agent's memory at once.

A task the agent no longer holds yet the SDK still waits for lost its reply (the SDK's
connection dropped while it was sent) or never arrived. The agent sends again a result
it still keeps (its replay cache, before the PONG), names in `never` the asked ids that
never arrived (the SDK sends those again: nothing ran), and the SDK settles the rest
through the service, which has its record or, past a grace period, takes it as a new
submission.

Refusal codes: `bad_token` (malformed or not signed by this agent's current key: the
agent restarted, ask the service for a new session), `expired`, `wrong_endpoint`,
`function` (a function not in the token, or a body that does not match its digest),
`bad_pack` (not a valid pack).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from typing import Any, Optional

SUBMIT = b"S"
PING = b"P"
RESULTS = b"R"
REFUSED = b"E"
PONG = b"O"

SESSION_KEY_BYTES = 32
DEFAULT_SESSION_TTL_S = 900.0
MAX_SESSION_FUNCTIONS = 256
MAX_ASKED = 1000  # task ids a PING may ask about

REFUSE_BAD_TOKEN = "bad_token"
REFUSE_EXPIRED = "expired"
REFUSE_WRONG_ENDPOINT = "wrong_endpoint"
REFUSE_FUNCTION = "function"
REFUSE_BAD_PACK = "bad_pack"


class DirectRefused(Exception):
    """A token or pack the agent will not run; `code` is one of the REFUSE_* codes."""

    def __init__(self, code: str, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


def new_session_key() -> str:
    return secrets.token_hex(SESSION_KEY_BYTES)


def body_digest(body: str) -> str:
    """The digest of a serialized function body, as tokens carry it."""
    return hashlib.sha256(body.encode()).hexdigest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def mint_token(session_key: str, *, session_id: str, owner: str, endpoint_id: str,
               functions: dict[str, str], ttl: float = DEFAULT_SESSION_TTL_S, now: Optional[float] = None,
               names: Optional[dict[str, tuple[Optional[str], Optional[str]]]] = None) -> tuple[str, float]:
    """A signed session token and its expiry. `functions`: function id -> body digest;
    `names`: function id -> (its owner, its registered name), claim "fnm"."""
    exp = (time.time() if now is None else now) + ttl
    claims = {"sid": session_id, "sub": owner, "ep": endpoint_id, "exp": round(exp, 3), "fns": functions}
    if names:
        claims["fnm"] = {fid: list(pair) for fid, pair in names.items()}
    body = _b64(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode())
    sig = hmac.new(bytes.fromhex(session_key), body.encode(), hashlib.sha256).digest()
    return f"{body}.{_b64(sig)}", exp


def verify_token(session_key: str, token: str, endpoint_id: str, now: Optional[float] = None) -> dict[str, Any]:
    """The claims of a token signed with `session_key` for `endpoint_id` and not expired;
    DirectRefused otherwise."""
    try:
        body, sig = token.split(".")
        good = hmac.new(bytes.fromhex(session_key), body.encode(), hashlib.sha256).digest()
        signed = hmac.compare_digest(good, _unb64(sig))
    except (ValueError, TypeError):
        signed = False
    if not signed:
        raise DirectRefused(REFUSE_BAD_TOKEN, "the session token is not signed by this agent's current key "
                                              "(the agent restarted?): ask the service for a new session")
    try:
        claims = json.loads(_unb64(body))
        exp, ep, fns = float(claims["exp"]), claims["ep"], claims["fns"]
        if not isinstance(fns, dict) or not isinstance(claims["sid"], str) or not isinstance(claims["sub"], str):
            raise TypeError("fns, sid, sub")
        if not all(isinstance(v, list) and len(v) == 2 for v in (claims.get("fnm") or {}).values()):
            raise TypeError("fnm")
    except (ValueError, TypeError, KeyError) as exc:
        raise DirectRefused(REFUSE_BAD_TOKEN, f"the session token's claims are malformed ({exc})") from None
    if ep != endpoint_id:
        raise DirectRefused(REFUSE_WRONG_ENDPOINT, f"the session is for endpoint {ep}, this is {endpoint_id}")
    if exp < (time.time() if now is None else now):
        raise DirectRefused(REFUSE_EXPIRED, "the session token expired: ask the service for a new session")
    return claims

