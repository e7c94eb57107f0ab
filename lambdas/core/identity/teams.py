"""Teams: named sets of users that objects are shared with (`team:<id>` principals).

A team belongs to the user who created it; only the owner changes its members. Members
see the team. Stored in DynamoDB (endpoints table, item `team#<id>`: team_owner, name,
members) and in the hot store (`team:<id>` hash o/name, `team:<id>:m` set of members,
`teams_of:<user>` set of team ids; lambdas/adapters/redis_store/teams_store.py), which
access checks read. Removing a member takes
effect for the next request.
"""
from __future__ import annotations

import time

from lambdas.core import deps
from lambdas.core.errors import Invalid, NotFound
from lambdas.core.ids import is_uuid, new_id

MAX_MEMBERS = 1000


class InvalidTeam(Invalid):
    code = "invalid_team"


def _check_user(user: str) -> str:
    if not isinstance(user, str) or not user or len(user) > 200 or ":" in user:
        raise InvalidTeam(f"member {user!r} must be a user id (1-200 characters, no ':')")
    return user


def create(owner: str, name: str, members: list[str]) -> dict:
    members = sorted({_check_user(m) for m in members} | {owner})
    if len(members) > MAX_MEMBERS:
        raise InvalidTeam(f"a team has at most {MAX_MEMBERS} members, this one {len(members)}")
    team_id = new_id()
    item = {"endpoint_id": f"team#{team_id}", "team_owner": owner, "name": name, "members": members,
            "created": str(time.time())}
    deps.dynamo().endpoints.put_item(Item=item)
    _cache(team_id, owner, name, members)
    return info(owner, team_id)


def _cache(team_id: str, owner: str, name: str, members: list[str]) -> None:
    deps.teams().cache_team(team_id, owner, name, members)


def _record(team_id: str) -> dict:
    hot = deps.teams().team(team_id)
    if hot is not None:
        owner, name, members = hot
        return {"owner": owner, "name": name, "members": members}
    item = deps.dynamo().endpoints.get_item(Key={"endpoint_id": f"team#{team_id}"}).get("Item") \
        if is_uuid(team_id) else None
    if not item or "team_owner" not in item:
        return {}
    _cache(team_id, item["team_owner"], item["name"], list(item["members"]))
    return {"owner": item["team_owner"], "name": item["name"], "members": sorted(item["members"])}


def info(user: str, team_id: str) -> dict:
    rec = _record(team_id)
    if not rec or (user != rec["owner"] and user not in rec["members"]):
        raise NotFound(f"team {team_id} not found")
    return {"team_id": team_id, "name": rec["name"], "owner": rec["owner"], "members": rec["members"]}


def set_member(user: str, team_id: str, member: str, present: bool) -> dict:
    rec = _record(team_id)
    if not rec or (user != rec["owner"] and user not in rec["members"]):
        raise NotFound(f"team {team_id} not found")
    if user != rec["owner"]:
        from lambdas.core.errors import Forbidden

        raise Forbidden(f"team {team_id}: only its owner changes its members")
    _check_user(member)
    if not present and member == rec["owner"]:
        raise InvalidTeam("the owner stays a member of the team")
    members = set(rec["members"])
    members = members | {member} if present else members - {member}
    if len(members) > MAX_MEMBERS:
        raise InvalidTeam(f"a team has at most {MAX_MEMBERS} members")
    deps.dynamo().endpoints.update_item(Key={"endpoint_id": f"team#{team_id}"}, UpdateExpression="SET members = :m",
                                        ExpressionAttributeValues={":m": sorted(members)})
    _cache(team_id, rec["owner"], rec["name"], sorted(members))
    return info(user, team_id)


def teams_of(user: str) -> set[str]:
    return deps.teams().teams_of(user)
