"""Endpoint groups: some of the owner's endpoints plus an aAPP placement policy. A task
submitted to a group (`group_id` instead of `endpoint_id`) is placed on one member by
skyfn.placement — the engine the agent's interchange uses to pick managers.

Workers of the policy are the members' names (default: each endpoint's registered name).
The live state is read from the hot store for each submission, in one round trip
(lambdas/adapters/redis_store/group_store.py):
  - load:<endpoint> (lambdas/adapters/redis_store): unfinished tasks per function tag, counted up when a
    task is queued there and down when it becomes final, in the same scripts as the state
    changes — so affinity sees what is queued or running on each endpoint, and
    shortest_backlog weighs queue depth plus in-flight tasks (Balsam's backlog);
  - ep:<endpoint>: status (an `offline` endpoint is invalid; `new` ones queue work) and
    the worker count of the last heartbeat (capacity: 0 = unknown).
Decisions for a batch are taken one by one against that snapshot, each counting on the
previous ones. Concurrent requests to one group decide on their own snapshots, so a
`max_concurrent_invocations` limit can be overshot by what another request placed at the
same instant. Round-robin positions persist in grp:<id>:rr between requests.

A task the policy cannot place (no valid member, `followup: fail`) is created FAILED with
the decision's reason, as the paper's `fail` prescribes; the rest of the batch runs.
Groups are stored in DynamoDB (endpoints table, 'group#<id>') and cached in grp:<id>.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import orjson

from lambdas.core import deps
from lambdas.core.identity import access
from lambdas.core.tasks import registry
from lambdas.core.errors import Invalid, NotFound
from lambdas.core.ids import is_uuid, new_id
from skyfn.placement import LiveState, Policy, PolicyError, Scheduler, load_policy
from skyfn.protocol.api import CreateEndpointGroup, SubmitTasks

DEFAULT_POLICY = "default:\n  - workers: \"*\"\n    strategy: shortest_backlog\n"
MAX_REASON = 2000


class InvalidGroup(Invalid):
    code = "invalid_group"


class InvalidPolicy(Invalid):
    code = "invalid_policy"


@dataclass
class Routing:
    """Where each task of a submission goes."""

    endpoints: list[str]                                   # '' for a task the policy refused
    tags: dict[str, Optional[str]] = field(default_factory=dict)   # function id -> tag
    refused: dict[int, str] = field(default_factory=dict)  # task index -> reason
    # endpoint -> its hot record, for the endpoints routing read (named directly, group members)
    records: dict[str, dict[str, str]] = field(default_factory=dict)


@functools.lru_cache(maxsize=256)
def _policy(text: str) -> Policy:
    return load_policy(text, source="policy")


# --- create / read ----------------------------------------------------------------------
def create(owner: str, body: CreateEndpointGroup) -> dict[str, Any]:
    members: list[dict[str, str]] = []
    names: dict[str, int] = {}
    ids: set[str] = set()
    for i, m in enumerate(body.members):
        try:
            ep = registry.endpoint_info(owner, m.endpoint_id)
        except NotFound:
            raise InvalidGroup(f"members[{i}]: endpoint {m.endpoint_id} not found: list yours with "
                               "Client.list_endpoints()") from None
        name = m.name or ep.name
        if m.endpoint_id in ids:
            raise InvalidGroup(f"members[{i}]: endpoint {m.endpoint_id} is listed twice")
        if name in names:
            raise InvalidGroup(f"members[{i}]: the name {name!r} is taken by members[{names[name]}]: give "
                               "each member its own name (members[].name)")
        ids.add(m.endpoint_id)
        names[name] = i
        members.append({"name": name, "endpoint_id": m.endpoint_id})
    text = body.policy if body.policy is not None else DEFAULT_POLICY
    try:
        policy = _policy(text)
    except PolicyError as exc:
        raise InvalidPolicy(f"policy rejected: {'; '.join(str(p) for p in exc.problems)}", exc.details()) from None
    unknown = policy.check_workers(names)
    if unknown:
        raise InvalidPolicy(f"policy rejected: {'; '.join(str(p) for p in unknown)} (the policy's workers are "
                            "the members' names)", [p.as_dict() for p in unknown])
    item = {"group_id": new_id(), "group_owner": owner, "name": body.name, "created": time.time(),
            "members": orjson.dumps(members).decode(), "policy": text}
    deps.dynamo().put_group(item)
    _cache(item)
    return info(owner, item["group_id"])


def _cache(item: dict[str, Any]) -> None:
    deps.group_store().cache(item["group_id"], item["group_owner"], item["name"], item["created"], item["members"],
                             item["policy"])


def _record(owner: str, group_id: str) -> dict[str, Any]:
    raw = deps.group_store().record(group_id)
    if not raw:
        item = deps.dynamo().get_group(group_id) if is_uuid(group_id) else None
        if item is not None:
            _cache(item)
            raw = {"o": item["group_owner"], "name": item["name"], "c": str(item["created"]),
                   "members": item["members"], "policy": item["policy"]}
    if not raw or not access.allows("endpoint-group", group_id, raw["o"], owner):  # owner or shared (access.py)
        raise NotFound(f"endpoint group {group_id} not found: create one with Client.create_group(...)")
    return {"group_id": group_id, "owner": raw["o"], "name": raw["name"], "created": float(raw["c"]),
            "members": orjson.loads(raw["members"]), "policy": raw["policy"]}


def live_state(members: list[dict[str, str]]) -> tuple[LiveState, dict[str, dict[str, Any]]]:
    """The members as placement workers, read in one Redis round trip; also the raw figures."""
    answers = deps.group_store().live([m["endpoint_id"] for m in members])
    state = LiveState()
    figures: dict[str, dict[str, Any]] = {}
    for m, (load, st, stats) in zip(members, answers):
        counts = {k: v for k, v in load.items() if v > 0}
        untagged = counts.pop("_", 0)
        try:
            capacity = int(orjson.loads(stats).get("workers") or 0) if stats else 0
        except (ValueError, TypeError, AttributeError):
            capacity = 0
        status = st or "new"
        state.upsert(m["name"], capacity=max(0, capacity), online=status != "offline")
        state.set_running(m["name"], counts, untagged=untagged)
        figures[m["name"]] = {"status": status, "capacity": max(0, capacity), "tags": counts,
                              "backlog": sum(counts.values()) + untagged}
    return state, figures


def info(owner: str, group_id: str) -> dict[str, Any]:
    rec = _record(owner, group_id)
    _, figures = live_state(rec["members"])
    policy = _policy(rec["policy"])
    return {"group_id": group_id, "name": rec["name"], "owner": rec["owner"], "created": rec["created"],
            "policy": rec["policy"], "warnings": [w.as_dict() for w in policy.warnings],
            "members": [{"name": m["name"], "endpoint_id": m["endpoint_id"], **figures[m["name"]]}
                        for m in rec["members"]]}


# --- routing a submission ---------------------------------------------------------------
def route(owner: str, req: SubmitTasks, containers: dict[str, Optional[str]],
          tags: Optional[dict[str, Optional[str]]] = None,
          records: Optional[dict[str, dict[str, str]]] = None) -> Routing:
    """Resolve every task's endpoint: its own or the batch's endpoint_id, or a member of its
    (or the batch's) group chosen by the group's policy. `tags`: the functions' tags when
    the caller has read them already (registry.function_bodies), else they are read;
    `records`: endpoints' hot records it read with them (the others are read here)."""
    tasks = req.tasks
    if req.endpoint_id and req.group_id:
        raise InvalidGroup("give the batch an endpoint_id or a group_id, not both")
    targets: list[tuple[str, str]] = []
    for i, t in enumerate(tasks):
        if t.endpoint_id and t.group_id:
            raise InvalidGroup(f"task {i} has both endpoint_id and group_id: give one")
        if t.endpoint_id or t.group_id:
            targets.append(("e", t.endpoint_id) if t.endpoint_id else ("g", t.group_id))
        elif req.endpoint_id or req.group_id:
            targets.append(("e", req.endpoint_id) if req.endpoint_id else ("g", req.group_id))
        else:
            raise NotFound(f"task {i} has no endpoint: give endpoint_id or group_id for the batch or for each task")
    read = records or {}
    records = {ep: registry.check_endpoint(owner, ep, read.get(ep)) for ep in {v for k, v in targets if k == "e"}}
    routing = Routing(endpoints=[v if k == "e" else "" for k, v in targets],
                      tags=tags if tags is not None else function_tags({t.function_id for t in tasks}),
                      records=records)
    by_group: dict[tuple[int, str], list[int]] = {}
    levels = input_levels(tasks)  # a task is placed after the request's tasks it takes as inputs
    for i, (k, v) in enumerate(targets):
        if k == "g":
            by_group.setdefault((levels[i], v), []).append(i)
    outside = outside_inputs(tasks)
    for (_, group_id), indices in sorted(by_group.items()):
        data = [with_inputs(tasks[i], routing.endpoints, outside) for i in indices]
        placed = place(owner, group_id, [routing.tags.get(tasks[i].function_id) for i in indices],
                       [tasks[i].container or containers.get(tasks[i].function_id) for i in indices],
                       data, records=routing.records)
        for i, (ep, reason) in zip(indices, placed):
            routing.endpoints[i] = ep
            if reason is not None:
                routing.refused[i] = reason
    return routing


# Where a task's inputs are counts as its data (data_local, the `data` affinity): an input's
# result in the hot store weighs its size, one in S3 or not yet made this much.
INPUT_WEIGHT = 1 << 20


def input_levels(tasks: list) -> list[int]:
    """0 for a task without inputs in its own request; else 1 + the highest level of those."""
    levels: list[int] = []
    for t in tasks:
        level = 0
        for text in t.inputs or ():
            if text.startswith("#") and text[1:].isdigit() and int(text[1:]) < len(levels):
                level = max(level, levels[int(text[1:])] + 1)
        levels.append(level)
    return levels


def outside_inputs(tasks: list) -> dict[str, tuple[str, int]]:
    """Input task id -> (its endpoint, weight) for the inputs named by id (one round trip)."""
    ids = sorted({x for t in tasks for x in t.inputs or () if not x.startswith("#")})
    if not ids:
        return {}
    return {tid: (ep, size if 0 < size < INPUT_WEIGHT else INPUT_WEIGHT)
            for tid, (ep, size) in deps.task_fields().locations(ids).items()}


def with_inputs(task, endpoints: list[str], outside: dict[str, tuple[str, int]]) -> Optional[dict[str, int]]:
    """The task's data locations, its inputs' endpoints added."""
    if not task.inputs:
        return task.data_locations
    data = dict(task.data_locations or {})
    for text in task.inputs:
        if text.startswith("#"):
            k = int(text[1:]) if text[1:].isdigit() else -1
            where = (endpoints[k], INPUT_WEIGHT) if 0 <= k < len(endpoints) and endpoints[k] else None
        else:
            where = outside.get(text)
        if where is not None:
            data[where[0]] = data.get(where[0], 0) + where[1]
    return data or None


def function_tags(function_ids: set[str]) -> dict[str, Optional[str]]:
    """Tags of functions already cached by registry.function_bodies (one round trip)."""
    ids = sorted(function_ids)
    out: dict[str, Optional[str]] = {}
    for fid, meta in zip(ids, deps.registry_cache().function_metas(ids)):
        out[fid] = orjson.loads(meta).get("tag") if meta else None
    return out


def place(owner: str, group_id: str, tags: list[Optional[str]], containers: list[Optional[str]],
          data: Optional[list[Optional[dict[str, int]]]] = None,
          records: Optional[dict[str, dict[str, str]]] = None) -> list[tuple[str, Optional[str]]]:
    """(endpoint id, None) for each placed task; ('', reason) for each the policy refused.
    `data`: per task, endpoint id -> bytes of its data refs there (the SDK says; the refs
    themselves are opaque here), which `data_local` and the `data` affinity use. `records`
    gets the members' hot records, as read here (the submission needs no second read)."""
    rec = _record(owner, group_id)
    policy = _policy(rec["policy"])
    state, _ = live_state(rec["members"])
    for m in rec["members"]:  # a member shared with the group's owner and since revoked takes nothing
        ep = registry._endpoint_record(m["endpoint_id"])
        if ep is not None and records is not None:
            records[m["endpoint_id"]] = ep
        if ep is None or not access.allows("endpoint", m["endpoint_id"], ep["o"], rec["owner"]):
            state.upsert(m["name"], online=False)
    by_name = {m["name"]: m["endpoint_id"] for m in rec["members"]}
    scheduler = Scheduler(policy, state)
    groups = deps.group_store()
    saved = groups.cursors(group_id)
    scheduler.set_cursors(saved)
    out: list[tuple[str, Optional[str]]] = []
    name_of = {m["endpoint_id"]: m["name"] for m in rec["members"]}
    for tag, container, loc in zip(tags, containers, data or [None] * len(tags)):
        held = {name_of[e]: n for e, n in loc.items() if e in name_of} if loc else None
        d = scheduler.place(tag, container=container, data=held or None)
        if d.ok:
            out.append((by_name[d.worker], None))
        else:
            out.append(("", f"placement in endpoint group {rec['name']!r}: {d.reason}"[:MAX_REASON]))
    cursors = scheduler.cursors()
    if cursors and cursors != saved:
        groups.save_cursors(group_id, cursors)
    return out
