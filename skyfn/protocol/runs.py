"""Request and response bodies of the run routes (docs/runs.md), shared by the
service and the SDK: batches (a large fan-out as a Step Functions Distributed Map),
flows (skyfn.flows, compiled to ASL) and SPMD groups; every such execution is a
*run* whose status GET /runs/{run_id} answers.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, Field

from skyfn.protocol.api import INTEGRAL, MAX_PAYLOAD_BYTES, _Body
from skyfn.protocol.flowspec import FlowSpec

MAX_BATCH_TASKS = 100_000        # tasks in one POST /batches (the body limit still applies)
MAX_WORLD_SIZE = 1024
RUN_STATES = ("RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")


class SubmitBatch(_Body):
    """One function over many inputs on one endpoint: each payload is one task."""

    endpoint_id: str = Field(min_length=1, max_length=64)
    function_id: str = Field(min_length=1, max_length=64)
    payloads: list[Annotated[str, Field(max_length=MAX_PAYLOAD_BYTES)]] = Field(min_length=1, max_length=MAX_BATCH_TASKS,
                                description="serialized (args, kwargs) buffers, one per task")
    max_retries: Annotated[int, Field(ge=0, le=100), INTEGRAL] = 3
    idempotency_key: Optional[str] = Field(default=None, min_length=1, max_length=128)
    deadline_seconds: float = Field(default=3600.0, gt=0, le=7 * 24 * 3600,
                                    description="the run fails with BatchTimedOut if tasks are still "
                                                "unfinished this long after submission")
    poll_seconds: Annotated[int, Field(ge=1, le=300), INTEGRAL] = Field(default=2, description="wait between progress checks")


class BatchSubmitted(BaseModel):
    batch_id: str
    run_id: str
    execution_arn: str
    task_ids: list[str]
    chunks: int
    replayed: bool = False


class FailedChunk(BaseModel):
    chunk: int
    tasks: int
    error: str
    cause: str


class BatchStatus(BaseModel):
    batch_id: str
    run_state: str = Field(description="the Step Functions execution: RUNNING, SUCCEEDED, FAILED, TIMED_OUT, ABORTED")
    state: str = Field(description="ROUTING, RUNNING (tasks outstanding), COMPLETE, NOT_ROUTED or TIMED_OUT")
    total: int
    routed: int
    pending: int
    counts: dict[str, int] = Field(description="final states of the batch's tasks")
    failed_chunks: list[FailedChunk] = Field(default_factory=list)
    error: Optional[str] = None
    cause: Optional[str] = None


class RunFlow(_Body):
    flow: FlowSpec
    input: Any = None
    name: Optional[str] = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")


class RunGroup(_Body):
    """An SPMD group: the function runs once per rank, all ranks at once, each called
    with keyword arguments rank, world_size and rendezvous (host, port, group, token),
    plus `kwargs`."""

    endpoint_id: str = Field(min_length=1, max_length=64)
    function_id: str = Field(min_length=1, max_length=64)
    world_size: Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE), INTEGRAL]
    kwargs: dict[str, Any] = Field(default_factory=dict)
    max_retries: Annotated[int, Field(ge=0, le=100), INTEGRAL] = 0


class RunStarted(BaseModel):
    run_id: str
    kind: Literal["batch", "flow", "group"]
    execution_arn: str


class RunStatus(BaseModel):
    run_id: str
    kind: str
    state: str = Field(description="RUNNING, SUCCEEDED, FAILED, TIMED_OUT or ABORTED")
    output: Any = None
    error: Optional[str] = None
    cause: Optional[str] = None
    started: Optional[float] = None
    stopped: Optional[float] = None
