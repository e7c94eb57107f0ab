"""The figures of the hot store's backlog gauge (lambdas/core/tasks/backlog.py), read in one
pipelined round trip: the history outbox's length (LLEN outbox), Redis's memory (INFO
memory) and its key count (DBSIZE)."""
from __future__ import annotations

from typing import Any, NamedTuple


class StoreFigures(NamedTuple):
    outbox: int          # history outbox entries not yet archived
    used_bytes: int      # used_memory
    startup_bytes: int   # used_memory_startup: what an empty Redis uses
    max_bytes: int       # maxmemory; 0: no limit
    keys: int            # DBSIZE


class BacklogFigures:
    def __init__(self, client: Any):
        self.r = client

    def read(self) -> StoreFigures:
        pipe = self.r.pipeline(transaction=False)
        pipe.llen("outbox")
        pipe.info("memory")
        pipe.dbsize()
        outbox, memory, keys = pipe.execute()
        return StoreFigures(int(outbox or 0), int(memory.get("used_memory") or 0),
                            int(memory.get("used_memory_startup") or 0), int(memory.get("maxmemory") or 0),
                            int(keys or 0))
