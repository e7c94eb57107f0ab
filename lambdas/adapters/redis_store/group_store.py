"""Endpoint groups' hot state (lambdas/core/tasks/groups.py): the cached group records, the
members' live figures placement reads, and the round-robin positions kept between requests.

  grp:<group>     hash: o owner, name, c created, members JSON, policy (DynamoDB keeps the group)
  grp:<group>:rr  hash: policy rule -> round-robin position
  load:<endpoint> hash: function tag ('_' untagged) -> unfinished tasks there (written by the
                  task scripts: lambdas/adapters/redis_store/lua/*.lua); ep:<endpoint>'s st
                  and stats (registry_store.py) give status and capacity
"""
from __future__ import annotations

from typing import Any, Optional


class GroupStore:
    def __init__(self, client: Any):
        self.r = client

    def cache(self, group_id: str, owner: str, name: str, created: float, members: str, policy: str) -> None:
        self.r.hset(f"grp:{group_id}", mapping={"o": owner, "name": name, "c": str(created), "members": members,
                                                "policy": policy})

    def record(self, group_id: str) -> dict[str, str]:
        """The cached group ({} when not cached)."""
        return {k.decode(): v.decode() for k, v in self.r.hgetall(f"grp:{group_id}").items()}

    def owner(self, group_id: str) -> Optional[str]:
        o = self.r.hget(f"grp:{group_id}", "o")
        return o.decode() if o is not None else None

    def live(self, endpoint_ids: list[str]) -> list[tuple[dict[str, int], Optional[str], Optional[bytes]]]:
        """Per endpoint, in one round trip: (unfinished tasks per tag, status, stats JSON)."""
        pipe = self.r.pipeline(transaction=False)
        for ep in endpoint_ids:
            pipe.hgetall(f"load:{ep}")
            pipe.hmget(f"ep:{ep}", "st", "stats")
        answers = pipe.execute()
        out = []
        for load, (st, stats) in zip(answers[0::2], answers[1::2]):
            out.append(({k.decode(): int(v) for k, v in load.items()}, st.decode() if st else None, stats))
        return out

    def cursors(self, group_id: str) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.r.hgetall(f"grp:{group_id}:rr").items()}

    def save_cursors(self, group_id: str, cursors: dict[str, int]) -> None:
        self.r.hset(f"grp:{group_id}:rr", mapping=cursors)
