"""Security routes of the REST API (a Powertools router included by lambdas/api.py):
who am I, shares of functions/endpoints/endpoint groups, teams, endpoint credentials
(rotate, revoke, and the agent's connect), rendezvous group tokens, a task's audit
record, and upload forms for large arguments (S3). The logic lives in lambdas/core
(access, teams, agent_keys, audit, rendezvous_tokens, blobs).
"""
from __future__ import annotations

from typing import Annotated

import orjson
from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path

from lambdas.core.identity import access, agent_keys, teams
from lambdas.core.tasks import audit, blobs
from lambdas.core.runs import rendezvous_tokens
from lambdas.core.errors import Forbidden, NotFound
from skyfn.protocol.api import EndpointRegistered, ErrorBody
from skyfn.protocol.security import (
    PRINCIPAL_PATTERN,
    AgentCredential,
    BlobUpload,
    CreateBlob,
    CredentialRevoked,
    CreateTeam,
    Grant,
    IncomingShares,
    RendezvousToken,
    RendezvousTokenRequest,
    ShareList,
    TaskAudit,
    TeamInfo,
    WhoAmI,
)

router = Router()
IdPath = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$")]
KindPath = Annotated[str, Path(pattern=r"^(functions|endpoints|endpoint-groups)$")]
PrincipalPath = Annotated[str, Path(pattern=PRINCIPAL_PATTERN)]
UserPath = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.@+=,-]+$")]
KINDS = {"functions": "function", "endpoints": "endpoint", "endpoint-groups": "endpoint-group"}


def _json(status: int, body: object) -> Response:
    return Response(status_code=status, content_type="application/json", body=orjson.dumps(body).decode())


def _errors(*codes: int) -> dict:
    return {c: {"description": "error", "content": {"application/json": {"model": ErrorBody}}}
            for c in dict.fromkeys((*codes, 401, 429, 503))}


def _ok(status: int, model: type) -> dict:
    return {status: {"description": "success", "content": {"application/json": {"model": model}}}}


def _identity():
    return router.context["identity"]


def _user() -> str:
    return router.context["user"]


def owner_of(kind: str, obj_id: str) -> str | None:
    """The owner of a function, endpoint or endpoint group; None if there is none."""
    from lambdas.core import deps
    from lambdas.core.tasks import registry
    from lambdas.core.ids import is_uuid

    if kind == "endpoint":
        rec = registry._endpoint_record(obj_id)
        return rec["o"] if rec else None
    if kind == "function":
        o = deps.registry_cache().function_owner(obj_id)
        if o is not None:
            return o
        item = deps.dynamo().get_function(obj_id) if is_uuid(obj_id) else None
        return item["owner"] if item else None
    o = deps.group_store().owner(obj_id)
    if o is not None:
        return o
    item = deps.dynamo().get_group(obj_id) if is_uuid(obj_id) else None
    return item["group_owner"] if item else None


# --- identity ------------------------------------------------------------------------
@router.get("/whoami", responses={**_ok(200, WhoAmI), **_errors()})
def whoami():
    ident = _identity()
    return _json(200, {"user": ident.user, "endpoint_id": ident.endpoint_id})


# --- shares ----------------------------------------------------------------------------
@router.get("/shares", responses={**_ok(200, IncomingShares), **_errors()})
def incoming_shares():
    return _json(200, {"shares": access.shared_with(_user())})


@router.get("/shares/<kind>/<obj_id>", responses={**_ok(200, ShareList), **_errors(403, 404, 422)})
def list_shares(kind: KindPath, obj_id: IdPath):
    k = KINDS[kind]
    owner = owner_of(k, obj_id)
    access.require(k, obj_id, owner, _user(), "manage", f"{k} {obj_id}")
    return _json(200, {"kind": k, "id": obj_id, "owner": owner, "shares": access.grants(k, obj_id)})


@router.post("/shares/<kind>/<obj_id>", responses={**_ok(200, ShareList), **_errors(400, 403, 404, 422)})
def grant_share(kind: KindPath, obj_id: IdPath, body: Annotated[Grant, Body()]):
    k = KINDS[kind]
    owner = owner_of(k, obj_id)
    if owner is None:
        raise NotFound(f"{k} {obj_id} not found")
    shares = access.grant(k, obj_id, owner, _user(), body.principal, body.role)
    return _json(200, {"kind": k, "id": obj_id, "owner": owner, "shares": shares})


@router.delete("/shares/<kind>/<obj_id>/<principal>", responses={**_ok(200, ShareList), **_errors(403, 404, 422)})
def revoke_share(kind: KindPath, obj_id: IdPath, principal: PrincipalPath):
    k = KINDS[kind]
    owner = owner_of(k, obj_id)
    if owner is None:
        raise NotFound(f"{k} {obj_id} not found")
    shares = access.revoke(k, obj_id, owner, _user(), principal)
    return _json(200, {"kind": k, "id": obj_id, "owner": owner, "shares": shares})


# --- teams -----------------------------------------------------------------------------
@router.post("/teams", responses={**_ok(201, TeamInfo), **_errors(422)})
def create_team(body: Annotated[CreateTeam, Body()]):
    return _json(201, teams.create(_user(), body.name, body.members))


@router.get("/teams/<team_id>", responses={**_ok(200, TeamInfo), **_errors(404, 422)})
def get_team(team_id: IdPath):
    return _json(200, teams.info(_user(), team_id))


@router.put("/teams/<team_id>/members/<member>", responses={**_ok(200, TeamInfo), **_errors(403, 404, 422)})
def add_member(team_id: IdPath, member: UserPath):
    return _json(200, teams.set_member(_user(), team_id, member, True))


@router.delete("/teams/<team_id>/members/<member>", responses={**_ok(200, TeamInfo), **_errors(403, 404, 422)})
def remove_member(team_id: IdPath, member: UserPath):
    return _json(200, teams.set_member(_user(), team_id, member, False))


# --- endpoint credentials ------------------------------------------------------------------
@router.post("/endpoints/<endpoint_id>/credential", responses={**_ok(201, AgentCredential), **_errors(403, 404, 422)})
def rotate_credential(endpoint_id: IdPath):
    access.require("endpoint", endpoint_id, owner_of("endpoint", endpoint_id), _user(), "manage",
                   f"endpoint {endpoint_id}")
    return _json(201, {"endpoint_id": endpoint_id, "agent_credential": agent_keys.issue(endpoint_id)})


@router.delete("/endpoints/<endpoint_id>/credential", responses={**_ok(200, CredentialRevoked),
                                                                 **_errors(403, 404, 422)})
def revoke_credential(endpoint_id: IdPath):
    access.require("endpoint", endpoint_id, owner_of("endpoint", endpoint_id), _user(), "manage",
                   f"endpoint {endpoint_id}")
    agent_keys.revoke(endpoint_id)
    return _json(200, {"endpoint_id": endpoint_id, "revoked": True})


@router.post("/endpoints/<endpoint_id>/connect", responses={**_ok(200, EndpointRegistered), **_errors(403, 404, 422)})
def connect(endpoint_id: IdPath):
    """An agent learns its queues (and, on SQS, fresh session credentials): with its
    endpoint's credential, no user token needed, or with a token of a user who manages it."""
    from lambdas.core.tasks import registry

    ident = _identity()
    owner = owner_of("endpoint", endpoint_id)
    if ident.is_agent:
        if ident.endpoint_id != endpoint_id:
            raise Forbidden(f"this endpoint credential is not endpoint {endpoint_id}'s")
    else:  # an agent running with its owner's (or a manager's) token: behind API Gateway's authorizer
        access.require("endpoint", endpoint_id, owner, _user(), "manage", f"endpoint {endpoint_id}")
    if owner is None:
        raise NotFound(f"endpoint {endpoint_id} not found")
    info = registry.endpoint_info(owner, endpoint_id)
    out = EndpointRegistered(**info.model_dump(), **agent_keys.descriptors(endpoint_id, None))
    return _json(200, out.model_dump(exclude_none=True))


# --- rendezvous ---------------------------------------------------------------------------
@router.post("/rendezvous/tokens", responses={**_ok(201, RendezvousToken), **_errors(404, 422)})
def rendezvous_token(body: Annotated[RendezvousTokenRequest, Body()]):
    return _json(201, rendezvous_tokens.issue(_user(), body.name, body.ttl_seconds))


# --- audit ----------------------------------------------------------------------------------
@router.get("/tasks/<task_id>/audit", responses={**_ok(200, TaskAudit), **_errors(404, 422)})
def task_audit(task_id: IdPath):
    return _json(200, audit.task_record(_user(), task_id))


# --- large arguments (S3) -------------------------------------------------------------------
@router.post("/blobs", responses={**_ok(201, BlobUpload), **_errors(422)})
def create_blob(body: Annotated[CreateBlob, Body()]):
    return _json(201, blobs.create_upload(_user(), body.size))
