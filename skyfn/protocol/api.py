"""Request and response bodies of the REST API, shared by the service and the SDK.

The service validates requests against these models (and serves them in its OpenAPI
document); the SDK builds requests with them. Buffers are serialize.py's text form.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, WithJsonSchema, field_validator

from skyfn.protocol.allowlist import MAX_ALLOWED_FUNCTIONS, AllowedFunction
from skyfn.protocol.dataflow import MAX_INPUTS
from skyfn.protocol.direct import MAX_SESSION_FUNCTIONS, SESSION_KEY_BYTES
from skyfn.protocol.user_config import MAX_USER_CONFIG_BYTES, MAX_USER_CONFIG_DEPTH

from skyfn.protocol.limits import (  # noqa: F401 - the limits, kept importable from here
    MAX_BATCH,
    MAX_FUNCTION_BYTES,
    MAX_PAYLOAD_BYTES,
    MAX_REQUEST_BYTES,
    MAX_STATUS_IDS,
    MAX_WAIT_SECONDS,
    NAME_PATTERN,
)

# One timestamped event, [STATE, seconds since the epoch]. Validated as a tuple; described
# without prefixItems, which OpenAPI 3.0 tools (and schemathesis's response checks) misread.
Event = Annotated[tuple[str, float], WithJsonSchema({
    "type": "array", "minItems": 2, "maxItems": 2, "items": {"anyOf": [{"type": "string"}, {"type": "number"}]},
    "description": "[state, seconds since the epoch]"})]


def _integral(value: Any) -> Any:
    """JSON has one number type: 67.0 is the integer 67 (JSON Schema's "integer", which the
    OpenAPI 3.1 document states, is any number whose fraction is zero), and a client's JSON
    library may well write it so. Strict int alone refuses it (the service answered 422 to
    bodies its own document allows); 67.5, "67" and true are still refused."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


# Metadata of an integer field of a request body, after its bounds (so that they stay the
# schema's minimum and maximum): Annotated[int, Field(ge=.., le=..), INTEGRAL] takes an int
# or a JSON number with a zero fraction.
INTEGRAL = BeforeValidator(_integral)
MAX_JSON_INT = 2**53  # bound of otherwise unbounded integers: the largest that every JSON parser keeps exact


class _Body(BaseModel):
    # strict: "1" is not a number and 0 is not a boolean (fuzzing found such bodies accepted);
    # integer fields carry INTEGRAL, so that 3.0 is the integer it is
    model_config = ConfigDict(extra="forbid", strict=True)

    def __repr__(self) -> str:
        # Batches hold thousands of items: a full repr would cost more than the request.
        parts = (f"{k}=<{len(v)} items>" if isinstance(v, (list, dict)) else f"{k}={v!r}"
                 for k, v in self.__dict__.items())
        return f"{type(self).__name__}({', '.join(parts)})"


class RegisterFunction(_Body):
    function: str = Field(min_length=1, max_length=MAX_FUNCTION_BYTES, description="serialized function buffer")
    name: Optional[str] = Field(default=None, max_length=256)
    tag: Optional[str] = Field(default=None, pattern=NAME_PATTERN)
    container: Optional[str] = Field(default=None, max_length=512)
    memoize: StrictBool = Field(default=False, description="cache results by (function code, arguments, "
                                                           "container); a repeat call is answered without running")


class FunctionInfo(BaseModel):
    function_id: str
    name: Optional[str] = None
    owner: str
    tag: Optional[str] = None
    container: Optional[str] = None
    created: float
    function: Optional[str] = None
    memoize: bool = False


class FunctionCreated(BaseModel):
    function_id: str


class QueueDescriptor(BaseModel):
    """How an agent reaches a queue: a Redis stream or an SQS queue."""

    kind: Literal["redis", "sqs"]
    name: str = Field(description="stream key or queue name")
    url: str = Field(description="redis:// URL or SQS queue URL")


class RegisterEndpoint(_Body):
    name: str = Field(pattern=NAME_PATTERN)
    metadata: dict[str, Any] = Field(default_factory=dict)
    allowed_functions: Optional[list[AllowedFunction]] = Field(
        default=None, max_length=MAX_ALLOWED_FUNCTIONS,
        description="the agent's allowlist (config.yaml): only these functions may be submitted to the endpoint; "
                    "null: any. Left as it was when the key is absent.")


class EndpointInfo(BaseModel):
    endpoint_id: str
    name: str
    owner: str
    status: Literal["online", "offline", "new"]
    last_heartbeat: Optional[float] = None
    created: float
    backlog: int = 0
    metadata: dict[str, Any] = Field(default_factory=dict)
    stats: dict[str, Any] = Field(default_factory=dict, description="the agent's last heartbeat: workers, "
                                                                    "managers, warm containers, in flight, ...")


class HeartbeatAck(BaseModel):
    """POST /endpoints/{id}/heartbeat's answer: the heartbeat as recorded. Not the whole
    EndpointInfo: every idle endpoint heartbeats, and its backlog is a queue read (an SQS
    GetQueueAttributes on AWS) that no agent uses; GET /endpoints/{id} has it."""

    endpoint_id: str
    status: Literal["online"] = "online"
    last_heartbeat: float


class EndpointRegistered(EndpointInfo):
    task_queue: QueueDescriptor
    results_queue: QueueDescriptor
    control_queue: QueueDescriptor = Field(description="cancellations of this endpoint's tasks")
    # security (endpoint credentials): issued when the owner registers; never logged
    agent_credential: Optional[str] = Field(default=None, description="the endpoint's own credential for its "
                                                                      "agent (rotated by each registration)")
    aws_credentials: Optional[dict[str, str]] = Field(default=None, description="SQS only: session credentials "
                                                                                "scoped to this endpoint's queues")
    results_key: Optional[str] = Field(default=None, description="hex key the agent seals its result packs with "
                                       "(skyfn.protocol.result_seal; derived from the endpoint credential)")


class EndpointList(BaseModel):
    endpoints: list[EndpointInfo]


class DirectInfo(BaseModel):
    """What an agent publishes about its direct socket (heartbeat field `direct`)."""

    address: Optional[str] = Field(default=None, description="tcp://host:port the SDK connects to; null: no "
                                   "port (reached through the rendezvous server only)")
    server_key: str = Field(min_length=40, max_length=40, description="the socket's CurveZMQ public key (Z85)")
    session_key: str = Field(min_length=2 * SESSION_KEY_BYTES, max_length=2 * SESSION_KEY_BYTES,
                             pattern="^[0-9a-f]+$", description="hex key the service signs session tokens with")
    rendezvous: bool = Field(default=False, description="the agent LISTENs at the service's rendezvous server "
                             "(skyfn.protocol.direct_path): sessions may reach it punched or relayed")


class ListenTicket(BaseModel):
    """POST /endpoints/{id}/direct/listen: where and under which name the agent LISTENs."""

    address: str = Field(description="host:port of the rendezvous server")
    name: str = Field(description="the listener name (skyfn.protocol.direct_path.listener_name)")
    token: str = Field(description="the rendezvous token admitting LISTEN of that name")
    expires: float


class PathTicket(BaseModel):
    """How a session reaches its agent through the rendezvous server (skyfn.protocol.direct_path)."""

    address: str = Field(description="host:port of the rendezvous server")
    name: str = Field(description="the agent's listener name")
    caller: str = Field(description="this session's caller string (caller_of)")
    token: str = Field(description="the call token for (name, caller)")
    path_key: str = Field(description="hex key the SDK proves its ticket to the agent with (a secret)")
    expires: float


class Heartbeat(_Body):
    stats: dict[str, Any] = Field(default_factory=dict)
    allowed_functions: Optional[list[AllowedFunction]] = Field(
        default=None, max_length=MAX_ALLOWED_FUNCTIONS,
        description="the agent's allowlist as it stands (null: any function); left as it was when absent")
    direct: Optional[DirectInfo] = Field(
        default=None, description="the agent's direct socket (skyfn.protocol.direct); absent: it takes no sessions")
    features: Optional[list[Annotated[str, Field(min_length=1, max_length=32)]]] = Field(
        default=None, max_length=16,
        description="what the agent understands beyond the base protocol: 'park' (dependents sent ahead of their "
                    "inputs, TaskSpec.after; skyfn.protocol.dataflow); unknown names are ignored")


class OpenSession(_Body):
    """POST /endpoints/{id}/sessions: the functions a direct session may run."""

    function_ids: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        min_length=1, max_length=MAX_SESSION_FUNCTIONS)


class SessionOpened(BaseModel):
    session_id: str
    endpoint_id: str
    address: Optional[str] = Field(default=None, description="the agent's direct socket, tcp://host:port; null: "
                                   "reached through the rendezvous server only")
    server_key: str = Field(description="its CurveZMQ public key (Z85)")
    token: str = Field(description="what each task pack carries; signed for the agent")
    expires_at: float
    rendezvous: Optional[PathTicket] = Field(default=None, description="the way to the agent through the "
                                             "rendezvous server, when it listens there")


class Resources(_Body):
    """What one task needs on its node; the agent assigns cores and GPUs
    (CUDA_VISIBLE_DEVICES-style) to the worker that runs it."""

    cores: Annotated[int, Field(ge=1, le=1024), INTEGRAL] = 1
    gpus: Annotated[int, Field(ge=0, le=64), INTEGRAL] = 0


MAX_STAGE_ITEMS = 10_000  # GlobusFile arguments of one task


class StageItem(_Body):
    """A file on a Globus collection that the endpoint's agent moves for a task
    (skyfn.data.connectors.globus.GlobusFile; endpoint_agent/staging.py)."""

    collection: str = Field(pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    path: str = Field(min_length=1, max_length=4096, pattern=r"^/")

    @field_validator("path")
    @classmethod
    def _no_parent(cls, path: str) -> str:
        if ".." in path.split("/") or "\x00" in path:
            raise ValueError("a path on the collection from its root, without '..' components")
        return path


class TaskRequest(_Body):
    function_id: str = Field(min_length=1, max_length=64)
    payload: str = Field(max_length=MAX_PAYLOAD_BYTES, description="serialized (args, kwargs) buffer")
    endpoint_id: Optional[str] = Field(default=None, max_length=64, description="overrides the batch's endpoint")
    group_id: Optional[str] = Field(default=None, max_length=64, description="an endpoint group: its policy picks "
                                                                            "the endpoint (instead of endpoint_id)")
    container: Optional[str] = Field(default=None, max_length=512)
    max_retries: Optional[Annotated[int, Field(ge=0, le=100), INTEGRAL]] = None
    walltime: Optional[float] = Field(default=None, gt=0, le=7 * 24 * 3600)
    resources: Optional[Resources] = None
    memoize: Optional[StrictBool] = Field(default=None, description="answer from the memo cache when this function "
                                          "ran on the same arguments and container before (default: the "
                                          "submission's, else the function's setting)")
    data_locations: Optional[dict[Annotated[str, Field(min_length=1, max_length=64)],
                                  Annotated[int, Field(ge=0, le=MAX_JSON_INT), INTEGRAL]]] = Field(default=None, max_length=64, description="endpoint id -> "
                                                     "bytes of this task's data refs held there: a group's policy "
                                                     "may prefer that endpoint (strategy data_local, affinity data)")
    stage_in: Optional[list[StageItem]] = Field(default=None, max_length=MAX_STAGE_ITEMS, description="GlobusFile "
                                                "arguments: copied to the endpoint's collection before the task runs")
    stage_out: Optional[list[StageItem]] = Field(default=None, max_length=MAX_STAGE_ITEMS, description="GlobusFile "
                                                 "outputs: sent from the endpoint to their collection after it ran")
    inputs: Optional[list[Annotated[str, Field(min_length=2, max_length=36)]]] = Field(
        default=None, min_length=1, max_length=MAX_INPUTS,
        description="tasks whose results this one takes (skyfn.protocol.dataflow): a task id of the caller's, or "
                    "'#<k>' for the k-th task of this request (before this one); the payload holds Input(i) "
                    "placeholders in their places. The task is WAITING until every input SUCCEEDED.")


class SubmitTasks(_Body):
    endpoint_id: Optional[str] = Field(default=None, max_length=64)
    group_id: Optional[str] = Field(default=None, max_length=64, description="endpoint group for every task "
                                                                            "without its own target")
    idempotency_key: Optional[str] = Field(default=None, min_length=1, max_length=128)
    max_retries: Annotated[int, Field(ge=0, le=100), INTEGRAL] = 3
    memoize: Optional[StrictBool] = Field(default=None, description="memoization for every task without its own "
                                                                    "setting (default: the function's)")
    tasks: list[TaskRequest] = Field(min_length=1, max_length=MAX_BATCH)
    # Any JSON value is taken here and checked by the service (skyfn.protocol.user_config), so
    # that a bad one is a 400 naming the problem; the document says what is accepted.
    user_config: Optional[Annotated[Any, WithJsonSchema({"type": "object", "additionalProperties": True})]] = Field(
        default=None, description="variables for a multi-user endpoint's user config template (a JSON object, at "
                                  f"most {MAX_USER_CONFIG_BYTES} bytes encoded, nested at most "
                                  f"{MAX_USER_CONFIG_DEPTH} deep), sent unchanged with this request's tasks; "
                                  "400 otherwise")


class Submitted(BaseModel):
    submission_id: str
    task_ids: list[str]
    replayed: bool = Field(default=False, description="true when the idempotency key matched an earlier request")


class StatusRequest(_Body):
    task_ids: list[str] = Field(min_length=1, max_length=MAX_STATUS_IDS)
    wait: float = Field(default=0.0, ge=0.0, le=MAX_WAIT_SECONDS, description="long-poll until one is final")
    include_events: StrictBool = False  # 0/1 are not booleans: the schema says boolean
    cursor: Optional[str] = Field(default=None, pattern=r"^[0-9]{1,20}-[0-9]{1,20}$",
                                  description="from the previous answer: only tasks finished since then are returned")
    peek: StrictBool = Field(default=False, description="observe only: finished tasks are not marked retrieved, so "
                                                        "their results' purge clock (SKYFN_RESULT_TTL) does not start")
    results: StrictBool = Field(default=True, description="false: leave out what the functions produced (result, "
                                                          "result_url, stdout, stderr); states, errors and reasons "
                                                          "stay (for observers that show states)")


class TaskListItem(BaseModel):
    task_id: str
    function_id: Optional[str] = None
    endpoint_id: Optional[str] = None
    state: Optional[str] = None
    created: float
    retries: int = 0
    reason: Optional[str] = None
    events: list[tuple[str, float]] = Field(default_factory=list, description="[state, epoch seconds], in order")


class TaskList(BaseModel):
    """GET /tasks: the caller's recent tasks, newest first (reports and the status page)."""
    tasks: list[TaskListItem]
    truncated: bool
    since: float


class ExpiredResult(BaseModel):
    """Why a SUCCEEDED task comes without its result: the hot store purged it and the
    durable history keeps no results. Results are kept `result_ttl` seconds after they are
    first read (a status read without peek, GET /tasks/{id} without peek, a push delivered to a
    connection subscribed without peek), `unretrieved_ttl` seconds when never read."""
    finished: Optional[float] = Field(default=None, description="when the task finished (epoch seconds)")
    result_ttl: float = Field(description="seconds a result is kept after it is first read (SKYFN_RESULT_TTL)")
    unretrieved_ttl: float = Field(description="seconds a result never read is kept (SKYFN_UNRETRIEVED_TTL)")


class TaskStatus(BaseModel):
    task_id: str
    state: str
    result: Optional[str] = None
    error: Optional[str] = None
    reason: Optional[str] = None
    retries: int = 0
    events: Optional[list[Event]] = None
    stdout: Optional[str] = Field(default=None, description="captured standard output (capped)")
    stderr: Optional[str] = Field(default=None, description="captured standard error (capped)")
    result_url: Optional[str] = Field(default=None, description="a large result is in S3: presigned GET URL "
                                                                "of the buffer (skyfn.protocol.blobs)")
    result_expired: Optional[ExpiredResult] = Field(default=None, description="SUCCEEDED, but the result is no "
                                                                            "longer kept (never a silent null)")
    endpoint_id: Optional[str] = Field(default=None, description="with a result or error: the endpoint the task "
                                       "was routed to")
    result_by: Optional[str] = Field(default=None, description="with a result or error: the endpoint whose agent "
                                     "produced it; the SDK decodes neither unless it is endpoint_id")


class StatusResponse(BaseModel):
    tasks: dict[str, TaskStatus]
    unknown: list[str] = Field(default_factory=list, description="ids the service has no task for")
    later: list[str] = Field(default_factory=list, description="ids of tasks purged from the hot store whose records "
                             "this answer did not read from the durable history (one answer reads a bounded part): "
                             "ask for them again")
    cursor: str = Field(description="pass back to receive only tasks that finish after this answer")


class TaskInfo(TaskStatus):
    function_id: str
    endpoint_id: str
    submission_id: str
    owner: str
    created: float


class ErrorBody(BaseModel):
    error: str
    message: str
    details: Optional[Any] = None


# --- endpoint groups (placement, issue 6): POST /endpoint-groups ---------------------
MAX_GROUP_MEMBERS = 256
MAX_POLICY_BYTES = 256 << 10


class GroupMember(_Body):
    endpoint_id: str = Field(min_length=1, max_length=64)
    name: Optional[str] = Field(default=None, pattern=NAME_PATTERN,
                                description="the worker name the policy uses (default: the endpoint's name)")


class CreateEndpointGroup(_Body):
    name: str = Field(pattern=NAME_PATTERN)
    members: list[GroupMember] = Field(min_length=1, max_length=MAX_GROUP_MEMBERS)
    policy: Optional[str] = Field(default=None, max_length=MAX_POLICY_BYTES,
                                  description="aAPP placement policy (YAML); default: shortest_backlog over "
                                              "every member")


class GroupMemberInfo(BaseModel):
    name: str
    endpoint_id: str
    status: str
    capacity: int = Field(description="worker slots from the endpoint's last heartbeat (0: unknown)")
    backlog: int = Field(description="tasks queued to or running on the endpoint, not yet final")
    tags: dict[str, int] = Field(default_factory=dict, description="unfinished tasks per function tag")


class EndpointGroupInfo(BaseModel):
    group_id: str
    name: str
    owner: str
    created: float
    policy: str
    members: list[GroupMemberInfo]
    warnings: list[dict[str, Any]] = Field(default_factory=list, description="policy warnings (line, key, reason)")
