"""TaskStore: batch operations on the hot task store (lambdas/adapters/redis_store) --
creating tasks, memo hits, results and progress from agents, expired leases, cancels and
reads -- each state change one of the scripts; with the idempotency keys, the completion
streams and the history outbox of their own modules."""
from __future__ import annotations

import time
from typing import Any, Sequence

import orjson
import redis

from lambdas.adapters.redis_store.done import DoneStreams
from lambdas.adapters.redis_store.graph import TaskGraph
from lambdas.adapters.redis_store.idempotency import IdempotencyKeys
from lambdas.adapters.redis_store.lua_files import register
from lambdas.adapters.redis_store.lua_rows import (CancelReply, CreateRow, DirectRow, DoneNotice, ExpiredNotice,
                                                   FinishRow, MemoHitRow, ProgressRow, StatusReply, encode)
from lambdas.adapters.redis_store.outbox import HistoryOutbox
from lambdas.adapters.redis_store.rows import CANCEL_REASON, RECENT_MAX, Notice, TaskRow, decoded, slices
from skyfn.protocol.queues.redis_streams import SOCKET_TIMEOUT_S
from skyfn.protocol.states import parse_events


class TaskStore(IdempotencyKeys, DoneStreams, HistoryOutbox, TaskGraph):
    """Batch operations on the hot task store."""

    def __init__(self, client: redis.Redis, result_ttl: float = 600.0, unretrieved_ttl: float = 7 * 86400.0,
                 memo_ttl: float = 7 * 86400.0):
        self.r = client
        self.result_ttl = result_ttl
        self.unretrieved_ttl = unretrieved_ttl
        self.memo_ttl = memo_ttl
        self._memo_hit = register(client, "memo_hit")
        self._create = register(client, "create")
        self._finish = register(client, "finish")
        self._progress = register(client, "progress")
        self._expire = register(client, "expire")
        self._cancel = register(client, "cancel")
        self._status = register(client, "status")
        self._retrieved = register(client, "retrieved")
        self._direct = register(client, "direct")
        self._archived = register(client, "archived")
        self._history_read = register(client, "history_read")
        self._register_graph_scripts()

    @classmethod
    def from_url(cls, url: str, **kw: Any) -> "TaskStore":
        return cls(redis.Redis.from_url(url, socket_keepalive=True, health_check_interval=30,
                                        socket_timeout=SOCKET_TIMEOUT_S), **kw)

    # --- submission -------------------------------------------------------------
    def create(self, owner: str, submission_id: str, rows: Sequence[CreateRow], created: float, queued: float,
               submission_record: dict[str, Any] | None = None, only_if_new: bool = False) -> int:
        """rows: CreateRow (or lists in its order, its optional fields left out); all start
        QUEUED and count in load:<endpoint> until final (an empty endpoint_id: none). A
        task with a memo key caches its result when it SUCCEEDS. `submission_record` goes
        to the history outbox in the same script (see enqueue_submission_record), with the
        last slice: the tasks are created in slices (rows.SLICE), each all or none. Returns
        how many were created, or -1, creating nothing, when `only_if_new` and the first
        task exists (a retried submission; one that stopped between slices is finished by
        the caller, tasks.py _not_yet_queued)."""
        rows = _named(CreateRow, rows)
        parts = list(slices(rows)) or [rows]
        recent, first = f"recent:{owner}", f"first:{owner}"
        count = 0
        for i, part in enumerate(parts):
            endpoints = list(dict.fromkeys(r.endpoint_id for r in part if r.endpoint_id))
            record = b""
            if submission_record is not None and i == len(parts) - 1:
                record = b"sub:" + orjson.dumps(submission_record)
            made = int(self._create(
                keys=[recent, first, "outbox", *[f"t:{r.task_id}" for r in part], *[f"load:{ep}" for ep in endpoints]],
                args=[encode(part), f"{created:.6f}", owner, submission_id, f"{queued:.6f}", RECENT_MAX,
                      "1" if only_if_new and i == 0 else "0", record, *endpoints]))
            if made < 0:
                return -1
            count += made
        return count

    # --- memoization (skyfn.protocol.memo) -----------------------------------------
    def memo_lookup(self, owner: str, keys: list[str]) -> list[str | None]:
        """The cached result for each memo key, or None."""
        if not keys:
            return []
        return [decoded(v) for v in self.r.mget([f"memo:{owner}:{k}" for k in keys])]

    def create_memo_hits(self, owner: str, submission_id: str, rows: Sequence[MemoHitRow], created: float) -> int:
        """rows: MemoHitRow (or lists in its order): tasks answered from the cache, stored
        SUCCEEDED at once (ids that exist are left alone: a retried submission). Returns how
        many were created."""
        return self.create_memo_hits_notify(owner, submission_id, rows, created)[0]

    def create_memo_hits_notify(self, owner: str, submission_id: str, rows: Sequence[MemoHitRow],
                                created: float) -> tuple[int, list[Notice]]:
        """create_memo_hits, and the completion-stream entry it added (for the results push)."""
        if not rows:
            return 0, []
        rows = _named(MemoHitRow, rows)
        out = self._memo_hit(keys=[f"recent:{owner}", "outbox", f"done:{owner}", *[f"t:{r.task_id}" for r in rows]],
                             args=[encode(rows), f"{created:.6f}", f"{time.time():.6f}", owner, submission_id])
        if not out:
            return 0, []
        # those created: ids that existed (a retried submission) are not in it
        notice = _notice(DoneNotice._make(out))
        made = set(notice.ids)
        notice.statuses = {r.task_id: ("SUCCEEDED", r.result, None, None) for r in rows if r.task_id in made}
        return len(notice.ids), [notice]

    def fail_unqueued(self, task_ids: list[str], reason: str) -> list[Notice]:
        """Tasks stored but never enqueued (the queue refused them) are failed, not left
        hanging. Returns the notices of those it failed (for push.notify)."""
        return self.finish([FinishRow(task_id=tid, state="FAILED", reason=reason) for tid in task_ids])[3]

    # --- results and progress from agents ---------------------------------------
    def finish(self, rows: Sequence[FinishRow], endpoint_id: str = "") -> tuple[int, int, int, list[Notice]]:
        """rows: FinishRow (or lists in its order). With `endpoint_id` (results from an agent:
        the sender the caller authenticated), only tasks routed to that endpoint are
        finished, and their records say it produced them (`by`); others count as unknown.
        Returns (stored, duplicates ignored, unknown ids, notices): one notice per owner,
        with the statuses stored."""
        rows = _named(FinishRow, rows)
        stored, dup, unknown, notices = self.finish_notify(rows, endpoint_id)
        if notices:
            by_id = {r.task_id: r for r in rows}
            for n in notices:
                n.statuses = {tid: (by_id[tid].state, by_id[tid].result, by_id[tid].error, by_id[tid].reason)
                              for tid in n.ids}
        return stored, dup, unknown, notices

    def finish_notify(self, rows: Sequence[FinishRow], endpoint_id: str = "") -> tuple[int, int, int, list[Notice]]:
        """finish for the results function's hot path: the notices come without statuses
        (the caller passes its rows' to push.notify). A slice (rows.SLICE) per script call,
        as smaller packs would be: an owner gets a notice per slice."""
        totals, notices = [0, 0, 0], []
        sender = [f"load:{endpoint_id}"] if endpoint_id else []  # the only endpoint its tasks load
        for part in slices(_named(FinishRow, rows)):
            *counts, raw = self._finish(keys=["leases", "outbox", "settled", *[f"t:{r.task_id}" for r in part], *sender],
                                        args=[encode(part), f"{time.time():.6f}", self.unretrieved_ttl, endpoint_id,
                                              int(self.memo_ttl), self.result_ttl])
            totals = [t + int(c) for t, c in zip(totals, counts)]
            notices += [_notice(DoneNotice._make(n)) for n in raw or ()]
        return totals[0], totals[1], totals[2], notices

    def record_direct(self, rows: Sequence[DirectRow], endpoint_id: str) -> tuple[int, int, int]:
        """Tasks of direct sessions, created final: rows DirectRow (or lists in its order).
        Only rows whose session record ds:<session> is `endpoint_id`'s and names the
        function are stored, with the session's owner; the others count as unknown, tasks
        that exist already as duplicates. Returns (stored, duplicates, unknown)."""
        rows = _named(DirectRow, rows)
        stored, dup, unknown = self._direct(
            keys=["outbox", *[f"t:{r.task_id}" for r in rows], *[f"ds:{r.session}" for r in rows]],
            args=[encode(rows), f"{time.time():.6f}", endpoint_id, RECENT_MAX])
        return int(stored), int(dup), int(unknown)

    def mark_retrieved(self, task_ids: list[str]) -> None:
        """Results handed to their owner by the push: read now (they expire result_ttl later)."""
        for part in slices(task_ids):
            self._retrieved(keys=[f"t:{tid}" for tid in part], args=[f"{time.time():.6f}", self.result_ttl])

    def progress(self, rows: Sequence[ProgressRow], endpoint_id: str = "") -> int:
        """rows: ProgressRow (or lists in its order); with `endpoint_id`, only tasks routed
        to that endpoint move."""
        rows = _named(ProgressRow, rows)
        sender = [f"load:{endpoint_id}"] if endpoint_id else []  # the only endpoint its tasks load
        return int(self._progress(keys=["leases", *[f"t:{r.task_id}" for r in rows], *sender],
                                  args=[encode(rows), f"{time.time():.6f}", endpoint_id]))

    def expire_leases(self, limit: int = 5000) -> tuple[int, int, list[Notice]]:
        """Expired leases: (requeued, failed past their retry budget, notices of the failed)."""
        requeued, failed, raw = self._expire(keys=["leases", "outbox", "settled"],
                                             args=[f"{time.time():.6f}", limit, self.unretrieved_ttl, self.result_ttl])
        notices = []
        for n in map(ExpiredNotice._make, raw or ()):
            notice = _notice(n)
            notice.statuses = {tid: ("FAILED", None, None, decoded(why)) for tid, why in zip(notice.ids, n.reasons)}
            notices.append(notice)
        return int(requeued), int(failed), notices

    def cancel(self, owner: str, task_id: str) -> tuple[str, str | None, list[Notice]] | None:
        """('OK', endpoint, notices) when cancelled (the notice only when cancelled now: a
        retried cancel succeeds again, unannounced), (final state, None, []) when it finished
        otherwise, None when unknown."""
        out = self._cancel(keys=[f"t:{task_id}", "leases", "outbox", "settled", f"done:{owner}"],
                           args=[task_id, owner, f"{time.time():.6f}", self.result_ttl, CANCEL_REASON,
                                 self.unretrieved_ttl])
        if not out:
            return None
        reply = CancelReply(*out)
        notices = []
        if reply.cursor is not None:
            notices.append(Notice(owner, decoded(reply.prev), decoded(reply.cursor), [task_id],
                                  {task_id: ("CANCELLED", None, None, CANCEL_REASON)}))
        return decoded(reply.outcome), decoded(reply.endpoint_id), notices

    # --- reads ---------------------------------------------------------------------
    def status(self, owner: str, task_ids: list[str], with_events: bool = False,
               mark_retrieved: bool = True) -> dict[str, TaskRow | None]:
        raw = self._status(keys=[f"t:{tid}" for tid in task_ids],
                           args=[owner, f"{time.time():.6f}", self.result_ttl, "1" if with_events else "0",
                                 "1" if mark_retrieved else "0"])
        out: dict[str, TaskRow | None] = {}
        for tid, v in zip(task_ids, raw):
            if not v:
                out[tid] = None
                continue
            r = StatusReply._make(v)
            ev = decoded(r.events)
            out[tid] = TaskRow(tid, decoded(r.state), decoded(r.result), decoded(r.error), decoded(r.reason),
                               int(r.retries), parse_events(ev) if ev is not None else None, decoded(r.stdout),
                               decoded(r.stderr), decoded(r.endpoint_id), decoded(r.result_by))
        return out

    def recent(self, owner: str, since: float, limit: int) -> tuple[list[dict[str, str]], list[str], float | None]:
        """The owner's tasks created at or after `since`, newest first (at most `limit`):
        (records still in the hot store, with 'task_id'; ids whose record was purged; the
        time from which the index is complete, None when it may miss older ones)."""
        key = f"recent:{owner}"
        pipe = self.r.pipeline(transaction=False)
        pipe.zrevrangebyscore(key, "+inf", since, start=0, num=limit)
        pipe.zrange(key, 0, 0, withscores=True)
        pipe.zcard(key)
        pipe.get(f"first:{owner}")
        got, oldest, size, first = pipe.execute()
        ids = [i.decode() for i in got]
        if not oldest:  # nothing indexed: complete if the owner never submitted anything
            complete_from = 0.0 if first is None else None
        elif size >= RECENT_MAX or (first is not None and float(first) < float(oldest[0][1]) - 1):
            complete_from = float(oldest[0][1])  # trimmed, or expired after a month idle
        else:
            complete_from = 0.0  # every task the owner ever submitted is in it
        fields = ("o", "f", "e", "s", "c", "ev", "r", "why")
        pipe = self.r.pipeline(transaction=False)
        for tid in ids:
            pipe.hmget(f"t:{tid}", fields)
        out = []
        missing = []
        for tid, values in zip(ids, pipe.execute() if ids else []):
            if values[0] is not None:
                rec = {k: v.decode() for k, v in zip(fields, values) if v is not None}
                rec["task_id"] = tid
                out.append(rec)
            else:
                missing.append(tid)
        return out, missing, complete_from

    def owners(self, task_ids: set[str] | list[str]) -> dict[str, str]:
        """task id -> owner of the tasks in the hot store (one round trip)."""
        ids = list(task_ids)
        if not ids:
            return {}
        pipe = self.r.pipeline(transaction=False)
        self.owners_on(pipe, ids)
        return self.owners_from(ids, pipe.execute())

    @staticmethod
    def owners_on(pipe, task_ids: list[str]) -> None:
        """Queue the owner reads of `owners` on a caller's pipeline (one round trip with its own)."""
        for tid in task_ids:
            pipe.hget(f"t:{tid}", "o")

    @staticmethod
    def owners_from(task_ids: list[str], values: list) -> dict[str, str]:
        return {tid: o.decode() for tid, o in zip(task_ids, values) if o is not None}

    def record(self, task_id: str) -> dict[str, str]:
        raw = self.r.hgetall(f"t:{task_id}")
        return {k.decode(): v.decode() for k, v in raw.items()}


def _named(row: type, rows: Sequence[Any]) -> Sequence[Any]:
    """`rows` as `row`s (callers that still send lists in the row's order)."""
    if rows and not isinstance(rows[0], row):
        return [row(*r) for r in rows]
    return rows


def _notice(n: DoneNotice, statuses: dict | None = None) -> Notice:
    return Notice(decoded(n.owner), decoded(n.prev), decoded(n.cursor), decoded(n.ids).split(","), statuses or {})
