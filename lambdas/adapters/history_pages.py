"""The durable task history in DynamoDB as pages: one item holds many finished tasks,
compressed, so archiving costs a write per page instead of two per task (item and index).

Table `<prefix>-history`, partition key `k`, sort key `s` (both strings), TTL `expires_at`:

  page    k = "p#<owner>#<bucket>", s = "<created minute, 8 hex>#<page id>":
          body (zlib of the JSON list of task items, without their owner), n (tasks)
  marker  k = "m#<owner>", s = "<created minute, 8 hex>#<bucket>": the owner had tasks
          created in that minute filed under that bucket (the listing reads markers first)

A task's bucket comes from its id alone: "t<second, 8 hex>" of the time in a time-ordered
id (skyfn/protocol/ids.py), so one lookup reads the pages of one second of one owner;
"x<first two hex>" for other ids (keyed with a key that is not a v7 UUID), whose pages
accumulate and are read whole. A page id is a digest of its task ids: a drain batch
written again after a failure overwrites its pages. Tasks written twice in different
pages (an outbox entry returned and taken in another batch) are read once.
"""
from __future__ import annotations

import hashlib
import zlib
from typing import Any, Iterable, Iterator

import orjson
from boto3.dynamodb.conditions import Key

from skyfn.protocol.ids import time_ms

PAGE_TASKS = 1_000
PAGE_MAX_BYTES = 350_000  # DynamoDB items are at most 400 KB
_LEVEL = 6


def bucket_of(task_id: str) -> str:
    ms = time_ms(task_id)
    return f"t{ms // 1000:08x}" if ms is not None else f"x{task_id[:2].lower()}"


def _minute(created: float) -> str:
    return f"{int(created // 60):08x}"


def _page_key(owner: str, bucket: str) -> str:
    return f"p#{owner}#{bucket}"


def _pages(tasks: list[dict[str, Any]]) -> Iterator[tuple[bytes, list[dict[str, Any]]]]:
    """Compressed bodies of at most PAGE_TASKS tasks and PAGE_MAX_BYTES each."""
    for i in range(0, len(tasks), PAGE_TASKS):
        yield from _fit(tasks[i:i + PAGE_TASKS])


def _fit(chunk: list[dict[str, Any]]) -> Iterator[tuple[bytes, list[dict[str, Any]]]]:
    body = zlib.compress(orjson.dumps(chunk), _LEVEL)
    if len(body) <= PAGE_MAX_BYTES or len(chunk) == 1:
        yield body, chunk
        return
    half = len(chunk) // 2
    yield from _fit(chunk[:half])
    yield from _fit(chunk[half:])


def _items_of(body: bytes) -> list[dict[str, Any]]:
    return orjson.loads(zlib.decompress(bytes(body)))


class TaskHistory:
    """Writes and reads of the history table (a boto3 Table resource)."""

    def __init__(self, table: Any):
        self.table = table

    def write(self, tasks: Iterable[dict[str, Any]], expires_at: int | None = None) -> int:
        """File task items (task_id, owner, created, ... as lambdas/history.py makes them).
        Returns the number of pages written."""
        groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for t in tasks:
            item = {k: v for k, v in t.items() if k != "owner" and v is not None}
            groups.setdefault((t["owner"], bucket_of(t["task_id"]), _minute(float(t["created"]))), []).append(item)
        extra = {"expires_at": expires_at} if expires_at else {}
        pages = 0
        with self.table.batch_writer(overwrite_by_pkeys=["k", "s"]) as batch:
            for (owner, bucket, minute), items in groups.items():
                batch.put_item(Item={"k": f"m#{owner}", "s": f"{minute}#{bucket}", **extra})
                for body, chunk in _pages(items):
                    page_id = hashlib.sha256("\0".join(t["task_id"] for t in chunk).encode()).hexdigest()[:20]
                    batch.put_item(Item={"k": _page_key(owner, bucket), "s": f"{minute}#{page_id}", "body": body,
                                         "n": len(chunk), **extra})
                    pages += 1
        return pages

    def get(self, owner: str, task_id: str) -> dict[str, Any] | None:
        return self.get_many(owner, [task_id]).get(task_id)

    def get_many(self, owner: str, task_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The owner's archived tasks among `task_ids` (one query per bucket)."""
        return self.get_some(owner, task_ids, None)[0]

    def get_some(self, owner: str, task_ids: Iterable[str], max_buckets: int | None
                 ) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """The owner's archived tasks among `task_ids`, reading the pages of at most
        `max_buckets` buckets (one query each; None: all), oldest first; and the ids of the
        buckets left unread, in their order."""
        wanted: dict[str, set[str]] = {}
        order: list[str] = []
        for tid in task_ids:
            wanted.setdefault(bucket_of(tid), set()).add(tid)
            order.append(tid)
        read = sorted(wanted) if max_buckets is None else sorted(wanted)[:max_buckets]
        found: dict[str, dict[str, Any]] = {}
        for bucket in read:
            ids = wanted[bucket]
            for item in self._read(Key("k").eq(_page_key(owner, bucket))):
                if item["task_id"] in ids:
                    found[item["task_id"]] = item | {"owner": owner}
        unread = set(wanted) - set(read)
        return found, [tid for tid in order if bucket_of(tid) in unread]

    def since(self, owner: str, since: float, limit: int) -> list[dict[str, Any]]:
        """The owner's archived tasks created at or after `since`, newest first (at most
        `limit`; whole minutes are read, so the cut is exact)."""
        by_minute: dict[str, list[str]] = {}
        cond = Key("k").eq(f"m#{owner}") & Key("s").gte(_minute(since))
        for marker in self._query(cond, forward=False):
            minute, bucket = marker["s"].split("#", 1)
            by_minute.setdefault(minute, []).append(bucket)
        out: dict[str, dict[str, Any]] = {}
        for minute in sorted(by_minute, reverse=True):
            if len(out) >= limit:
                break
            for bucket in by_minute[minute]:
                cond = Key("k").eq(_page_key(owner, bucket)) & Key("s").begins_with(f"{minute}#")
                for item in self._read(cond):
                    if float(item["created"]) >= since:
                        out.setdefault(item["task_id"], item | {"owner": owner})
        return sorted(out.values(), key=lambda i: i["created"], reverse=True)[:limit]

    def _read(self, cond: Any) -> Iterator[dict[str, Any]]:
        for page in self._query(cond):
            yield from _items_of(page["body"].value if hasattr(page["body"], "value") else page["body"])

    def _query(self, cond: Any, forward: bool = True) -> Iterator[dict[str, Any]]:
        kwargs: dict[str, Any] = {"KeyConditionExpression": cond, "ScanIndexForward": forward}
        while True:
            got = self.table.query(**kwargs)
            yield from got.get("Items", [])
            if "LastEvaluatedKey" not in got:
                return
            kwargs["ExclusiveStartKey"] = got["LastEvaluatedKey"]
