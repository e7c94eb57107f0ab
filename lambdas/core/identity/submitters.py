"""Who submitted a task, as each TaskPack tells a multi-user endpoint (DESIGN.md section 12).

A pack's `identity` (skyfn.protocol.messages.SubmitterIdentity) is the owner's user id with
the identity claims of their token: username, email, identity provider (lambdas/auth.py
reads them). The service keeps each user's latest claims in a small Redis hash,
`claims:<user id>`, written only when they changed (one round trip that compares and sets),
so tasks submitted later on the user's behalf without a token -- batch chunks, flow and
SPMD steps run by Step Functions (lambdas/core/runs) -- carry them too. A user whose claims
were never seen is sent as `{id}` only.
"""
from __future__ import annotations

from typing import Any, Optional

from lambdas.core import deps

FIELDS = ("username", "email", "identity_provider")

# Compare-and-set: the hash is rewritten only when a claim differs (absent == '').
_REMEMBER = """
local cur = redis.call('HMGET', KEYS[1], 'username', 'email', 'identity_provider')
local same = true
for i = 1, 3 do
  if (cur[i] or '') ~= ARGV[i] then same = false end
end
if same then return 0 end
redis.call('DEL', KEYS[1])
local names = {'username', 'email', 'identity_provider'}
for i = 1, 3 do
  if ARGV[i] ~= '' then redis.call('HSET', KEYS[1], names[i], ARGV[i]) end
end
return 1
"""
_script = None


def _key(user: str) -> str:
    return f"claims:{user}"


def remember(user: str, claims: Optional[dict[str, str]]) -> bool:
    """Keep the user's latest claims; True when they changed. A token without claims
    leaves the ones kept alone."""
    global _script
    if not user or not claims or not any(claims.get(f) for f in FIELDS):
        return False
    r = deps.redis_client()
    if _script is None or _script.registered_client is not r:
        _script = r.register_script(_REMEMBER)
    return bool(_script(keys=[_key(user)], args=[claims.get(f) or "" for f in FIELDS]))


def known(user: str) -> dict[str, str]:
    """The user's kept claims ({} when none were seen)."""
    values = deps.redis_client().hmget(_key(user), *FIELDS)
    return {f: v.decode() for f, v in zip(FIELDS, values) if v}


def identity(owner: str, claims: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """The SubmitterIdentity of the owner's tasks: with the caller's claims (kept for later
    submissions when they changed), or, without a token (runs), the claims kept for the
    owner; `{id}` alone when none are known."""
    if claims and any(claims.get(f) for f in FIELDS):
        remember(owner, claims)
        found = {f: claims[f] for f in FIELDS if claims.get(f)}
    else:
        found = known(owner)
    return {"id": owner, **found}
