"""Messages between the service and endpoint agents.

Tasks travel to an agent packed: one queue message carries a TaskPack of many tasks and
the bodies of the functions they call, so the agent needs no other lookup. Agents send
back ResultPacks on the results queue: final results plus progress updates (DISPATCHED,
RUNNING, lease extensions), coalesced so a task that finishes quickly costs one record.
The service tells agents about cancellations with ControlMessages on a control queue.
"""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

# A task pack stays well below the SQS message limit (1 MiB) after JSON encoding.
PACK_MAX_TASKS = 512
PACK_MAX_BYTES = 512 * 1024


class _Msg(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=False)


class TaskSpec(_Msg):
    task_id: str
    function_id: str
    payload: str = Field(description="serialized (args, kwargs) buffer")
    container: Optional[str] = None
    walltime: Optional[float] = None
    resources: Optional[dict[str, int]] = Field(default=None, description="cores, gpus")
    tag: Optional[str] = Field(default=None, description="the function's tag (placement policies)")
    payload_url: Optional[str] = Field(default=None, description="the payload is in S3 (skyfn.protocol.blobs): "
                                                                 "a presigned GET URL for it")
    stage_in: Optional[list[dict[str, str]]] = Field(default=None, description="[{collection, path}]: GlobusFile "
                                                     "arguments the agent stages in first (endpoint_agent/staging.py)")
    stage_out: Optional[list[dict[str, str]]] = Field(default=None, description="[{collection, path}]: GlobusFile "
                                                      "outputs the agent stages out after the task")
    after: Optional[list[str]] = Field(default=None, description="a dependent sent ahead of its inputs (parked, "
                                       "skyfn.protocol.dataflow): the input tasks, routed to this endpoint, whose "
                                       "results the agent puts in the envelope's `local` entries before it runs")


class SubmitterIdentity(_Msg):
    """Who submitted a pack's tasks, as the identity-mapping rules of a multi-user endpoint read
    it (the fields of a Globus Auth identity; endpoint_agent/multiuser/identity.py)."""

    id: str = Field(description="the user id (the token's `sub`); what shares and ref capabilities name")
    username: Optional[str] = None
    email: Optional[str] = None
    identity_provider: Optional[str] = None


class TaskPack(_Msg):
    pack_id: str
    endpoint_id: str
    functions: dict[str, str] = Field(default_factory=dict, description="function_id -> serialized body")
    function_meta: dict[str, dict[str, Optional[str]]] = Field(
        default_factory=dict, description="function_id -> {owner, name}: what endpoint allowlists of owner and "
                                          "name entries are checked against (skyfn.protocol.allowlist)")
    tasks: list[TaskSpec]
    owner: Optional[str] = Field(default=None, description="the user who submitted these tasks (what data refs' "
                                                           "capabilities are checked against, skyfn.data)")
    result_upload: Optional[dict] = Field(default=None, description="presigned S3 POST for large results of "
                                                                    "this endpoint (skyfn.protocol.blobs)")
    identity: Optional[SubmitterIdentity] = Field(default=None, description="the submitter's identity claims: what a "
                                                  "multi-user endpoint maps to a local account")
    user_config: Optional[dict[str, Any]] = Field(default=None, description="the submitter's variables for a "
                                                  "multi-user endpoint's user config template (JSON data)")


UNPARK = "UNPARK"


class TaskUpdate(_Msg):
    """Progress of a task that has not finished yet. LEASE extends the lease only. UNPARK
    hands a parked dependent back to the service: the agent cannot release it (an input's
    result is not here, or did not succeed) and drops it; the service sends it again once
    its inputs are done, with their results (skyfn.protocol.dataflow)."""

    task_id: str
    state: Literal["DISPATCHED", "RUNNING", "LEASE", "UNPARK"]
    ts: float
    lease_seconds: float = 60.0


class TaskResult(_Msg):
    task_id: str
    state: Literal["SUCCEEDED", "FAILED", "TIMED_OUT"]
    result: Optional[str] = Field(default=None, description="serialized return value")
    error: Optional[str] = Field(default=None, description="wrapped remote exception")
    reason: Optional[str] = Field(default=None, description="why it failed, when not an exception")
    events: list[tuple[str, float]] = Field(default_factory=list, description="agent-side events")
    stdout: Optional[str] = Field(default=None, description="captured standard output, capped by the agent")
    stderr: Optional[str] = Field(default=None, description="captured standard error, capped by the agent")
    session: Optional[str] = Field(default=None, description="a task of a direct session (skyfn.protocol.direct): "
                                   "its session id; the service records the task from it")
    function_id: Optional[str] = Field(default=None, description="with session: the function the task ran")


class ControlMessage(_Msg):
    """Service -> agent, on the endpoint's control queue."""

    cancel: list[str] = Field(default_factory=list, description="task ids to stop: drop if queued, kill if running")


class ResultPack(_Msg):
    endpoint_id: str
    results: list[TaskResult] = Field(default_factory=list)
    updates: list[TaskUpdate] = Field(default_factory=list)
