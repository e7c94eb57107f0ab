"""Dataflow in the service: tasks whose arguments are other tasks' results
(skyfn.protocol.dataflow), finished by the service and the agents with no client in the loop.

At submission (`inputs`, `store_waiting`) a task's inputs are checked -- each must be a task
of the caller's (403 otherwise), still known (404) and still holding its result (409) -- and
the task is stored WAITING with what its pack will need. When an input reaches a final state
the script that wrote it puts it on `settled`; `advance` (run by the results function after
each batch, by cancel, by submission and by the reaper's sweep) tells its dependents: the last
input to SUCCEED releases a dependent, which is then sent to its endpoint with its inputs'
results in an envelope (opaque buffers: nothing is unpickled here); any other end fails or
cancels the dependents, transitively. A dependent whose unfinished inputs all run on its own
(single-user) endpoint is parked instead: sent there at once, for the agent to release as
soon as its inputs' results exist there, with no trip through the service; an agent that
cannot hands it back (`unpark`) and it is sent again the usual way. The graph lives in the hot store (redis_store.graph),
so a service, agent or Redis restart loses none of it.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping

import orjson
from aws_lambda_powertools import Logger

from lambdas.adapters.redis_store.graph import Released
from lambdas.adapters.redis_store.lua_rows import FinishRow, WaitRow
from lambdas.adapters.redis_store.rows import RECENT_MAX
from lambdas.config import settings
from lambdas.core import deps
from lambdas.core.errors import Conflict, Forbidden, NotFound, ServiceError
from lambdas.core.tasks import blobs, push, registry
from lambdas.core.tasks.packs import pack_specs, task_queue, watch_dead_letters
from skyfn.protocol.api import SubmitTasks
from skyfn.protocol.dataflow import PARK_FEATURE, local_entry, make_envelope, parse_input

logger = Logger(service="skyfn-dataflow", child=True)
SETTLE_BATCH = 1000    # settled tasks per script call: a long cascade is cut into bounded steps
SETTLE_ROUNDS = 20     # script calls per advance; the rest waits for the next one
RELEASE_BATCH = 500    # released dependents taken to send at once
HOLD_SECONDS = 60.0    # a taken release not marked sent by then is offered again (its sender died)


class InvalidInput(ServiceError):
    code = "invalid_input"


class NotYourTask(Forbidden):
    code = "not_your_task"


class InputGone(Conflict):
    code = "input_gone"


def inputs_of(owner: str, req: SubmitTasks, task_ids: list[str]) -> dict[int, list[str]]:
    """Index -> input task ids of the tasks of `req` that have inputs ('#k' made the id of
    the request's k-th task). Refuses, before anything is stored, an input that is not a
    task id of the caller's or no longer holds its result."""
    out: dict[int, list[str]] = {}
    outside: set[str] = set()
    for i, t in enumerate(req.tasks):
        if not t.inputs:
            continue
        ids = []
        for text in t.inputs:
            try:
                tid, k = parse_input(text, i)
            except ValueError as exc:
                raise InvalidInput(f"tasks[{i}].inputs: {exc}") from None
            ids.append(task_ids[k] if tid is None else tid)
            if tid is not None:
                outside.add(tid)
        out[i] = ids
    _check_owned(owner, sorted(outside - set(task_ids)))
    return out


def _check_owned(owner: str, ids: list[str]) -> None:
    if not ids:
        return
    owners = deps.store().owners_of(ids)
    for tid, o in owners.items():
        if o is not None and o != owner:
            raise NotYourTask(f"input task {tid} is not a task of yours: a task may only take the results of "
                              "its submitter's own tasks")
    gone = [tid for tid, o in owners.items() if o is None]
    if not gone:
        return
    known = deps.dynamo().get_tasks(owner, gone[:100])
    for tid in gone:
        hist = known.get(tid)
        if hist is None:
            raise NotFound(f"input task {tid} not found: an input must be a task of yours, submitted earlier "
                           "(or earlier in the same request)")
        raise InputGone(f"input task {tid} ended {hist['state']} and the service no longer keeps its result "
                        "(its retention ended): submit it again and pass the new future")


def parks(record: Mapping[str, str] | None) -> bool:
    """Whether an endpoint's agent releases parked dependents (its heartbeats say so)."""
    return PARK_FEATURE in ((record or {}).get("ft") or "").split(",")


def waiting_row(task_id: str, function_id: str, endpoint_id: str, max_retries: int, tag: str | None,
                inputs: list[str], spec: dict[str, Any], extra: dict[str, Any], multi_user: bool,
                parkable: bool = False) -> WaitRow:
    """A row of store_waiting: the task and what its pack will carry once released.
    `parkable`: its endpoint's agent releases parked dependents (`parks`); a multi-user
    endpoint's lanes do not share their workers' results, and GlobusFiles are staged first."""
    pack = {"spec": spec, "extra": extra}
    if multi_user:
        pack["mu"] = 1
    staged = spec.get("stage_in") or spec.get("stage_out")
    return WaitRow(task_id, function_id, endpoint_id, max_retries, tag, inputs, orjson.dumps(pack).decode(),
                   parkable and not (multi_user or staged))


def store_waiting(owner: str, submission_id: str, rows: list[WaitRow], created: float) -> None:
    """Store tasks with inputs (waiting_row rows, in request order) and send those whose
    inputs all SUCCEEDED already; those an input already failed end at once (announced)."""
    store = deps.store()
    _, released, notices = store.create_waiting(owner, submission_id, rows, created, RECENT_MAX)
    push.notify(notices)
    if released:
        release()


def advance(store=None) -> dict[str, int]:
    """Tell the dependents of tasks that reached a final state, then send the dependents
    released. Cheap when there is nothing to do (one round trip)."""
    store = store or deps.store()
    settled_n, release_n = store.graph_backlog()
    out = {"settled": 0, "released": 0, "ended": 0, "sent": 0}
    for _ in range(SETTLE_ROUNDS if settled_n else 0):
        n, released, notices, left = store.settle(SETTLE_BATCH)
        push.notify(notices)
        out["settled"] += n
        out["released"] += released
        out["ended"] += sum(len(x.ids) for x in notices)
        if not left:
            break
    if release_n or out["released"]:
        out["sent"] = release(store)
    return out


def unpark(endpoint_id: str, task_ids: list[str], store=None) -> int:
    """Parked dependents the agent of `endpoint_id` handed back: those whose inputs are done
    are sent again now, with their inputs' results; the others are released as usual when
    they are."""
    store = store or deps.store()
    n = store.unpark(task_ids, endpoint_id)
    if n:
        release(store)
    return n


def sweep(store=None) -> dict[str, int]:
    """The reaper's turn: releases whose sender died are offered again, and whatever the
    last results batches left (a cascade cut short, a send that failed) is carried on."""
    store = store or deps.store()
    out = {"requeued_releases": store.sweep_releasing()}
    out.update(advance(store))
    return out


def release(store=None) -> int:
    """Send released dependents to their endpoints; returns how many were sent. A group that
    cannot be sent now stays taken and is offered again after HOLD_SECONDS."""
    store = store or deps.store()
    sent = 0
    while True:
        batch = store.take_released(RELEASE_BATCH, HOLD_SECONDS)
        if not batch:
            return sent
        groups: dict[tuple, list[Released]] = defaultdict(list)
        for r in batch:
            extra = r.pack.get("extra") or {}
            groups[(r.endpoint_id, r.owner, orjson.dumps(extra, option=orjson.OPT_SORT_KEYS), r.pack.get("mu", 0))
                   ].append(r)
        for (endpoint_id, owner, _, mu), items in groups.items():
            try:
                done = _send(store, endpoint_id, owner, items[0].pack.get("extra") or {}, bool(mu), items)
            except Exception as exc:  # the queue or S3 refused: offered again after HOLD_SECONDS
                logger.warning("released dependents not sent", extra={"endpoint": endpoint_id, "tasks": len(items),
                                                                      "error": type(exc).__name__})
                continue
            store.mark_released(done)
            sent += len(done)
        if len(batch) < RELEASE_BATCH:
            return sent


def _send(store, endpoint_id: str, owner: str, extra: dict[str, Any], multi_user: bool,
          items: list[Released]) -> list[str]:
    """Send one endpoint's released dependents of one submitter; the ids dealt with (sent, or
    failed here because an input's result or the function is gone)."""
    done = [r.task_id for r in items]
    try:
        functions = registry.function_bodies(owner, {r.pack["spec"]["function_id"] for r in items})
    except NotFound as exc:  # a function deleted while its callers waited
        push.notify(store.finish([FinishRow(task_id=tid, state="FAILED", reason=f"could not be sent: {exc.message}")
                                  for tid in done])[3])
        return done
    failed: list[FinishRow] = []
    specs: list[dict[str, Any]] = []
    for r in items:
        spec, why = _released_spec(owner, r)
        if spec is None:
            failed.append(FinishRow(task_id=r.task_id, state="FAILED", reason=why))
        else:
            specs.append(spec)
    if specs:
        bodies = {fid: f.body for fid, f in functions.items()}
        queue = task_queue(endpoint_id, multi_user, extra.get("identity") or {"id": owner}, extra.get("user_config"))
        queue.send(list(pack_specs(endpoint_id, specs, bodies, functions, owner, extra)))
        watch_dead_letters([endpoint_id])
    if failed:
        push.notify(store.finish(failed)[3])
    return done


def _released_spec(owner: str, r: Released) -> tuple[dict[str, Any] | None, str]:
    """The task spec to send, its payload the envelope of its arguments and its inputs'
    results; (None, why) when an input's result is gone. A parked task goes ahead of its
    unfinished inputs: those are listed in `after`, their entries left for its agent."""
    spec = dict(r.pack["spec"])
    args = spec.pop("payload")
    spec.pop("payload_url", None)  # presigned at submission: made again, fresh
    entries = []
    after = []
    for tid, result in zip(r.inputs, r.results):
        if result is None and r.parked:
            entries.append(local_entry(tid))
            after.append(tid)
            continue
        if result is None:
            return None, (f"DependencyFailed: input task {tid} ended EXPIRED: its result is no longer kept "
                          "(the service lost it): submit the input again")
        url = blobs.input_url(result)
        entries.append({"task_id": tid, "url": url} if url else {"task_id": tid, "result": result})
    if after:
        spec["after"] = after
    text = make_envelope(args, entries, blobs.payload_url(args))
    if len(text) > settings().inline_bytes and blobs.enabled():  # too large to travel in the pack
        ref = blobs.put_payload(owner, text)
        spec["payload"], spec["payload_url"] = ref, blobs.payload_url(ref)
    else:
        spec["payload"] = text
    return spec, ""
