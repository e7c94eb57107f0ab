"""Single fields of many task records (t:<task>, laid out in lambdas/adapters/redis_store/
__init__.py), each read for all the tasks in one round trip: for the paths that need one
fact per task and not the record (a retried submission's states, placement's input
locations, the stage metrics' events, an endpoint's question about its own tasks)."""
from __future__ import annotations

from typing import Any, Optional


class TaskFields:
    def __init__(self, client: Any):
        self.r = client

    def states(self, task_ids: list[str]) -> list[Optional[bytes]]:
        """Each task's state (None: no record)."""
        pipe = self.r.pipeline(transaction=False)
        for tid in task_ids:
            pipe.hget(f"t:{tid}", "s")
        return pipe.execute()

    def events(self, task_ids: list[str]) -> list[Optional[str]]:
        """Each task's events text ('STATE@ts;...'; None: no record)."""
        pipe = self.r.pipeline(transaction=False)
        for tid in task_ids:
            pipe.hget(f"t:{tid}", "ev")
        return [v.decode() if isinstance(v, bytes) else v for v in pipe.execute()]

    def locations(self, task_ids: list[str]) -> dict[str, tuple[str, int]]:
        """Task id -> (its endpoint, the size of its result here; 0: none) for the tasks with
        a record."""
        pipe = self.r.pipeline(transaction=False)
        for tid in task_ids:
            pipe.hget(f"t:{tid}", "e")
            pipe.hstrlen(f"t:{tid}", "res")
        got = pipe.execute()
        return {tid: (ep.decode(), size) for tid, ep, size in zip(task_ids, got[0::2], got[1::2]) if ep}

    def dispatch_states(self, task_ids: list[str]) -> list[Optional[tuple[str, str, Optional[str], Optional[str]]]]:
        """Each task's (endpoint, state, events text, reason) (None: no record)."""
        pipe = self.r.pipeline(transaction=False)
        for tid in task_ids:
            pipe.hmget(f"t:{tid}", "e", "s", "ev", "why")
        out = []
        for values in pipe.execute():
            ep, state, ev, why = (v.decode() if isinstance(v, bytes) else v for v in values)
            out.append((ep, state, ev, why) if ep is not None and state is not None else None)
        return out
