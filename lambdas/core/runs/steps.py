"""What the flow and SPMD Task states do: submit one task through the service core, wait
for it (a few seconds per invocation; the state machine loops while it is pending), turn
its outcome into a state value or an error the state machine can Retry/Catch, and set up
an SPMD group (group id, rendezvous token, one item per rank).

Errors raised here reach Step Functions by class name (docs/runs.md): TaskFailed,
TaskTimedOut, TaskCancelled, EndpointOffline, NotFound, RendezvousNotConfigured.
"""
from __future__ import annotations

import time
import uuid
from typing import Any

from lambdas.core.tasks import registry, tasks
from lambdas.core.errors import NotFound, ServiceError
from lambdas.core.runs.settings import run_settings
from skyfn.protocol.api import SubmitTasks, TaskRequest
from skyfn.protocol.serialize import deserialize, pack_args, strategy_of

MAX_INLINE_RESULT = 64 << 10   # larger results travel as a reference (Step Functions state limit: 256 KB)
MAX_WAIT = 20.0


class EndpointOffline(ServiceError):
    status = 409
    code = "endpoint_offline"


class TaskFailed(Exception):
    pass


class TaskTimedOut(Exception):
    pass


class TaskCancelled(Exception):
    pass


class RendezvousNotConfigured(Exception):
    pass


def require_online(owner: str, endpoint_id: str) -> None:
    info = registry.endpoint_info(owner, endpoint_id)
    if info.status == "offline":
        ago = f"{time.time() - info.last_heartbeat:.0f} s ago" if info.last_heartbeat else "never"
        raise EndpointOffline(f"endpoint {info.name} ({endpoint_id}) is offline: its last heartbeat was {ago}; "
                              "start its agent (skyfn-endpoint start) and run again")


def submit(event: dict[str, Any]) -> dict[str, Any]:
    owner, endpoint = event["owner"], event["endpoint_id"]
    require_online(owner, endpoint)
    payload = pack_args(tuple(event.get("args") or ()), dict(event.get("kwargs") or {}))
    req = SubmitTasks(endpoint_id=endpoint, max_retries=int(event.get("max_retries") or 0),
                      tasks=[TaskRequest(function_id=event["function_id"], payload=payload)])
    answer, _ = tasks.submit(owner, req)  # no token here: the packs carry the owner's kept identity claims
    return {"task_id": answer["task_ids"][0]}


def _error_text(row: dict[str, Any]) -> str:
    """The remote exception's type and message when its wrapper is JSON (never unpickled)."""
    error = row.get("error")
    if error and strategy_of(error) == "json":
        data = deserialize(error)
        tail = "\n".join(str(data.get("traceback", "")).rstrip().splitlines()[-6:])
        return f"{data.get('type')}: {data.get('message')}\n{tail}"
    return row.get("reason") or "failed without an error report"


def wait(event: dict[str, Any]) -> dict[str, Any]:
    owner, task_id = event["owner"], event["task_id"]
    step = event.get("step") or "task"
    answer = tasks.status(owner, [task_id], min(float(event.get("wait_seconds") or 10), MAX_WAIT), False)
    row = answer["tasks"].get(task_id)
    if row is None:
        raise NotFound(f"step {step}: task {task_id} is unknown (purged, or not yours)")
    state = row["state"]
    if state == "SUCCEEDED":
        return {"task_id": task_id, "output": _output(task_id, row.get("result"))}
    if state == "FAILED":
        raise TaskFailed(f"step {step}: task {task_id} failed: {_error_text(row)}"[:30000])
    if state == "TIMED_OUT":
        raise TaskTimedOut(f"step {step}: task {task_id} exceeded its walltime: {row.get('reason') or ''}")
    if state == "CANCELLED":
        raise TaskCancelled(f"step {step}: task {task_id} was cancelled: {row.get('reason') or ''}")
    return {"task_id": task_id, "pending": True, "state": state}


def _output(task_id: str, result: str | None) -> Any:
    if result is None:
        return None
    strategy = strategy_of(result)
    if strategy == "json" and len(result) <= MAX_INLINE_RESULT:
        return deserialize(result)
    # Not JSON, or too large for a state: a reference the user resolves with Client.get_result.
    return {"skyfn_result": {"task_id": task_id, "strategy": strategy, "bytes": len(result)}}


def spmd_init(event: dict[str, Any]) -> dict[str, Any]:
    from rendezvous.tokens import make_token

    ws = run_settings()
    if not ws.rendezvous_address or not ws.rendezvous_secret:
        raise RendezvousNotConfigured("no rendezvous server is configured for SPMD groups: set "
                                      "SKYFN_RENDEZVOUS_ADDRESS (host:port) and SKYFN_RENDEZVOUS_SECRET")
    host, _, port = ws.rendezvous_address.rpartition(":")
    if not host or not port.isdigit():
        raise RendezvousNotConfigured(f"SKYFN_RENDEZVOUS_ADDRESS={ws.rendezvous_address!r} is not host:port")
    size = int(event["world_size"])
    require_online(event["owner"], event["endpoint_id"])
    group_id = f"spmd-{uuid.uuid4().hex}"
    token = make_token(ws.rendezvous_secret, group_id, ttl_s=24 * 3600)
    rendezvous = {"host": host, "port": int(port), "group": group_id, "token": token}
    user_kwargs = dict(event.get("kwargs") or {})
    ranks = [{"rank": r, "kwargs": {**user_kwargs, "rank": r, "world_size": size, "rendezvous": rendezvous}}
             for r in range(size)]
    return {"group_id": group_id, "world_size": size, "ranks": ranks}
