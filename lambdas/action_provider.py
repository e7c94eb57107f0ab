"""The Globus Flows Action Provider routes, under /flows-ap, in front of skyfn task submission
(lambdas/core/runs/actions.py), authenticated with the same tokens as every other route (a
Globus Auth token behind API Gateway's authorizer in AWS; the embedded runtime's tokens).

    GET    /flows-ap                          introspect (ActionProviderDescription)
    POST   /flows-ap/run, /flows-ap/actions   run (ActionRequest -> ActionStatus, 202; a repeat: 200)
    GET    /flows-ap/{id}/status, /flows-ap/actions/{id}            status
    POST   /flows-ap/{id}/cancel, /flows-ap/actions/{id}/cancel     cancel
    POST   /flows-ap/{id}/release, DELETE /flows-ap/actions/{id}    release (a completed action)
    GET    /flows-ap/{id}/log, /flows-ap/actions/{id}/log           log (?limit=&reverse_order=&marker=)

Both the original (1.0) and the /actions (1.1) paths are served, as
globus-action-provider-tools' blueprint does. The provider's scope and contact come from
SKYFN_AP_SCOPE and SKYFN_AP_ADMIN_CONTACT (the CDK app sets them).
"""
from __future__ import annotations

import os
from typing import Annotated, Optional

import orjson
from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query

from lambdas.core.runs import actions
from skyfn.protocol.actions import PREFIX, ActionLog, ActionProviderDescription, ActionRequest, ActionStatus
from skyfn.protocol.api import ErrorBody

router = Router()
ActionPath = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$")]


def _json(status: int, body: object) -> Response:
    return Response(status_code=status, content_type="application/json", body=orjson.dumps(body).decode())


def _errors(*codes: int) -> dict:
    return {c: {"description": "error", "content": {"application/json": {"model": ErrorBody}}}
            for c in dict.fromkeys((*codes, 401, 422, 429, 503))}


def _ok(status: int, model: type) -> dict:
    return {status: {"description": "success", "content": {"application/json": {"model": model}}}}


def _user() -> str:
    return router.context["user"]


def _scope() -> str:
    return os.environ.get("SKYFN_AP_SCOPE") or "skyfn:flows-ap:all"


# --- introspect --------------------------------------------------------------------------
@router.get(PREFIX, responses={**_ok(200, ActionProviderDescription), **_errors()})
def introspect():
    contact = os.environ.get("SKYFN_AP_ADMIN_CONTACT") or "the administrators of this skyfn deployment"
    return _json(200, actions.describe(_scope(), contact))


# --- run (each route at both paths: 1.0 and /actions 1.1) --------------------------------------
_RUN = {**_ok(202, ActionStatus), **_ok(200, ActionStatus), **_errors(403, 404, 409, 413)}


@router.post(f"{PREFIX}/run", responses=_RUN)
@router.post(f"{PREFIX}/actions", responses=_RUN)
def run(body: Annotated[ActionRequest, Body()]):
    # the caller's identity claims go with the task, as with POST /tasks (lambdas/core/identity/submitters.py)
    status, created = actions.run(_user(), body, submitter=router.context["identity"].claims())
    return _json(202 if created else 200, status)


# --- status, cancel, release ----------------------------------------------------------------
_ONE = {**_ok(200, ActionStatus), **_errors(404)}


@router.get(f"{PREFIX}/<action_id>/status", responses=_ONE)
@router.get(f"{PREFIX}/actions/<action_id>", responses=_ONE)
def status(action_id: ActionPath):
    return _json(200, actions.status(_user(), action_id))


@router.post(f"{PREFIX}/<action_id>/cancel", responses=_ONE)
@router.post(f"{PREFIX}/actions/<action_id>/cancel", responses=_ONE)
def cancel(action_id: ActionPath):
    return _json(200, actions.cancel(_user(), action_id))


_RELEASE = {**_ok(200, ActionStatus), **_errors(404, 409)}


@router.post(f"{PREFIX}/<action_id>/release", responses=_RELEASE)
@router.delete(f"{PREFIX}/actions/<action_id>", responses=_RELEASE)
def release(action_id: ActionPath):
    return _json(200, actions.release(_user(), action_id))


# --- log -----------------------------------------------------------------------------------
Limit = Annotated[int, Query(ge=1, le=actions.LOG_LIMIT_MAX)]
Marker = Annotated[Optional[str], Query(min_length=1, max_length=16, pattern=r"^[0-9]+$")]


@router.get(f"{PREFIX}/<action_id>/log", responses={**_ok(200, ActionLog), **_errors(404)})
@router.get(f"{PREFIX}/actions/<action_id>/log", responses={**_ok(200, ActionLog), **_errors(404)})
def log(action_id: ActionPath, limit: Limit = 10, reverse_order: Annotated[bool, Query()] = False,
        marker: Marker = None):
    return _json(200, actions.log(_user(), action_id, limit, reverse_order, marker))
