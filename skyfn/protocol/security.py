"""Request and response bodies of the security routes (identity, shares, teams, endpoint
credentials, rendezvous tokens, task audit), shared by the service and the SDK."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from skyfn.protocol import blobs
from skyfn.protocol.api import NAME_PATTERN, Event

# 'user:<id>', 'team:<id>', or 'all-users': every authenticated user (run only; functions and endpoints)
PRINCIPAL_PATTERN = r"^(all-users|(user|team):[A-Za-z0-9_.@+=,-][A-Za-z0-9_.@+=,:-]{0,199})$"
RENDEZVOUS_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
MAX_RENDEZVOUS_TTL = 24 * 3600


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WhoAmI(BaseModel):
    user: str = Field(description="your user id: what others share with (as 'user:<id>')")
    endpoint_id: Optional[str] = Field(default=None, description="set when an endpoint credential was used")


class Grant(_Body):
    principal: str = Field(pattern=PRINCIPAL_PATTERN, description="'user:<user id>', 'team:<team id>', or "
                                                                  "'all-users' (every signed-in user; role 'run' "
                                                                  "on functions and endpoints only)")
    role: Literal["run", "manage"]


class ShareList(BaseModel):
    kind: str
    id: str
    owner: str
    shares: dict[str, str] = Field(description="principal -> role")


class IncomingShare(BaseModel):
    kind: str
    id: str
    role: str


class IncomingShares(BaseModel):
    shares: list[IncomingShare]


class CreateTeam(_Body):
    name: str = Field(pattern=NAME_PATTERN)
    members: list[str] = Field(default_factory=list, max_length=1000)


class TeamInfo(BaseModel):
    team_id: str
    name: str
    owner: str
    members: list[str]


class AgentCredential(BaseModel):
    endpoint_id: str
    agent_credential: str = Field(description="skyfn-agent.<endpoint id>.<secret>: give it to the endpoint's agent; "
                                              "shown once")


class CredentialRevoked(BaseModel):
    endpoint_id: str
    revoked: bool = Field(description="no credential of the endpoint works any more; its agent is cut off")


class RendezvousTokenRequest(_Body):
    name: str = Field(pattern=RENDEZVOUS_NAME_PATTERN, description="your name for the group; the service "
                                                                   "prefixes it with your namespace")
    ttl_seconds: int = Field(default=3600, ge=60, le=MAX_RENDEZVOUS_TTL)


class RendezvousToken(BaseModel):
    group: str = Field(description="the group id peers join with (namespaced to you)")
    token: str
    expires: float
    address: Optional[str] = Field(default=None, description="host:port of the rendezvous server, if configured")


class TaskAudit(BaseModel):
    task_id: str
    submitter: str
    endpoint_id: str
    function_id: str
    submission_id: str
    state: str
    retries: int = 0
    reason: Optional[str] = None
    created: float
    events: list[Event]


class CreateBlob(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = Field(ge=1, le=blobs.MAX_BLOB_BYTES, description="bytes to upload (the upload refuses more)")


class BlobUpload(BaseModel):
    key: str = Field(description="put it in the task: blob reference 'blob 1\\n<key>'")
    url: str
    fields: dict[str, str] = Field(description="form fields of the presigned POST, sent before the file")
    max_bytes: int
    expires: float
