"""Task submission, status and cancellation: the service's hot path.

A submission is validated, stored in the hot store (state QUEUED), packed per endpoint
into TaskPacks (with the bodies of the functions they call, the submitter's identity
claims and the request's user_config, which a multi-user endpoint maps and renders:
lambdas/core/identity/submitters.py) and sent to each endpoint's queue -- or, at a
multi-user endpoint, to the lane of the user agent the submitter's (identity, config key)
is bound to (lambdas/core/identity/lanes.py). Nothing per task touches DynamoDB: the
submission record is written there off the hot path through the history outbox.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

from aws_lambda_powertools import Logger

from lambdas.adapters.redis_store.lua_rows import CreateRow, FinishRow, MemoHitRow
from lambdas.adapters.redis_store.rows import TaskRow
from lambdas.config import settings
from lambdas.core import deps
from lambdas.core.identity import allowlist, lanes, submitters
from lambdas.core.tasks import backlog, blobs, dataflow, groups, idempotency, memo, push, registry
from lambdas.core.tasks.packs import pack_extra, packs, task_queue, task_spec, watch_dead_letters
from lambdas.core.errors import Conflict, NotFound, ServiceError, Unavailable
from lambdas.core.ids import is_uuid, keyed_ids, new_id, new_ids
from skyfn.protocol.api import SubmitTasks, TaskInfo, TaskStatus
from skyfn.protocol.blobs import HEADER as BLOB_HEADER
from skyfn.protocol.states import FINAL_STATES, parse_events
from skyfn.protocol.user_config import problem as user_config_problem

logger = Logger(service="skyfn-tasks", child=True)
HISTORY_PAGES = 64  # page groups (a second of task ids each) of the durable history one status call reads
CLAIM_SECONDS = 15  # an idempotency key is held this long by an attempt that may have died


class InvalidUserConfig(ServiceError):
    code = "invalid_user_config"


def submit(owner: str, req: SubmitTasks, task_ids: list[str] | None = None,
           submitter: dict[str, str] | None = None) -> tuple[dict[str, Any], bool]:
    """Returns (Submitted body, replayed). `task_ids`, one per task, are ids assigned
    beforehand (a batch's ids are handed out before its chunks are routed). `submitter`:
    the caller's identity claims (lambdas.auth.Identity.claims); without them (runs submit
    on the owner's behalf) the packs carry the claims last seen for the owner."""
    if task_ids is not None and len(task_ids) != len(req.tasks):
        raise ValueError(f"{len(task_ids)} task ids for {len(req.tasks)} tasks")
    if req.user_config is not None:  # refused before the idempotency key is claimed
        why = user_config_problem(req.user_config)
        if why is not None:
            raise InvalidUserConfig(why)
    key = req.idempotency_key

    def same_size(previous: dict[str, Any]) -> None:
        if len(previous["task_ids"]) != len(req.tasks):
            raise Conflict(f"idempotency key {key!r} was used for a request of {len(previous['task_ids'])} "
                           f"tasks, this one has {len(req.tasks)}: use a new key for a new request")

    # The claim is short: if the attempt holding it died (a service restart), a retry
    # proceeds after CLAIM_SECONDS and, with the same ids, completes what it began.
    def busy() -> Unavailable:
        return Unavailable(f"a request with idempotency key {key!r} is still being processed: retry it in a moment")

    backlog.check()  # 429 backlog while the archiver is behind: before anything is stored or claimed
    return idempotency.submit_once(owner, key, lambda: _submit(owner, req, task_ids, submitter), busy=busy,
                                   claim_seconds=CLAIM_SECONDS, check=same_size,
                                   pack=lambda answer: _pack_answer(owner, key, answer),
                                   unpack=lambda stored: _unpack_answer(owner, key, stored))


def _pack_answer(owner: str, key: str, answer: dict[str, Any]) -> bytes:
    """A keyed submission's answer as kept for its replays: when its ids are the ones its
    key derives (keyed_ids), their count alone (b'k:<n>'), not 37 bytes per task. The ids are
    all derived or all assigned beforehand (a batch's), and keyed_ids(.., 1) is the first of
    keyed_ids(.., n): comparing the first id tells which, without making n ids again."""
    ids = answer["task_ids"]
    if (ids and answer["submission_id"] == keyed_ids(owner, key, 1, "submission")[0]
            and ids[0] == keyed_ids(owner, key, 1)[0]):
        return b"k:%d" % len(ids)
    return orjson.dumps(answer)


def _unpack_answer(owner: str, key: str, stored: bytes) -> dict[str, Any]:
    if stored.startswith(b"k:"):
        n = int(stored[2:])
        return {"submission_id": keyed_ids(owner, key, 1, "submission")[0], "task_ids": keyed_ids(owner, key, n),
                "replayed": False}
    return orjson.loads(stored)


def _submit(owner: str, req: SubmitTasks, task_ids: list[str] | None = None,
            submitter: dict[str, str] | None = None) -> dict[str, Any]:
    created = time.time()
    tasks = req.tasks
    blobs.check_payloads(owner, tasks)  # S3 references must be the caller's own uploads
    # the endpoints named are read with the functions, in one round trip
    named = {t.endpoint_id for t in tasks if t.endpoint_id} | ({req.endpoint_id} if req.endpoint_id else set())
    records: dict[str, dict[str, str]] = {}
    functions = registry.function_bodies(owner, {t.function_id for t in tasks}, endpoints=named, records=records)
    bodies = {fid: f.body for fid, f in functions.items()}
    containers = {fid: f.container for fid, f in functions.items()}
    # each task's endpoint: its own or the batch's, or one its endpoint group's policy picks
    routing = groups.route(owner, req, containers, {fid: f.tag for fid, f in functions.items()}, records)
    # endpoints that list their allowed functions refuse the others (403), before anything is stored
    allowlist.enforce(zip(routing.endpoints, (t.function_id for t in tasks)), functions, routing.records)
    store = deps.store()
    memo_keys = memo.keys(req, functions)
    cached = memo.hits(store, owner, memo_keys)  # answered from the cache: never queued
    # who submitted them (the caller's claims, kept for later runs below; or the ones kept for the owner)
    who = submitters.identity(owner, submitter, keep=False)

    key = req.idempotency_key
    submission_id = keyed_ids(owner, key, 1, "submission")[0] if key else new_id()
    task_ids = task_ids or (keyed_ids(owner, key, len(tasks)) if key else new_ids(len(tasks)))
    inputs = dataflow.inputs_of(owner, req, task_ids) if any(t.inputs for t in tasks) else {}
    by_endpoint: dict[str, list[int]] = {}
    rows, hit_rows, waiting = [], [], []
    for i, (tid, t) in enumerate(zip(task_ids, tasks)):
        ep = routing.endpoints[i]
        tag = routing.tags.get(t.function_id)
        if i in cached:
            mk, result = cached[i]
            hit_rows.append(MemoHitRow(task_id=tid, function_id=t.function_id, endpoint_id=ep or "", result=result,
                                       memo_key=mk, tag=tag))
            continue
        if ep and i in inputs:  # WAITING for its inputs, sent when they SUCCEEDED (dataflow.py)
            waiting.append(dataflow.waiting_row(
                tid, t.function_id, ep, t.max_retries if t.max_retries is not None else req.max_retries, tag,
                inputs[i], task_spec(tid, t, containers, routing.tags),
                pack_extra(owner, who, req.user_config), lanes.multi_user(routing.records.get(ep)),
                dataflow.parks(routing.records.get(ep))))
            continue
        if ep:
            by_endpoint.setdefault(ep, []).append(i)
        rows.append(CreateRow(task_id=tid, function_id=t.function_id, endpoint_id=ep,
                              max_retries=t.max_retries if t.max_retries is not None else req.max_retries,
                              tag=tag, memo_key=memo_keys[i]))

    if hit_rows:
        _, notices = store.create_memo_hits_notify(owner, submission_id, hit_rows, created)
        push.notify(notices, {r.task_id: ("SUCCEEDED", r.result, None, None) for r in hit_rows})
    record = {"submission_id": submission_id, "owner": owner, "created": created, "task_count": len(task_ids),
              "endpoints": sorted(by_endpoint), "idempotency_key": req.idempotency_key,
              "first_task_id": task_ids[0], "last_task_id": task_ids[-1]}
    queued = time.time()
    # the submission's history record goes out in the same script; with a key this may be
    # the retry of an attempt that stored its tasks and then failed: the script says so
    if rows and store.create(owner, submission_id, rows, created, queued, submission_record=record,
                             only_if_new=bool(key)) < 0:
        rows, by_endpoint = _not_yet_queued(store, rows, by_endpoint, task_ids)
        if rows:
            store.create(owner, submission_id, rows, created, queued, submission_record=record)
    if routing.refused:  # the group's policy placed them nowhere (followup: fail)
        push.notify(store.finish([FinishRow(task_id=task_ids[i], state="FAILED", reason=reason)
                                  for i, reason in routing.refused.items() if i not in cached])[3])
    sent: set[str] = set()
    sent_to: list[str] = []
    try:
        for ep, indices in by_endpoint.items():
            queue = task_queue(ep, lanes.multi_user(routing.records.get(ep)), who, req.user_config)
            queue.send(list(packs(ep, indices, task_ids, tasks, bodies, containers, routing.tags, functions,
                                    owner=owner, identity=who, user_config=req.user_config)))
            sent.update(task_ids[i] for i in indices)
            sent_to.append(ep)
        watch_dead_letters(sent_to)
    except Exception as exc:
        if sent_to:
            watch_dead_letters(sent_to)
        if not key:  # nobody can retry these: fail them; with a key the retry sends them
            push.notify(store.fail_unqueued([tid for tid in task_ids if tid not in sent], f"could not be queued: {exc}"))
        raise Unavailable(f"the task queue refused the submission ({type(exc).__name__}); retry with the same "
                          "idempotency key") from exc
    submitters.remember(owner, submitter)  # for later runs: after the tasks left, its round trip is not theirs
    if waiting:  # after the others are on their way: a graph's first tasks start while its dependents are stored
        dataflow.store_waiting(owner, submission_id, waiting, created)
    if not rows:  # none went through CREATE, which writes it
        store.enqueue_submission_record(record)
    return {"submission_id": submission_id, "task_ids": task_ids, "replayed": False}


def _not_yet_queued(store, rows, by_endpoint, task_ids):
    """For a keyed submission whose ids may exist already: the rows still to create and,
    per endpoint, the tasks still to send (new ones and ones still QUEUED: the earlier
    attempt may have failed before sending them; sending one twice only runs it twice,
    its result is stored once). Tasks that moved on are left alone."""
    ids = [row.task_id for row in rows]  # memo hits are not among them: they are never queued
    states = deps.task_fields().states(ids)
    rows = [row for row, s in zip(rows, states) if s is None]
    state_of = dict(zip(ids, states))
    resend = {i for i, tid in enumerate(task_ids) if tid in state_of and state_of[tid] in (None, b"QUEUED")}
    by_endpoint = {ep: kept for ep, indices in by_endpoint.items() if (kept := [i for i in indices if i in resend])}
    logger.info("idempotent retry", extra={"existing": len(ids) - len(rows), "resent": len(resend)})
    return rows, by_endpoint


@dataclass
class HistoryRow(TaskRow):
    """A task purged from the hot store, as the durable history tells it: without its
    result (the history keeps none), and when it finished."""
    finished: float | None = None


def result_expired(row: TaskRow) -> dict[str, Any] | None:
    """A SUCCEEDED task read from the history has lost its result: say so (ExpiredResult),
    with the retention that applied, rather than answer it without one."""
    if not isinstance(row, HistoryRow) or row.state != "SUCCEEDED":
        return None
    s = settings()
    return {"finished": row.finished, "result_ttl": s.result_ttl, "unretrieved_ttl": s.unretrieved_ttl}


def _status_dict(row, results: bool = True) -> dict[str, Any]:
    d: dict[str, Any] = {"task_id": row.task_id, "state": row.state, "retries": row.retries}
    if results and row.result is not None:
        d["result"] = row.result
        if row.result.startswith(BLOB_HEADER):
            d["result_url"] = blobs.result_url(row.result)
    if row.error is not None:
        d["error"] = row.error
    if ("result" in d or "error" in d) and row.endpoint_id is not None:  # what the SDK checks before decoding
        d["endpoint_id"] = row.endpoint_id
        if row.result_by is not None:
            d["result_by"] = row.result_by
    if row.reason is not None:
        d["reason"] = row.reason
    if row.events is not None:
        d["events"] = row.events
    if results and row.stdout is not None:
        d["stdout"] = row.stdout
    if results and row.stderr is not None:
        d["stderr"] = row.stderr
    expired = result_expired(row)
    if expired is not None:
        d["result_expired"] = expired
    return d


def status(owner: str, task_ids: list[str], wait: float, include_events: bool,
           cursor: str | None = None, peek: bool = False, results: bool = True) -> dict[str, Any]:
    """Status of many tasks; with wait > 0, long-poll until at least one is final.

    Without a cursor every id is read and answered. With the cursor of a previous answer
    only the tasks that finished since then are read and returned, so a client polling for
    thousands of outstanding tasks costs the service O(finished), not O(outstanding).
    A read marks the final tasks' results retrieved (purged result_ttl later) unless it
    only `peek`s; without `results` the answer leaves out what the functions produced.
    Tasks purged from the hot store are answered from the durable history, HISTORY_PAGES
    seconds of task ids a call: the ids beyond are answered as `later` (ask again), never
    as `unknown`, which names only ids the service does not have.
    """
    store = deps.store()
    ids = list(dict.fromkeys(task_ids))
    deadline = time.monotonic() + wait
    rows: dict[str, Any] = {}
    unknown: list[str] = []
    later: list[str] = []

    def read(some: list[str]) -> dict[str, Any]:
        return store.status(owner, some, include_events, mark_retrieved=not peek)

    def answer() -> dict[str, Any]:
        return {"tasks": {tid: _status_dict(row, results) for tid, row in rows.items() if row is not None},
                "unknown": unknown, "later": later, "cursor": cursor}

    if cursor is None or not store.cursor_valid(owner, cursor):
        cursor = store.done_cursor(owner)  # taken before the read: nothing finishing later is missed
        rows = read(ids)
        unknown, later = _from_history(owner, rows, include_events)
        known_final = any(r is not None and r.state in FINAL_STATES for r in rows.values())
        if known_final or wait <= 0 or later or len(unknown) == len(ids):
            return answer()
    else:
        cursor, done = store.done_since(owner, cursor)
        changed = [tid for tid in ids if tid in done]
        if changed or wait <= 0:
            rows = read(changed)
            unknown, later = _from_history(owner, rows, include_events)  # purged since: answered, never dropped
            return answer()
    wanted = set(ids)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return answer()
        cursor, done = store.wait_done(owner, cursor, min(remaining, 5.0))
        changed = [tid for tid in done if tid in wanted]
        if changed:
            rows.update(read(changed))
            return answer()


def _from_history(owner: str, rows: dict[str, Any], include_events: bool) -> tuple[list[str], list[str]]:
    """Fill in tasks purged from the hot store from the durable history (HISTORY_PAGES of
    it); return (unknown, later): the ids neither holds, and those whose pages were left
    for another call (dropped from `rows`)."""
    purged = [tid for tid, row in rows.items() if row is None and is_uuid(tid)]
    found, later = deps.dynamo().get_some_tasks(owner, purged, HISTORY_PAGES) if purged else ({}, [])
    for tid, hist in found.items():
        rows[tid] = _history_row(hist, include_events)
    for tid in later:
        del rows[tid]
    return [tid for tid, row in rows.items() if row is None], later


def _history_row(hist: dict[str, Any], include_events: bool) -> HistoryRow:
    events = parse_events(hist.get("events"))
    finished = next((ts for state, ts in reversed(events) if state in FINAL_STATES), None)
    return HistoryRow(hist["task_id"], hist["state"], None, hist.get("error"), hist.get("reason"),
                      int(hist.get("retries", 0)), events if include_events else None, finished=finished)


def get(owner: str, task_id: str, peek: bool = False) -> TaskInfo:
    """One task. Reading a finished task marks its result retrieved (purged
    SKYFN_RESULT_TTL later) unless `peek`."""
    store = deps.store()
    rec = store.record(task_id)
    if not rec or rec.get("o") != owner:
        hist = deps.dynamo().get_task(owner, task_id) if is_uuid(task_id) else None
        if not hist:
            raise NotFound(f"task {task_id} not found")
        row = _history_row(hist, True)
        return TaskInfo(task_id=task_id, state=hist["state"], error=hist.get("error"), reason=hist.get("reason"),
                        retries=int(hist.get("retries", 0)), events=row.events, result_expired=result_expired(row),
                        function_id=hist["function_id"], endpoint_id=hist["endpoint_id"],
                        submission_id=hist["submission_id"], owner=owner, created=float(hist["created"]))
    if rec["s"] in FINAL_STATES and not peek:
        store.status(owner, [task_id])  # marks it retrieved, so it is purged after the TTL
    return TaskInfo(task_id=task_id, state=rec["s"], result=rec.get("res"), result_url=blobs.result_url(rec.get("res")),
                    error=rec.get("err"), result_by=rec.get("by"),
                    reason=rec.get("why"), stdout=rec.get("so"), stderr=rec.get("se"), retries=int(rec.get("r", 0)), events=parse_events(rec.get("ev")),
                    function_id=rec["f"], endpoint_id=rec["e"], submission_id=rec["sub"], owner=owner,
                    created=float(rec["c"]))


def cancel(owner: str, task_id: str) -> TaskStatus:
    outcome = deps.store().cancel(owner, task_id)
    if outcome is None:
        raise NotFound(f"task {task_id} not found")
    state, endpoint_id, notices = outcome
    push.notify(notices)  # the owner's connections learn it as they learn results
    if state == "OK":
        dataflow.advance()  # its dependents are cancelled too
    if state != "OK":
        raise Conflict(f"task {task_id} is already {state}: only tasks that have not finished can be cancelled")
    try:  # tell the agent, so a running task is stopped; the state is CANCELLED either way
        queue, _ = deps.control_queue(endpoint_id)
        queue.send([orjson.dumps({"cancel": [task_id]})])
    except Exception as exc:
        logger.warning("cancel notice not delivered", extra={"task": task_id, "error": type(exc).__name__})
    return TaskStatus(task_id=task_id, state="CANCELLED", reason="cancelled by its owner")

