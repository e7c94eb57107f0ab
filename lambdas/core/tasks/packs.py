"""TaskPacks: how submitted tasks travel to an endpoint -- each task's spec, the packs that
carry them (with the bodies of their functions, the submitter's identity and user_config)
and the queue they go to (the endpoint's, or a multi-user endpoint's lane)."""
from __future__ import annotations

import time
from typing import Any, Iterable

import orjson

from lambdas.core import deps
from lambdas.core.identity import lanes
from lambdas.core.ids import new_id
from lambdas.core.tasks import blobs
from skyfn.protocol.blobs import HEADER as BLOB_HEADER
from skyfn.protocol.messages import PACK_MAX_BYTES, PACK_MAX_TASKS
from skyfn.protocol.user_config import config_key


def task_queue(endpoint_id: str, multi_user: bool, who: dict[str, Any], user_config: Any):
    """The endpoint's task queue, or the lane the submitter's (identity, config key) is bound to
    at a multi-user endpoint (lambdas/core/identity/lanes.py): that user agent gets the tasks
    straight away. `multi_user`: lanes.multi_user(the endpoint's record); only such an
    endpoint costs the lookup."""
    if multi_user and lanes.enabled():
        lane = lanes.lane_for(endpoint_id, who["id"], config_key(user_config))
        if lane is not None:
            return deps.lane_queue(endpoint_id, lane)[0]
    return deps.task_queue(endpoint_id)[0]


def watch_dead_letters(endpoint_ids: Iterable[str]) -> None:
    """After packs were sent to these endpoints: the reaper looks at their dead letters until
    their queues are empty again (lambdas/core/tasks/dead_letters.py). One command."""
    deps.dead_letter_watch().touch(endpoint_ids, time.time())


def packs(endpoint_id, indices, task_ids, tasks, bodies, containers, tags=None, functions=None, owner=None,
           identity=None, user_config=None):
    """Yield encoded TaskPacks of at most PACK_MAX_TASKS tasks / ~PACK_MAX_BYTES.
    `functions` (registry.FunctionBody by id) gives each pack its functions' owners and
    names, which endpoint allowlists of owner and name entries are checked against.
    Every pack carries `identity` (SubmitterIdentity: {id: owner} when not given) and the
    request's `user_config`, unchanged, for a multi-user endpoint."""
    extra = pack_extra(owner, identity, user_config)
    yield from pack_specs(endpoint_id, (task_spec(task_ids[i], tasks[i], containers, tags) for i in indices),
                          bodies, functions, owner, extra)


def pack_extra(owner: str | None, identity: dict[str, Any] | None, user_config: Any) -> dict[str, Any]:
    """What every pack of a submission carries besides its tasks: the submitter's identity
    ({id: owner} when not given) and the request's user_config."""
    if identity is None and owner:
        identity = {"id": owner}
    extra: dict[str, Any] = {}
    if identity:
        extra["identity"] = identity
    if user_config is not None:
        extra["user_config"] = user_config
    return extra


def pack_specs(endpoint_id, specs, bodies, functions=None, owner=None, extra=None):
    """Encoded TaskPacks of task specs (task_spec), split at PACK_MAX_TASKS / ~PACK_MAX_BYTES;
    `extra`: what every pack carries (identity, user_config)."""
    base = len(orjson.dumps(extra)) if extra else 0
    batch: list[dict[str, Any]] = []
    fns: dict[str, str] = {}
    size = base
    for spec in specs:
        fid, payload = spec["function_id"], spec["payload"]
        cost = len(payload) + 120 + (len(bodies[fid]) if fid not in fns else 0)
        if batch and (len(batch) >= PACK_MAX_TASKS or size + cost > PACK_MAX_BYTES):
            yield pack(endpoint_id, batch, fns, functions, owner, extra)
            batch, fns, size = [], {}, base
            cost = len(payload) + 120 + len(bodies[fid])
        fns.setdefault(fid, bodies[fid])
        batch.append(spec)
        size += cost
    if batch:
        yield pack(endpoint_id, batch, fns, functions, owner, extra)


def task_spec(task_id: str, t, containers: dict, tags: dict | None) -> dict[str, Any]:
    """A task as its pack carries it (skyfn.protocol.messages.TaskSpec)."""
    spec = {"task_id": task_id, "function_id": t.function_id, "payload": t.payload}
    container = t.container or containers.get(t.function_id)
    if container:
        spec["container"] = container
    if t.walltime:
        spec["walltime"] = t.walltime
    if t.resources:
        spec["resources"] = {"cores": t.resources.cores, "gpus": t.resources.gpus}
    tag = tags.get(t.function_id) if tags else None
    if tag:
        spec["tag"] = tag
    if t.stage_in:  # GlobusFile arguments: the agent stages them (endpoint_agent/staging.py)
        spec["stage_in"] = [{"collection": i.collection, "path": i.path} for i in t.stage_in]
    if t.stage_out:
        spec["stage_out"] = [{"collection": i.collection, "path": i.path} for i in t.stage_out]
    if t.payload.startswith(BLOB_HEADER):  # in S3: the agent fetches it with a presigned URL
        spec["payload_url"] = blobs.payload_url(t.payload)
    return spec


def pack(endpoint_id: str, tasks: list[dict[str, Any]], fns: dict[str, str], functions=None,
          owner: str | None = None, extra: dict[str, Any] | None = None) -> bytes:
    """One encoded TaskPack; `extra`: its identity and user_config."""
    pack = {"pack_id": new_id(), "endpoint_id": endpoint_id, "functions": fns, "tasks": tasks}
    if extra:
        pack.update(extra)
    if owner:  # whose tasks these are: data refs are resolved for this user (skyfn.data.capability)
        pack["owner"] = owner
    if functions:
        pack["function_meta"] = {fid: {"owner": functions[fid].owner, "name": functions[fid].name}
                                 for fid in fns if fid in functions}
    upload = blobs.result_upload(endpoint_id)  # where the agent puts results too large to travel inline
    if upload:
        pack["result_upload"] = upload
    return orjson.dumps(pack)
