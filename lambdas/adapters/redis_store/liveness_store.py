"""Endpoint liveness in the hot store, for lambdas/core/tasks/registry.py: which endpoints
went silent, found without reading every endpoint.

  ep-beats        zset: endpoint -> its last heartbeat (time), for endpoints online; the
                  heartbeat writes it in the round trip that writes ep:<endpoint>'s hb and st
                  (registry_store.RegistryCache.heartbeat), the reaper's sweep
                  (lua/sweep_silent.lua) takes the silent ones off it as it marks them offline
  ep-beats:built  set once ep-beats was filled from the records of a store written before it

A reaper tick is one ZRANGEBYSCORE over the silent end of the index (plus the endpoints that
went silent since the last tick), whatever the number of endpoints that heartbeat.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from lambdas.adapters.redis_store import lua_files

BEATS = "ep-beats"
BUILT = "ep-beats:built"
SWEEP_LIMIT = 1000  # endpoints one sweep call takes; the sweep calls again while it gets that many


class Liveness:
    def __init__(self, client: Any):
        self.r = client
        self._built = False  # seen built by this process: not asked again
        self._sweep = lua_files.register(client, "sweep_silent")

    def sweep_silent(self, cutoff: float, limit: int = SWEEP_LIMIT) -> list[str]:
        """Endpoints online whose last heartbeat is before `cutoff` are marked offline; their ids."""
        out: list[str] = []
        while True:
            got = [i.decode() for i in self._sweep(keys=[BEATS], args=[f"{cutoff:.6f}", limit])]
            out += got
            if len(got) < limit:
                return out

    def build_once(self, endpoint_ids: Callable[[], Iterable[str]]) -> int:
        """A store from before ep-beats: its endpoints online are put on it once (their
        records read once, in one round trip). Returns how many were put on it."""
        if self._built:
            return 0
        self._built = True
        if not self.r.set(BUILT, 1, nx=True):
            return 0
        ids = list(endpoint_ids())
        if not ids:
            return 0
        pipe = self.r.pipeline(transaction=False)
        for ep in ids:
            pipe.hmget(f"ep:{ep}", "hb", "st")
        online = {ep: float(hb) for ep, (hb, st) in zip(ids, pipe.execute()) if st == b"online" and hb is not None}
        if online:
            self.r.zadd(BEATS, online)
        return len(online)
