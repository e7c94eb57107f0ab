"""Who submitted a task, as each TaskPack tells a multi-user endpoint (DESIGN.md section 12).

A pack's `identity` (skyfn.protocol.messages.SubmitterIdentity) is the owner's user id with
the identity claims of their token: username, email, identity provider (lambdas/auth.py
reads them). The service keeps each user's latest claims in a small hash of the hot store,
`claims:<user id>` (lambdas/adapters/redis_store/claims_store.py), written only when they
changed (one round trip that compares and sets),
so tasks submitted later on the user's behalf without a token -- batch chunks, flow and
SPMD steps run by Step Functions (lambdas/core/runs) -- carry them too. A user whose claims
were never seen is sent as `{id}` only.
"""
from __future__ import annotations

from typing import Any, Optional

from lambdas.adapters.redis_store.claims_store import FIELDS
from lambdas.core import deps


def remember(user: str, claims: Optional[dict[str, str]]) -> bool:
    """Keep the user's latest claims; True when they changed. A token without claims
    leaves the ones kept alone."""
    if not user or not claims or not any(claims.get(f) for f in FIELDS):
        return False
    return deps.claims().remember(user, claims)


def known(user: str) -> dict[str, str]:
    """The user's kept claims ({} when none were seen)."""
    return deps.claims().claims_of(user)


def identity(owner: str, claims: Optional[dict[str, str]] = None, *, keep: bool = True) -> dict[str, Any]:
    """The SubmitterIdentity of the owner's tasks: with the caller's claims (kept for later
    submissions when they changed; `keep=False`: the caller keeps them with `remember`
    itself, once its tasks are on their way), or, without a token (runs), the claims kept
    for the owner; `{id}` alone when none are known."""
    if claims and any(claims.get(f) for f in FIELDS):
        if keep:
            remember(owner, claims)
        found = {f: claims[f] for f in FIELDS if claims.get(f)}
    else:
        found = known(owner)
    return {"id": owner, **found}
