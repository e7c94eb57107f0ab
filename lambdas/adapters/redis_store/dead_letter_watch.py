"""The endpoints whose task queues may hold, or may yet produce, dead letters: the reaper
(lambdas/core/tasks/dead_letters.py) looks at their dead-letter queues and at no other's.

  dl-watch        zset: endpoint -> when a pack was last sent to it (its queue or a lane's),
                  or one of its lanes closed; written after the send, so a reaper that found
                  the queues empty before it cannot have missed what the send added
  dl-watch:built  set once dl-watch was filled with every endpoint of a store written before it

A message is dead-lettered only while it is in its queue; an endpoint whose queues are empty
can produce no dead letter until something is sent to it again, which puts it back here.
So an idle endpoint costs the reaper nothing, and a tick's cost follows the endpoints that
were sent work lately, not the fleet.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from lambdas.adapters.redis_store import lua_files

WATCH = "dl-watch"
BUILT = "dl-watch:built"


class DeadLetterWatch:
    def __init__(self, client: Any):
        self.r = client
        self._built = False  # seen built by this process: not asked again
        self._settle = lua_files.register(client, "settle_watch")

    def touch(self, endpoint_ids: Iterable[str], at: float) -> None:
        """Watch these endpoints (a pack was just sent to each): one command."""
        mapping = {ep: at for ep in endpoint_ids if ep}
        if mapping:
            self.r.zadd(WATCH, mapping)

    def due(self, limit: int = 10_000) -> list[str]:
        """The endpoints watched, oldest send first."""
        return [i.decode() for i in self.r.zrange(WATCH, 0, limit - 1)]

    def settle(self, endpoint_id: str, cutoff: float) -> bool:
        """Stop watching the endpoint, unless it was sent a pack after `cutoff`."""
        return bool(self._settle(keys=[WATCH], args=[endpoint_id, f"{cutoff:.6f}"]))

    def build_once(self, endpoint_ids: Callable[[], Iterable[str]]) -> int:
        """A store from before dl-watch: every endpoint is watched once, as if sent its last
        pack long ago (those found empty leave at the reaper's first look). Returns how many."""
        if self._built:
            return 0
        self._built = True
        if not self.r.set(BUILT, 1, nx=True):
            return 0
        ids = list(endpoint_ids())
        self.touch(ids, 0.0)
        return len(ids)
