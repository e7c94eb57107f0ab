"""The Globus Flows Action Provider interface in front of skyfn task submission: the wire
shapes of its routes (lambdas/action_provider.py), as the Action Provider API documents
them (globus-action-provider-tools' action_request.yaml / action_status.yaml and its
ActionProviderDescription / ActionLogReturn models).

A flow step runs a registered function on an endpoint:

    {"request_id": "...", "body": {"function_id": "<uuid>", "endpoint_id": "<uuid>",
                                   "args": [1, 2], "kwargs": {"n": 3}}}

and its status turns SUCCEEDED with `details.result` (the function's return value, when it
is JSON) or FAILED with `details.code` / `details.description`.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

PREFIX = "/flows-ap"
API_VERSION = "1.0"
PRINCIPAL_URN = (r"^urn:globus:(auth:identity|groups:id):([a-fA-F0-9]{8}-[a-fA-F0-9]{4}-[a-fA-F0-9]{4}-"
                 r"[a-fA-F0-9]{4}-[a-fA-F0-9]{12})$")
ISO8601_DURATION = (r"^P(?!$)(\d+(?:\.\d+)?Y)?(\d+(?:\.\d+)?M)?(\d+(?:\.\d+)?W)?(\d+(?:\.\d+)?D)?"
                    r"(T(?=\d)(\d+(?:\.\d+)?H)?(\d+(?:\.\d+)?M)?(\d+(?:\.\d+)?S)?)?$")
ALLOWED_CLIENTS = r"^(public|globus|creator|.$)$"
Principal = Annotated[str, Field(pattern=PRINCIPAL_URN, max_length=128)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, regex_engine="python-re")  # lookaheads (durations)


class RunFunction(_Body):
    """The action's body: what to run where (the provider's input_schema)."""

    function_id: str = Field(min_length=1, max_length=64, description="a registered function's id")
    endpoint_id: str = Field(min_length=1, max_length=64, description="the endpoint to run it on")
    args: list[Any] = Field(default_factory=list, max_length=10_000, description="positional arguments (JSON)")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments (JSON)")
    walltime: Optional[float] = Field(default=None, gt=0, le=7 * 24 * 3600, description="seconds, then TIMED_OUT")


class ActionRequest(_Body):
    request_id: str = Field(min_length=1, max_length=256, description="repeats of a request_id with the same "
                                                                      "content return the same action")
    body: RunFunction
    label: Optional[str] = Field(default=None, min_length=1, max_length=64)
    monitor_by: list[Principal] = Field(default_factory=list, max_length=100,
                                        description="principal URNs that may read status and log")
    manage_by: list[Principal] = Field(default_factory=list, max_length=100,
                                       description="principal URNs that may cancel and release")
    allowed_clients: list[Annotated[str, Field(pattern=ALLOWED_CLIENTS, max_length=64)]] = Field(
        default_factory=list, max_length=100)
    deadline: Optional[str] = Field(default=None, max_length=64, description="ISO8601 date-time")
    release_after: Optional[str] = Field(default=None, pattern=ISO8601_DURATION, max_length=64,
                                         description="ISO8601 duration the status is kept after completion")


class ActionStatus(BaseModel):
    action_id: str
    status: Literal["SUCCEEDED", "FAILED", "ACTIVE", "INACTIVE"]
    creator_id: str
    label: Optional[str] = None
    monitor_by: list[str] = Field(default_factory=list)
    manage_by: list[str] = Field(default_factory=list)
    start_time: str
    completion_time: Optional[str] = None
    release_after: str
    display_status: str
    details: dict[str, Any]


class ActionLogEntry(BaseModel):
    code: str
    description: str
    time: str
    details: dict[str, Any] = Field(default_factory=dict)


class ActionLog(BaseModel):
    entries: list[ActionLogEntry]
    limit: int
    has_next_page: bool
    marker: Optional[str] = None


class ActionProviderDescription(BaseModel):
    types: list[str]
    api_version: str
    globus_auth_scope: str
    title: str
    subtitle: str
    admin_contact: str
    synchronous: bool
    log_supported: bool
    visible_to: list[str]
    runnable_by: list[str]
    maximum_deadline: str
    keywords: list[str]
    input_schema: dict[str, Any]
