"""Authorization: who may do what with a function, an endpoint or an endpoint group.

The owner (who registered it) may do everything. The owner shares an object with a user
(`user:<id>`) or a team (`team:<id>`, lambdas/core/identity/teams.py) with a role:
  run     use it: run the function, send tasks to the endpoint or group, read its record;
  manage  run, plus: grant and revoke `run` to others, heartbeat the endpoint (agents
          run by a co-manager), rotate its agent credential.
Granting or revoking `manage`, and deleting shares of others, stays with the owner.

The principal `all-users` means every authenticated user (never an endpoint agent): a
function or endpoint shared with `all-users` with role `run` may be used by anyone signed
in -- how a site opens its multi-user endpoint (DESIGN.md section 12), whose identity
mapping then decides who runs as which account. Only `run`, and only for functions and
endpoints, is granted to `all-users` (400 otherwise); it is granted and revoked like any
share, by the owner or a co-manager.

A caller with no role gets 404 (the object's existence is not revealed); a caller with a
role too small for the action gets 403 naming the role needed. Tasks and their results
are not shared: only the submitter reads them (lambdas/core/tasks/tasks.py checks the owner).

Grants live in DynamoDB (endpoints table, item `share#<kind>#<id>`, map `grants`) and in
the hot store (`share:<kind>:<id>`, hash principal -> role; lambdas/adapters/redis_store/
shares_store.py), which every check reads: there is no
per-process cache, so a revoke takes effect for the next request. The Redis copy is
filled from DynamoDB by a script that writes only when the hash is absent, so a fill that
raced with a revoke cannot bring the revoked grant back.
"""
from __future__ import annotations

import time
from typing import Optional

from lambdas.core import deps
from lambdas.core.errors import Forbidden, Invalid, NotFound, ServiceError

KINDS = ("function", "endpoint", "endpoint-group")
ROLES = ("run", "manage")
ALL_USERS = "all-users"  # the principal for every authenticated user
ALL_USERS_KINDS = ("function", "endpoint")
RANK = {"run": 1, "manage": 2, "owner": 3}


class InvalidShare(Invalid):
    code = "invalid_share"


class RefusedShare(ServiceError):
    """A well-formed share this service does not grant (`all-users` beyond `run`)."""
    code = "share_refused"


def _item_key(kind: str, obj_id: str) -> str:
    return f"share#{kind}#{obj_id}"


def grants(kind: str, obj_id: str) -> dict[str, str]:
    """principal -> role of every share of the object."""
    port = deps.shares()
    found = port.shares_of(kind, obj_id)
    if found is None:
        item = deps.dynamo().endpoints.get_item(Key={"endpoint_id": _item_key(kind, obj_id)},
                                                ConsistentRead=True).get("Item") or {}
        found = port.fill_shares(kind, obj_id, {str(k): str(v) for k, v in (item.get("grants") or {}).items()})
    return found


def role(kind: str, obj_id: str, owner: str, user: str) -> Optional[str]:
    """'owner', 'manage', 'run' or None."""
    if user == owner:
        return "owner"
    shared = grants(kind, obj_id)
    if not shared:
        return None
    best = shared.get(f"user:{user}")
    if best is None and user and ALL_USERS in shared:  # any authenticated user (agents have no user)
        best = shared[ALL_USERS]
    team_grants = {p[5:]: r for p, r in shared.items() if p.startswith("team:")}
    if team_grants:
        from lambdas.core.identity import teams

        for team_id in teams.teams_of(user) & set(team_grants):
            if best is None or RANK[team_grants[team_id]] > RANK[best]:
                best = team_grants[team_id]
    return best


def require(kind: str, obj_id: str, owner: Optional[str], user: str, need: str, what: str) -> str:
    """The caller's role, if at least `need`; else NotFound (no role) or Forbidden."""
    got = role(kind, obj_id, owner, user) if owner is not None else None
    if got is None:
        raise NotFound(f"{what} not found")
    if RANK[got] < RANK[need]:
        raise Forbidden(f"{what}: your role is '{got}', this needs '{need}' (ask its owner to share it with "
                        f"role '{need}')")
    return got


def allows(kind: str, obj_id: str, owner: str, user: str, need: str = "run") -> bool:
    got = role(kind, obj_id, owner, user)
    return got is not None and RANK[got] >= RANK[need]


# --- changing shares --------------------------------------------------------------------
def check_principal(principal: str) -> str:
    if principal == ALL_USERS:
        return principal
    kind, _, name = principal.partition(":")
    if kind not in ("user", "team") or not name or len(principal) > 200:
        raise InvalidShare(f"principal {principal!r} must be 'user:<user id>', 'team:<team id>' or '{ALL_USERS}'")
    return principal


def grant(kind: str, obj_id: str, owner: str, caller: str, principal: str, new_role: str) -> dict[str, str]:
    check_principal(principal)
    if new_role not in ROLES:
        raise InvalidShare(f"role {new_role!r} is not one of {', '.join(ROLES)}")
    if principal == ALL_USERS:
        if kind not in ALL_USERS_KINDS:
            raise RefusedShare(f"'{ALL_USERS}' can be granted functions and endpoints only, not an {kind}: share "
                               f"the {kind} with 'user:<id>' or 'team:<id>' instead")
        if new_role != "run":
            raise RefusedShare(f"'{ALL_USERS}' can only be granted 'run': '{new_role}' would let every signed-in "
                               f"user manage {kind} {obj_id} (rotate its credential, share it onwards); grant "
                               f"'{new_role}' to a 'user:<id>' or 'team:<id>' instead")
    mine = require(kind, obj_id, owner, caller, "manage", f"{kind} {obj_id}")
    if principal == f"user:{owner}":
        raise InvalidShare(f"user {owner} owns {kind} {obj_id} already")
    previous = grants(kind, obj_id).get(principal)
    if mine != "owner" and (new_role == "manage" or previous == "manage"):
        raise Forbidden(f"{kind} {obj_id}: only its owner grants or changes 'manage'")
    deps.dynamo().endpoints.update_item(
        Key={"endpoint_id": _item_key(kind, obj_id)},
        UpdateExpression="SET grants = if_not_exists(grants, :empty), updated = :t",
        ExpressionAttributeValues={":empty": {}, ":t": str(time.time())})
    deps.dynamo().endpoints.update_item(
        Key={"endpoint_id": _item_key(kind, obj_id)}, UpdateExpression="SET grants.#p = :r",
        ExpressionAttributeNames={"#p": principal}, ExpressionAttributeValues={":r": new_role})
    deps.shares().grant_share(kind, obj_id, principal, new_role)
    return grants(kind, obj_id)


def revoke(kind: str, obj_id: str, owner: str, caller: str, principal: str) -> dict[str, str]:
    check_principal(principal)
    mine = require(kind, obj_id, owner, caller, "manage", f"{kind} {obj_id}")
    current = grants(kind, obj_id)
    if principal not in current:
        raise NotFound(f"{kind} {obj_id} is not shared with {principal}")
    if mine != "owner" and current[principal] == "manage":
        raise Forbidden(f"{kind} {obj_id}: only its owner revokes 'manage'")
    deps.dynamo().endpoints.update_item(
        Key={"endpoint_id": _item_key(kind, obj_id)}, UpdateExpression="REMOVE grants.#p",
        ExpressionAttributeNames={"#p": principal})
    # the last share gone: the hot copy stays present (filled, empty), DynamoDB is not read again
    deps.shares().revoke_share(kind, obj_id, principal, last=len(current) == 1)
    return grants(kind, obj_id)


def shared_with(user: str) -> list[dict[str, str]]:
    """Objects shared with the user directly, with the role (team shares: see the team)."""
    out = []
    for kind, obj_id in deps.shares().shared_with(user):
        r = grants(kind, obj_id).get(f"user:{user}")
        if r:
            out.append({"kind": kind, "id": obj_id, "role": r})
    return out
