"""Group tokens for the rendezvous server, issued by the service to its users.

A user names a group; the service namespaces the name to the user
(`u-<16 hex of sha256(user)>.<name>`), so no one can obtain a token for another user's
group, and signs an expiring token with the rendezvous secret (rendezvous.tokens, the
HMAC the server checks). SPMD group runs get theirs from the SpmdInit step.
"""
from __future__ import annotations

import hashlib
import time

from lambdas.core.errors import ServiceError


class RendezvousNotConfigured(ServiceError):
    """The deployment runs no rendezvous server: nothing to issue tokens for (not a fault)."""

    status = 404
    code = "rendezvous_not_configured"


def namespace(user: str) -> str:
    return "u-" + hashlib.sha256(user.encode()).hexdigest()[:16]


def issue(user: str, name: str, ttl_seconds: int) -> dict:
    from lambdas.core.runs.settings import run_settings
    from rendezvous.tokens import make_token

    ws = run_settings()
    if not ws.rendezvous_secret:
        raise RendezvousNotConfigured("this deployment has no rendezvous server (SKYFN_RENDEZVOUS_SECRET is not "
                                      "set): ask its operator, or run one with `skyfn rendezvous`")
    group = f"{namespace(user)}.{name}"
    now = time.time()
    token = make_token(ws.rendezvous_secret, group, ttl_s=ttl_seconds, now=now)
    return {"group": group, "token": token, "expires": float(int(now + ttl_seconds)),
            "address": ws.rendezvous_address or None}
