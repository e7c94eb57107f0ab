"""The REST API Lambda: Powertools' APIGatewayRestResolver with request validation
against the models of skyfn.protocol.api, JWT authentication on every route but the
OpenAPI document, and 4xx answers that name the problem for any bad input.

Large answers (task submission and status) are encoded with orjson and returned as
ready-made bodies; the OpenAPI document still describes them with their models.
"""
from __future__ import annotations

import base64
from typing import Annotated, Literal, Optional

import orjson
from botocore.exceptions import BotoCoreError, ClientError
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.middlewares import NextMiddleware
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from lambdas.adapters.redis_store.connection import STORE_FULL, STORE_UNREACHABLE
from lambdas.auth import Unauthorized, identify
from lambdas.core.identity import guard, limits  # security: agent routes, rate limits, size limits (H9)
from lambdas.core.identity import submitters  # the submitter's identity claims each task carries
from lambdas.config import settings
from lambdas.core.tasks import endpoint_states, registry, sessions, tasks
from lambdas.core.runs import batches, flows, runs
from lambdas.core.errors import Backlogged, Forbidden, ServiceError, TooLarge
from lambdas.core.identity import lanes  # lanes of multi-user endpoints
from skyfn.protocol.api import (
    MAX_REQUEST_BYTES,
    EndpointInfo,
    EndpointList,
    EndpointRegistered,
    ErrorBody,
    FunctionCreated,
    FunctionInfo,
    Heartbeat,
    HeartbeatAck,
    OpenSession,
    RegisterEndpoint,
    RegisterFunction,
    SessionOpened,
    StatusRequest,
    StatusResponse,
    SubmitTasks,
    Submitted,
    TaskInfo,
    TaskList,
    TaskStatus,
)
from skyfn.protocol.lanes import LANE_PATTERN, BindLane, LaneClosed, LaneGranted
from skyfn.protocol.task_states import TaskStates, TaskStatesRequest
from skyfn.protocol.runs import BatchStatus, BatchSubmitted, RunFlow, RunGroup, RunStarted, RunStatus, SubmitBatch
from lambdas.core.tasks import groups  # endpoint groups (placement)
from skyfn.protocol.api import CreateEndpointGroup, EndpointGroupInfo, ListenTicket

logger = Logger(service="skyfn-api")
metrics = Metrics(namespace="skyfn", service="api")
# orjson parses bodies: strict about lone surrogates and infinities (which would only fail
# later, in Redis or in the JSON encoder, as a 5xx) and faster on large batches.
app = APIGatewayRestResolver(enable_validation=True, json_body_deserializer=orjson.loads)
app.configure_openapi(title="skyfn", version="0.1.0",
                      description="Federated function-as-a-service for science: register a Python function "
                                  "once, run it on any endpoint you may use.")

PUBLIC_PATHS = {"/openapi.json"}
IdPath = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$")]


def _json(status: int, body: object, headers: Optional[dict[str, str]] = None) -> Response:
    return Response(status_code=status, content_type="application/json", body=orjson.dumps(body).decode(),
                    headers=headers or None)


def _error(status: int, code: str, message: str, details: object = None,
           headers: Optional[dict[str, str]] = None) -> Response:
    body = {"error": code, "message": message}
    if details is not None:
        body["details"] = details
    return _json(status, body, headers)


def _errors(*codes: int) -> dict:
    # 503: any route answers it while the task store is unreachable (clients retry it)
    return {c: {"description": "error", "content": {"application/json": {"model": ErrorBody}}}
            for c in dict.fromkeys((*codes, 503))}


def _ok(status: int, model: type) -> dict:
    return {status: {"description": "success", "content": {"application/json": {"model": model}}}}


def authenticate_request(app: APIGatewayRestResolver, next_middleware: NextMiddleware) -> Response:
    event = app.current_event
    if event.path not in PUBLIC_PATHS:
        ident = app.context.get("identity") or identify(event.raw_event)  # the handler may have already
        # what the caller may reach (endpoint agents: their own agent routes) and its rate limit
        refused = guard.check(ident, event.http_method, event.path)
        if refused is not None:
            status, body, headers = refused
            return Response(status_code=status, content_type="application/json", body=orjson.dumps(body).decode(),
                            headers=headers)
        app.append_context(user=ident.user, identity=ident)
    return next_middleware(app)


app.use(middlewares=[authenticate_request])


def _user() -> str:
    return app.context["user"]


def _claims() -> dict[str, str]:
    """The caller's identity claims (username, email, identity provider), sent with its tasks."""
    return app.context["identity"].claims()


def _remember_claims() -> None:
    """Keep the caller's claims for the tasks a run submits later on their behalf, without a
    token (lambdas/core/identity/submitters.py)."""
    submitters.remember(_user(), _claims())


# --- errors ------------------------------------------------------------------------
@app.exception_handler(Unauthorized)
def _unauthorized(exc: Unauthorized) -> Response:
    return _error(401, "unauthorized", str(exc))


@app.exception_handler(ServiceError)
def _service_error(exc: ServiceError) -> Response:
    return _error(exc.status, exc.code, exc.message, exc.details, exc.headers)  # e.g. 429 backlog's Retry-After


@app.exception_handler(RequestValidationError)
def _invalid(exc: RequestValidationError) -> Response:
    problems = []
    errors = [{**e, "msg": limits.with_value_seen(e)} for e in exc.errors()[:20]]  # size limits name the size seen
    for err in errors:
        where = ".".join(str(p) for p in err.get("loc", ()))
        problems.append(f"{where}: {err.get('msg')}")
    return _error(422, "invalid_request", "; ".join(problems) or "invalid request",
                  [{"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg"), "type": e.get("type")}
                   for e in errors])


@app.exception_handler(STORE_UNREACHABLE)
def _store_down(exc: Exception) -> Response:
    logger.warning("hot store unreachable", exc_info=exc)
    return _error(503, "unavailable", "the task store is unreachable; retry shortly")


@app.exception_handler(STORE_FULL)
def _store_full(exc: Exception) -> Response:
    # maxmemory reached (noeviction: infra/hot_store.py) between two readings of the backlog gauge
    logger.warning("hot store full", exc_info=exc)
    return _error(429, Backlogged.code, "the task store is full (Redis maxmemory): it takes new work again once the "
                  "history drain has archived and expired finished tasks; retry after 5 s (the skyfn SDK waits and "
                  "retries by itself)", headers={"Retry-After": "5"})


@app.not_found
def _no_route(exc: NotFoundError) -> Response:
    return _error(404, "no_route", f"no route {app.current_event.http_method} {app.current_event.path}: "
                                   "see GET /openapi.json for the API")


# --- functions ---------------------------------------------------------------------
@app.post("/functions", responses={**_ok(201, FunctionCreated), **_errors(401, 413, 422)})
def register_function(body: Annotated[RegisterFunction, Body()]):
    function_id = registry.register_function(_user(), body)
    metrics.add_metric(name="FunctionsRegistered", unit=MetricUnit.Count, value=1)
    return _json(201, {"function_id": function_id})


@app.get("/functions/<function_id>", responses={**_ok(200, FunctionInfo), **_errors(401, 404, 422)})
def get_function(function_id: IdPath):
    return _json(200, registry.get_function(_user(), function_id).model_dump())


# --- endpoints ---------------------------------------------------------------------
@app.post("/endpoints", responses={**_ok(201, EndpointRegistered), **_ok(200, EndpointRegistered),
                                   **_errors(401, 422)})
def register_endpoint(body: Annotated[RegisterEndpoint, Body()]):
    from lambdas.core.identity import agent_keys

    info, created = registry.register_endpoint(_user(), body)
    # the endpoint's own credential for its agent (rotated now) and queues it reaches
    credential = agent_keys.issue(info.endpoint_id)
    out = EndpointRegistered(**info.model_dump(), **agent_keys.descriptors(info.endpoint_id, credential),
                             agent_credential=credential if agent_keys.usable_at_api() else None)
    return _json(201 if created else 200, out.model_dump(exclude_none=True))


@app.get("/endpoints", responses={**_ok(200, EndpointList), **_errors(401)})
def list_endpoints():
    return _json(200, {"endpoints": [e.model_dump() for e in registry.list_endpoints(_user())]})


@app.get("/endpoints/<endpoint_id>", responses={**_ok(200, EndpointInfo), **_errors(401, 404, 422)})
def get_endpoint(endpoint_id: IdPath):
    return _json(200, registry.endpoint_info(_user(), endpoint_id).model_dump())


@app.post("/endpoints/<endpoint_id>/heartbeat", responses={**_ok(200, HeartbeatAck), **_errors(401, 404, 422)})
def heartbeat(endpoint_id: IdPath, body: Annotated[Heartbeat, Body()]):
    allowed = body.allowed_functions if "allowed_functions" in body.model_fields_set else ...
    return _json(200, registry.heartbeat(_user(), endpoint_id, body.stats,
                                         agent_endpoint=app.context["identity"].endpoint_id,
                                         allowed=allowed, direct=body.direct,
                                         features=body.features).model_dump())


@app.post("/endpoints/<endpoint_id>/sessions", responses={**_ok(201, SessionOpened),
                                                          **_errors(401, 403, 404, 409, 422)})
def open_session(endpoint_id: IdPath, body: Annotated[OpenSession, Body()]):
    """A direct session with the endpoint's agent for these functions (skyfn.protocol.direct):
    the same checks as POST /tasks; 409 no_direct_channel when the agent publishes no direct socket."""
    opened = sessions.open(_user(), endpoint_id, body)
    metrics.add_metric(name="DirectSessionsOpened", unit=MetricUnit.Count, value=1)
    return _json(201, opened.model_dump())


@app.post("/endpoints/<endpoint_id>/direct/listen", responses={**_ok(200, ListenTicket), **_errors(401, 403, 404, 422)})
def direct_listen(endpoint_id: IdPath):
    """The agent's LISTEN ticket at the rendezvous server (skyfn.protocol.direct_path): its
    own endpoint credential only; 404 rendezvous_not_configured where none runs."""
    return _json(200, sessions.listen_ticket(app.context["identity"].endpoint_id, endpoint_id).model_dump())


# --- lanes of a multi-user endpoint (skyfn.protocol.lanes), for its own agent ---------
LanePath = Annotated[str, Path(pattern=LANE_PATTERN, description="the lane's name")]


def _own_agent(endpoint_id: str, does: str = "opens and closes its lanes") -> None:
    if app.context["identity"].endpoint_id != endpoint_id:
        raise Forbidden(f"only endpoint {endpoint_id}'s own agent, with its endpoint credential "
                        f"(Bearer skyfn-agent.<id>.<secret>), {does}; a user token cannot")


@app.post("/endpoints/<endpoint_id>/lanes", responses={**_ok(200, LaneGranted), **_errors(401, 403, 404, 409, 422)})
def bind_lane(endpoint_id: IdPath, body: Annotated[BindLane, Body()]):
    """Open a lane (if new) and bind (identity_id, config_key) to it: that submitter's tasks with
    that user_config go straight to the lane's queue. 409 lanes_unavailable where the task queues
    are not Redis Streams, 409 not_multi_user for an ordinary endpoint."""
    _own_agent(endpoint_id)
    granted = lanes.bind(endpoint_id, body, registry._endpoint_record(endpoint_id))
    return _json(200, granted.model_dump())


@app.delete("/endpoints/<endpoint_id>/lanes/<lane>", responses={**_ok(200, LaneClosed),
                                                                **_errors(401, 403, 404, 409, 422)})
def close_lane(endpoint_id: IdPath, lane: LanePath):
    """Unbind everything from the lane and end its queue login; its queue stays for the endpoint to drain."""
    _own_agent(endpoint_id)
    return _json(200, {"lane": lane, "unbound": lanes.close(endpoint_id, lane)})


@app.post("/endpoints/<endpoint_id>/task-states", responses={**_ok(200, TaskStates), **_errors(401, 403, 404, 422)})
def task_states(endpoint_id: IdPath, body: Annotated[TaskStatesRequest, Body()]):
    """The states of these tasks, for the endpoint's own agent (skyfn.protocol.task_states):
    a task not dispatched to this endpoint is UNKNOWN, whoever's it is."""
    _own_agent(endpoint_id, "asks for its tasks' states")
    return _json(200, endpoint_states.of_endpoint(endpoint_id, body.task_ids).model_dump(exclude_none=True))


# --- tasks -------------------------------------------------------------------------
@app.post("/tasks", responses={**_ok(202, Submitted), **_ok(200, Submitted),
                                **_errors(400, 401, 403, 404, 409, 413, 422, 429)})
def submit_tasks(body: Annotated[SubmitTasks, Body()]):
    """Submit one task or a batch; `user_config` (optional) goes with the tasks to their endpoint,
    as does the caller's identity (400 invalid_user_config when it is not a small JSON object).
    429 backlog with Retry-After while the hot store's backlog is over its bound: nothing is stored."""
    answer, replayed = tasks.submit(_user(), body, submitter=_claims())
    metrics.add_metric(name="TasksSubmitted", unit=MetricUnit.Count, value=0 if replayed else len(body.tasks))
    return _json(200 if replayed else 202, answer)


@app.post("/tasks/status", responses={**_ok(200, StatusResponse), **_errors(401, 422)})
def task_status(body: Annotated[StatusRequest, Body()]):
    return _json(200, tasks.status(_user(), body.task_ids, body.wait, body.include_events, body.cursor,
                                   peek=body.peek, results=body.results))


@app.get("/tasks", responses={**_ok(200, TaskList), **_errors(401, 422)})
def list_tasks(since: Annotated[float, Query(ge=0)] = 0.0,
               endpoint_id: Annotated[Optional[str], Query(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$")] = None,
               limit: Annotated[int, Query(ge=1, le=20_000)] = 10_000,
               history: Annotated[bool, Query()] = True):
    """The caller's tasks created since `since` (epoch seconds), newest first, with events."""
    from lambdas.core.tasks import task_list

    return _json(200, task_list.list_tasks(_user(), since, endpoint_id, limit, history))


@app.get("/tasks/<task_id>", responses={**_ok(200, TaskInfo), **_errors(401, 404, 422)})
def get_task(task_id: IdPath,
             peek: Annotated[Literal["true", "false"], Query(
                 description="true: observe only, a finished task is not marked retrieved, so its result's purge "
                             "clock (SKYFN_RESULT_TTL) does not start; exactly 'true' or 'false'")] = "false"):
    return _json(200, tasks.get(_user(), task_id, peek=peek == "true").model_dump(exclude_none=True))


@app.delete("/tasks/<task_id>", responses={**_ok(200, TaskStatus), **_errors(401, 404, 409, 422)})
def cancel_task(task_id: IdPath):
    return _json(200, tasks.cancel(_user(), task_id).model_dump(exclude_none=True))


# --- endpoint groups (placement: aAPP policies choose the endpoint) -------------------
@app.post("/endpoint-groups", responses={**_ok(201, EndpointGroupInfo), **_errors(401, 422)})
def create_endpoint_group(body: Annotated[CreateEndpointGroup, Body()]):
    return _json(201, groups.create(_user(), body))


@app.get("/endpoint-groups/<group_id>", responses={**_ok(200, EndpointGroupInfo), **_errors(401, 404, 422)})
def get_endpoint_group(group_id: IdPath):
    return _json(200, groups.info(_user(), group_id))


# --- runs: batches, flows, SPMD groups (Step Functions; docs/runs.md) --------------
@app.post("/batches", responses={**_ok(202, BatchSubmitted), **_ok(200, BatchSubmitted),
                                 **_errors(401, 403, 404, 409, 413, 422, 429, 503)})
def submit_batch(body: Annotated[SubmitBatch, Body()]):
    _remember_claims()  # its chunks are submitted later, without a token
    answer, replayed = batches.submit(_user(), body)
    metrics.add_metric(name="BatchTasksSubmitted", unit=MetricUnit.Count, value=0 if replayed else len(body.payloads))
    return _json(200 if replayed else 202, answer)


@app.get("/batches/<batch_id>", responses={**_ok(200, BatchStatus), **_errors(401, 404, 422, 503)})
def batch_status(batch_id: IdPath):
    return _json(200, batches.status(_user(), batch_id))


@app.post("/flows", responses={**_ok(202, RunStarted), **_errors(401, 403, 404, 422, 503)})
def run_flow(body: Annotated[RunFlow, Body()]):
    _remember_claims()  # its steps submit tasks later, without a token
    return _json(202, flows.run_flow(_user(), body))


@app.post("/spmd-groups", responses={**_ok(202, RunStarted), **_errors(401, 403, 404, 422, 503)})
def run_group(body: Annotated[RunGroup, Body()]):
    _remember_claims()
    return _json(202, flows.run_group(_user(), body))


@app.get("/runs/<run_id>", responses={**_ok(200, RunStatus), **_errors(401, 404, 422, 503)})
def run_status(run_id: IdPath):
    return _json(200, runs.status(_user(), run_id))


@app.exception_handler(BotoCoreError)
@app.exception_handler(ClientError)
def _run_service_down(exc: Exception) -> Response:
    code = exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else None
    if code in ACCESS_DENIED:  # the deployment's policy, not a passing fault: say what was refused
        logger.error("AWS refused a call of the service: %s", exc)
        return _error(500, "access_denied", f"the service's role was refused an AWS call ({exc}); its IAM policy "
                      "needs that action (docs/deploy.md, the runtime from the templates)")
    logger.warning("AWS call failed", exc_info=exc)
    return _error(503, "unavailable", f"the workflow service did not answer ({type(exc).__name__}); retry shortly")


ACCESS_DENIED = frozenset({"AccessDenied", "AccessDeniedException"})


# --- security: shares, teams, endpoint credentials, rendezvous tokens, audit (H9) --------
from lambdas.security_api import router as _security_router  # noqa: E402

app.include_router(_security_router)

# --- Globus Flows action provider (issue 14): /flows-ap, in front of task submission --------
from lambdas.action_provider import router as _action_provider_router  # noqa: E402

app.include_router(_action_provider_router)


@app.get("/openapi.json", include_in_schema=False)
def openapi():
    return Response(status_code=200, content_type="application/json", body=app.get_openapi_json_schema())


# log_event=False whatever POWERTOOLS_LOGGER_LOG_EVENT says: events carry Authorization headers
@logger.inject_lambda_context(clear_state=True, log_event=False)
@metrics.log_metrics
def handler(event: dict, context: LambdaContext) -> dict:
    size = len(event.get("body") or "")
    if size > MAX_REQUEST_BYTES:  # checked before validation parses it
        message = f"request body of {size} bytes exceeds the limit of {MAX_REQUEST_BYTES} bytes: split the batch"
        return _early(413, TooLarge.code, message)
    if size and event.get("isBase64Encoded") and not _utf8(event["body"]):
        return _early(422, "invalid_request", "request body is not UTF-8 text: send JSON with "
                                              "Content-Type: application/json")
    if event.get("path") not in PUBLIC_PATHS:
        # Credentials first, as an API Gateway authorizer would: an unauthenticated caller
        # learns nothing from validation errors. (The middleware then sets the user.)
        try:
            app.append_context(identity=identify(event))
        except Unauthorized as exc:
            return _early(401, "unauthorized", str(exc))
    path = event.get("path") or ""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        # Powertools' route patterns end in `$`, which also matches before a final newline:
        # `/endpoints/%0A` would list the endpoints instead of naming no resource
        return _early(404, "not_found", "no such resource: the path has control characters (percent-decoded); "
                                        "check the URL")
    return app.resolve(event, context)


def _header(event: dict, name: str) -> str | None:
    for key, value in (event.get("headers") or {}).items():
        if key.lower() == name:
            return value
    return None


def _early(status: int, code: str, message: str) -> dict:
    """A proxy response for requests refused before routing."""
    return {"statusCode": status, "headers": {"Content-Type": "application/json"}, "isBase64Encoded": False,
            "body": orjson.dumps({"error": code, "message": message}).decode()}


def _utf8(b64: str) -> bool:
    try:
        base64.b64decode(b64, validate=True).decode("utf-8")
        return True
    except (ValueError, UnicodeDecodeError):
        return False
