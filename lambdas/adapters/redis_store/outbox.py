"""The history outbox of the hot task store: records queued for DynamoDB off the hot path
(lambdas/history.py drains them in bulk), marked archived once written. An archived
record leaves Redis by its own expiry: result_ttl after it was read, unretrieved_ttl after
archival if nobody read it (lua/archived.lua, lua/_expire_read.lua)."""
from __future__ import annotations

from typing import Any, Iterable

import orjson
import redis

from lambdas.adapters.redis_store.rows import slices

# What the history keeps of a task record (never its result or payload).
HISTORY_FIELDS = ("o", "f", "e", "sub", "s", "r", "c", "ev", "why", "err")


class HistoryOutbox:
    """The outbox operations of TaskStore."""

    r: redis.Redis
    result_ttl: float
    unretrieved_ttl: float
    _archived: Any
    _history_read: Any

    def outbox_take(self, count: int) -> list[str]:
        items = self.r.lpop("outbox", count)
        return [i.decode() for i in items or []]

    def outbox_return(self, items: Iterable[str]) -> None:
        items = list(items)
        if items:
            self.r.lpush("outbox", *reversed(items))

    def outbox_length(self) -> int:
        return int(self.r.llen("outbox"))

    def records(self, task_ids: list[str]) -> list[dict[str, str]]:
        """The history fields of these task records (those still in Redis), with 'task_id'."""
        if not task_ids:
            return []
        out = []
        for part in slices(task_ids):
            for tid, values in zip(part, self._history_read(keys=[f"t:{tid}" for tid in part], args=HISTORY_FIELDS)):
                if values[0] is not None:
                    rec = {k: v.decode() for k, v in zip(HISTORY_FIELDS, values) if v is not None}
                    rec["task_id"] = tid
                    out.append(rec)
        return out

    def mark_archived(self, task_ids: list[str]) -> int:
        """Mark records written to the durable history and set their expiry; returns how
        many were newly marked."""
        return sum(int(self._archived(keys=["stats:archived", *[f"t:{tid}" for tid in part]],
                                      args=[self.result_ttl, self.unretrieved_ttl]))
                   for part in slices(task_ids))

    def archived_count(self) -> int:
        """Records archived since the store began (stats:archived)."""
        return int(self.r.get("stats:archived") or 0)

    def expire_legacy_purge_index(self, limit: int = 5000) -> int:
        """Stores written before records expired by themselves listed them in a `purge` zset
        (task -> time it may go, once archived): give those records that expiry and drop
        the index, a slice per call. Returns how many entries were taken off it."""
        entries = self.r.zrange("purge", 0, limit - 1, withscores=True)
        if not entries:
            return 0
        pipe = self.r.pipeline(transaction=False)
        for tid, at in entries:
            pipe.hexists(f"t:{tid.decode()}", "h")
        archived = pipe.execute()
        pipe = self.r.pipeline(transaction=False)
        for (tid, at), h in zip(entries, archived):
            if h:  # not yet archived: the drain gives it its expiry when it archives it
                pipe.pexpireat(f"t:{tid.decode()}", int(at * 1000))
        pipe.zrem("purge", *(tid for tid, _ in entries))
        pipe.execute()
        return len(entries)

    def enqueue_submission_record(self, record: dict[str, Any]) -> None:
        self.r.rpush("outbox", b"sub:" + orjson.dumps(record))
