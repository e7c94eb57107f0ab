"""The history outbox of the hot task store and the purge that follows archival: records
queued for DynamoDB off the hot path (lambdas/history.py drains them in bulk), marked once
written, and dropped from Redis only after that (purge)."""
from __future__ import annotations

import time
from typing import Any, Iterable

import orjson
import redis


class HistoryOutbox:
    """The outbox and purge operations of TaskStore."""

    r: redis.Redis

    def purge(self, limit: int = 5000) -> int:
        """Drop records whose time is up, but only once they are in the durable history."""
        now = time.time()
        ids = [i.decode() for i in self.r.zrangebyscore("purge", "-inf", now, start=0, num=limit)]
        if not ids:
            return 0
        pipe = self.r.pipeline(transaction=False)
        for tid in ids:
            pipe.hget(f"t:{tid}", "h")
        flags = pipe.execute()
        ready = [tid for tid, h in zip(ids, flags) if h is not None]
        gone = [tid for tid, h in zip(ids, flags) if h is None and not self.r.exists(f"t:{tid}")]
        pipe = self.r.pipeline(transaction=False)
        for tid in ready:
            pipe.delete(f"t:{tid}")
        if ready or gone:
            pipe.zrem("purge", *(ready + gone))
        pipe.execute()
        return len(ready)

    def outbox_take(self, count: int) -> list[str]:
        items = self.r.lpop("outbox", count)
        return [i.decode() for i in items or []]

    def outbox_return(self, items: Iterable[str]) -> None:
        items = list(items)
        if items:
            self.r.lpush("outbox", *reversed(items))

    def records(self, task_ids: list[str]) -> list[dict[str, str]]:
        pipe = self.r.pipeline(transaction=False)
        for tid in task_ids:
            pipe.hgetall(f"t:{tid}")
        out = []
        for tid, raw in zip(task_ids, pipe.execute()):
            rec = {k.decode(): v.decode() for k, v in raw.items()}
            if rec:
                rec["task_id"] = tid
                out.append(rec)
        return out

    def mark_historized(self, task_ids: list[str]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for tid in task_ids:
            pipe.hset(f"t:{tid}", "h", 1)
        pipe.execute()

    def enqueue_submission_record(self, record: dict[str, Any]) -> None:
        self.r.rpush("outbox", b"sub:" + orjson.dumps(record))
