"""Teams in the hot store, for lambdas/core/identity/teams.py (DynamoDB keeps the durable
copy). Keys: `team:<id>` hash o (owner), name; `team:<id>:m` set of members;
`teams_of:<user>` set of the team ids the user is a member of, which access checks read."""
from __future__ import annotations

from typing import Any, Optional


class TeamStore:
    def __init__(self, client: Any):
        self.r = client

    def cache_team(self, team_id: str, owner: str, name: str, members: list[str]) -> None:
        """Write the team and its members; members no longer in it lose it from their teams."""
        old = {m.decode() for m in self.r.smembers(f"team:{team_id}:m")}
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(f"team:{team_id}", mapping={"o": owner, "name": name})
        pipe.delete(f"team:{team_id}:m")
        pipe.sadd(f"team:{team_id}:m", *members)
        for gone in old - set(members):
            pipe.srem(f"teams_of:{gone}", team_id)
        for m in members:
            pipe.sadd(f"teams_of:{m}", team_id)
        pipe.execute()

    def team(self, team_id: str) -> Optional[tuple[str, str, list[str]]]:
        """(owner, name, sorted members) of a team in the hot store, None when absent."""
        raw = self.r.hgetall(f"team:{team_id}")
        if not raw:
            return None
        members = sorted(m.decode() for m in self.r.smembers(f"team:{team_id}:m"))
        return raw[b"o"].decode(), raw[b"name"].decode(), members

    def teams_of(self, user: str) -> set[str]:
        return {t.decode() for t in self.r.smembers(f"teams_of:{user}")}
