"""Batch fan-out's bookkeeping (lambdas/core/runs/batches.py) in the hot store:

  batch:<id>          hash: o owner, n tasks, m chunks, e endpoint, f function, c created,
                      d deadline, run run id
  batch:<id>:chunks   hash: chunk -> "ok:<tasks>" | JSON {tasks, error, cause}
  batch:<id>:pending  set of routed task ids not yet seen in a final state
  batch:<id>:counts   hash: final state -> tasks (settle_batch.lua moves tasks from pending)
"""
from __future__ import annotations

from typing import Any, NamedTuple

from lambdas.adapters.redis_store import lua_files

SETTLE_SLICE = 5000  # task ids per settle_batch call


def _key(batch_id: str, part: str = "") -> str:
    return f"batch:{batch_id}" + (f":{part}" if part else "")


class BatchProgress(NamedTuple):
    record: dict[str, str]          # batch:<id>
    chunks: dict[int, str]          # chunk -> its report
    pending: int                    # routed tasks not yet final
    counts: dict[str, int]          # final state -> tasks


class BatchStore:
    def __init__(self, client: Any):
        self.r = client
        self._settle = lua_files.register(client, "settle_batch")

    def create(self, batch_id: str, fields: dict[str, Any], ttl: int) -> None:
        self.r.hset(_key(batch_id), mapping=fields)
        self.r.expire(_key(batch_id), ttl)

    def record(self, batch_id: str) -> dict[str, str]:
        """The batch's record ({} when there is none)."""
        return {k.decode(): v.decode() for k, v in self.r.hgetall(_key(batch_id)).items()}

    def chunk_reported(self, batch_id: str, chunk: int, report: str | bytes, task_ids: list[str], ttl: int) -> None:
        """A chunk's report, its tasks added to the pending ones (one transaction)."""
        pipe = self.r.pipeline(transaction=True)
        pipe.sadd(_key(batch_id, "pending"), *task_ids)
        pipe.hset(_key(batch_id, "chunks"), str(chunk), report)
        for part in ("pending", "chunks"):
            pipe.expire(_key(batch_id, part), ttl)
        pipe.execute()

    def tasks_exist(self, task_ids: list[str]) -> list[bool]:
        """Whether each task has a record (one round trip)."""
        pipe = self.r.pipeline(transaction=False)
        for tid in task_ids:
            pipe.exists(f"t:{tid}")
        return [bool(e) for e in pipe.execute()]

    def settle(self, batch_id: str) -> BatchProgress | None:
        """Settle the pending tasks that became final and read the batch's progress; None
        when the batch has no record."""
        rec = self.record(batch_id)
        if not rec:
            return None
        chunks = {int(k): v.decode() for k, v in self.r.hgetall(_key(batch_id, "chunks")).items()}
        pending_key, counts_key = _key(batch_id, "pending"), _key(batch_id, "counts")
        members = [m.decode() for m in self.r.smembers(pending_key)]
        for i in range(0, len(members), SETTLE_SLICE):
            ids = members[i:i + SETTLE_SLICE]
            self._settle(keys=[pending_key, counts_key, *(f"t:{tid}" for tid in ids)], args=ids)
        pending = self.r.scard(pending_key)
        counts = {k.decode(): int(v) for k, v in self.r.hgetall(counts_key).items()}
        return BatchProgress(rec, chunks, pending, counts)
