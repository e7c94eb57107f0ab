"""The results push in the CDK app (issue 13): the WebSocket API, its authorizer with the
REST API's tokens, the connection table with TTL, and every function that writes final
task states posting them to connections with least privilege (infra/aws/stacks/push.py):
which functions those are is traced from the handlers' code to push.notify, and the
others hold none of it. Runs in .venv/cdk."""
from __future__ import annotations

import ast
import functools
import json

import pytest
from aws_cdk.assertions import Match

from infra.aws.config import PUSH_FUNCTIONS, PUSH_STEPS
from stepfunctions import catalog
from tests.aws.test_stacks import actions, function, function_statements, props, res, resources_text
from tests.repo_modules import module_path


@pytest.fixture(scope="module")
def service(synth):
    return synth["raw"]["service"], synth["templates"]["service"]


def test_websocket_api_routes_and_authorizer(service):
    raw, tpl = service
    tpl.resource_count_is("AWS::ApiGatewayV2::Api", 1)
    tpl.has_resource_properties("AWS::ApiGatewayV2::Api", {
        "Name": "skyfn-ci-ws", "ProtocolType": "WEBSOCKET", "RouteSelectionExpression": "$request.body.action"})
    routes = {p["RouteKey"]: p for p in props(raw, "AWS::ApiGatewayV2::Route")}
    assert set(routes) == {"$connect", "$disconnect", "subscribe"}
    assert routes["$connect"]["AuthorizationType"] == "CUSTOM"
    (authz,) = props(raw, "AWS::ApiGatewayV2::Authorizer")
    assert authz["AuthorizerType"] == "REQUEST" and authz["IdentitySource"] == []  # header or ?token=
    assert "ResultsPushWsAuthorizerFunction" in json.dumps(authz["AuthorizerUri"])
    assert routes["$connect"]["AuthorizerId"] == {"Ref": next(k for k, v in res(raw, "AWS::ApiGatewayV2::Authorizer").items())}
    # subscribe is two-way: its answer carries the subscription cursor
    (rr,) = props(raw, "AWS::ApiGatewayV2::RouteResponse")
    assert rr["RouteResponseKey"] == "$default"
    (stage,) = props(raw, "AWS::ApiGatewayV2::Stage")
    assert stage["StageName"] == "ci" and stage["AutoDeploy"] is True
    assert stage["DefaultRouteSettings"]["ThrottlingRateLimit"] == 1000
    _, fn = function(raw, "skyfn-ci-ws-authorizer")
    env = fn["Environment"]["Variables"]
    assert fn["Handler"] == "lambdas.ws.authorizer" and env["SKYFN_AUTH_PROVIDER"] == "cognito"
    assert "SdkClient" in json.dumps(env["SKYFN_AUTH_AUDIENCE"]) or "Sdk" in json.dumps(env["SKYFN_AUTH_AUDIENCE"])
    _, routes_fn = function(raw, "skyfn-ci-ws")
    assert routes_fn["Handler"] == "lambdas.ws.handler"


def test_authorizer_takes_globus_tokens_in_a_globus_deployment(synth_globus):
    raw = synth_globus["raw"]["service"]
    _, fn = function(raw, "skyfn-devglobus-ws-authorizer")
    env = fn["Environment"]["Variables"]
    assert env["SKYFN_AUTH_PROVIDER"] == "globus" and env["SKYFN_AUTH_AUDIENCE"] == "0a1b2c3d-client"
    assert env["SKYFN_AUTH_ISSUER"] == "https://auth.globus.org"


def test_connection_table_has_owner_keys_and_ttl(service):
    raw, tpl = service
    tpl.has_resource_properties("AWS::DynamoDB::Table", {
        "TableName": "skyfn-ci-connections",
        "KeySchema": [{"AttributeName": "owner", "KeyType": "HASH"},
                      {"AttributeName": "connection_id", "KeyType": "RANGE"}],
        "TimeToLiveSpecification": {"AttributeName": "expires", "Enabled": True},
        "SSESpecification": Match.object_like({"SSEEnabled": True}),
        "BillingMode": "PAY_PER_REQUEST"})


# --- who pushes: traced from the handlers' code ---------------------------------------
NOTIFY = ("lambdas.core.tasks.push", "notify")


@functools.lru_cache(maxsize=None)
def _module(module: str) -> tuple[dict[str, ast.AST], dict[str, str], dict[str, tuple[str, str]], list[str]]:
    """(functions by name, module aliases, imported function names, route-registered
    functions) of one module of this repository. Imports anywhere in the file count
    (handlers import inside functions), as do methods of top-level classes."""
    tree = ast.parse(module_path(module).read_text())
    functions: dict[str, ast.AST] = {}
    routes: list[str] = []
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        for fn in members:
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[fn.name] = fn
                # @app.get(...), @router.post(...): Powertools registers these on import
                for d in fn.decorator_list:
                    root = d.func if isinstance(d, ast.Call) else d
                    while isinstance(root, ast.Attribute):
                        root = root.value
                    if isinstance(root, ast.Name) and root.id in ("app", "router"):
                        routes.append(fn.name)
    aliases: dict[str, str] = {}
    names: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(("lambdas", "stepfunctions", "skyfn")):
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                ("lambdas", "stepfunctions", "skyfn")):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if module_path(sub):
                    aliases[a.asname or a.name] = sub
                else:
                    names[a.asname or a.name] = (node.module, a.name)
    return functions, aliases, names, routes


def _references(module: str, fn: ast.AST) -> set[tuple[str, str]]:
    """The functions of this repository that `fn` calls or passes on (callbacks, lambdas)."""
    functions, aliases, names, _ = _module(module)
    out = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            if node.id in functions:
                out.add((module, node.id))
            elif node.id in names:
                out.add(names[node.id])
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            out.add((aliases[node.value.id], node.attr))
    return out


def _imported_modules(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m in seen or not module_path(m):
            continue
        seen.add(m)
        _, aliases, names, _ = _module(m)
        todo += list(aliases.values()) + [mod for mod, _ in names.values()]
    return seen


def reaches_push(handler: str) -> bool:
    """Whether the Lambda handler `module.function` can call lambdas.core.tasks.push.notify: its
    own function and the routes its module's imports register, then every function they
    reference, transitively. Calls through objects (store.finish) are not followed: push
    is a module function, always called as push.notify."""
    module, _, name = handler.rpartition(".")
    todo = [(module, name)] + [(m, r) for m in _imported_modules(module) for r in _module(m)[3]]
    seen = set()
    while todo:
        ref = todo.pop()
        if ref == NOTIFY:
            return True
        if ref in seen or not module_path(ref[0]) or ref[1] not in _module(ref[0])[0]:
            continue
        seen.add(ref)
        todo += _references(ref[0], _module(ref[0])[0][ref[1]])
    return False


def handlers(raw: dict) -> dict[str, str]:
    """function name -> handler, for every function of lambdas/ in the service and workflows stacks."""
    return {p["FunctionName"]: p["Handler"] for stack in ("service", "workflows")
            for p in props(raw[stack], "AWS::Lambda::Function") if p.get("Handler", "").startswith("lambdas.")}


def pushing_names(prefix: str) -> set[str]:
    return ({f"{prefix}-{key}" for key in PUSH_FUNCTIONS}
            | {catalog.function_name(prefix, catalog.STEPS[key]) for key in PUSH_STEPS})


def test_the_tracer_sees_the_known_call_sites():
    assert reaches_push("lambdas.results.handler") and reaches_push("lambdas.reaper.handler")
    assert reaches_push("lambdas.api.handler")  # routes: DELETE /tasks/{id}, POST /tasks
    assert reaches_push(catalog.BATCH_PROGRESS.handler)  # chunk_failed
    assert not reaches_push("lambdas.ws.handler")  # remember/forget only
    assert not reaches_push("lambdas.history.handler") and not reaches_push("lambdas.ui.handler")


def test_the_functions_that_push_are_those_whose_code_reaches_push_notify(synth):
    every = handlers(synth["raw"])
    traced = {name for name, handler in every.items() if reaches_push(handler)}
    assert traced == pushing_names("skyfn-ci"), (
        "infra/aws/config.py PUSH_FUNCTIONS / PUSH_STEPS must list exactly the functions that call "
        f"push.notify: traced {sorted(traced)}")
    configured = {p["FunctionName"] for stack in ("service", "workflows")
                  for p in props(synth["raw"][stack], "AWS::Lambda::Function")
                  if "SKYFN_PUSH" in (p.get("Environment") or {}).get("Variables", {})}
    assert configured == traced


def _names(synth, stack):
    return {p["FunctionName"] for p in props(synth["raw"][stack], "AWS::Lambda::Function") if "FunctionName" in p}


# --- the grants -----------------------------------------------------------------------
def _in(raw: dict, stack: str, value: dict) -> dict:
    """`value` (a Ref/GetAtt of the service stack) as `stack` sees it: itself, or the import
    of the service stack's export of it."""
    if stack == "service":
        return value
    (export,) = [o["Export"]["Name"] for o in raw["service"]["Outputs"].values()
                 if o.get("Value") == value and "Export" in o]
    return {"Fn::ImportValue": export}


def _push_ids(raw: dict) -> tuple[str, str]:
    (api,) = res(raw["service"], "AWS::ApiGatewayV2::Api")
    (table,) = [lid for lid, r in res(raw["service"], "AWS::DynamoDB::Table").items()
                if r["Properties"]["TableName"].endswith("-connections")]
    return api, table


def _touches_push(statement: dict, table_id: str) -> bool:
    return (any(a.startswith("execute-api:") for a in actions(statement))
            or table_id in resources_text(statement) or "-connections" in resources_text(statement))


@pytest.mark.parametrize("name", sorted(pushing_names("skyfn-ci")))
def test_each_pushing_function_gets_exactly_the_push_grants(synth, name):
    raw = synth["raw"]
    stack = "service" if name in _names(synth, "service") else "workflows"
    api_id, table_id = _push_ids(raw)
    api, table_arn = _in(raw, stack, {"Ref": api_id}), _in(raw, stack, {"Fn::GetAtt": [table_id, "Arn"]})
    _, fn = function(raw[stack], name)
    env = fn["Environment"]["Variables"]
    assert env["SKYFN_PUSH"] == "apigw"
    assert env["SKYFN_CONNECTION_TABLE"] == _in(raw, stack, {"Ref": table_id})
    assert env["SKYFN_WS_ENDPOINT"] == {"Fn::Join": ["", [
        "https://", api, ".execute-api.eu-west-1.", {"Ref": "AWS::URLSuffix"}, "/ci"]]}
    stmts = [s for s in function_statements(raw[stack], name) if _touches_push(s, table_id)]
    assert sorted(s["Sid"] for s in stmts) == ["ConnectionTableRead", "PostToConnections"], stmts
    by_sid = {s["Sid"]: s for s in stmts}
    # what lambdas/core/tasks/push.py calls: connections() queries the table, _post() deletes gone ones
    read = by_sid["ConnectionTableRead"]
    assert read["Effect"] == "Allow" and sorted(actions(read)) == ["dynamodb:DeleteItem", "dynamodb:Query"]
    assert read["Resource"] == table_arn  # the table itself: no index, no wildcard
    post = by_sid["PostToConnections"]
    assert post["Effect"] == "Allow" and actions(post) == ["execute-api:ManageConnections"]
    assert post["Resource"] == {"Fn::Join": ["", [
        "arn:", {"Ref": "AWS::Partition"}, ":execute-api:eu-west-1:123456789012:", api,
        "/ci/POST/@connections/*"]]}


def test_functions_that_never_push_get_none_of_it(synth, synth_globus):
    checked = set()
    for prefix, raw in (("skyfn-ci", synth["raw"]), ("skyfn-devglobus", synth_globus["raw"])):
        _, table_id = _push_ids(raw)
        for stack in ("service", "workflows"):
            for p in props(raw[stack], "AWS::Lambda::Function"):
                name = p.get("FunctionName")
                if not name or name in pushing_names(prefix):
                    continue
                env = (p.get("Environment") or {}).get("Variables", {})
                assert not {"SKYFN_PUSH", "SKYFN_WS_ENDPOINT"} & set(env), name
                stmts = [s for s in function_statements(raw[stack], name) if _touches_push(s, table_id)]
                if name == f"{prefix}-ws":  # the routes record and forget connections, nothing else
                    assert [sorted(actions(s)) for s in stmts] == [["dynamodb:DeleteItem", "dynamodb:PutItem"]]
                    assert stmts[0]["Resource"] == {"Fn::GetAtt": [table_id, "Arn"]}
                else:
                    assert stmts == [], name
                    assert "SKYFN_CONNECTION_TABLE" not in env, name
                checked.add(name.removeprefix(prefix + "-"))
    assert {"authorizer", "ui", "ws", "ws-authorizer", "history", "wf-SpmdInit"} <= checked


def test_nothing_else_may_post_to_connections(synth, synth_globus):
    """No policy anywhere grants ManageConnections beyond the stage's POST @connections/*."""
    for raw in (synth["raw"], synth_globus["raw"]):
        for stack, template in raw.items():
            for r in res(template, "AWS::IAM::Policy").values():
                for s in r["Properties"]["PolicyDocument"]["Statement"]:
                    if any(a.startswith("execute-api:") for a in actions(s)):
                        assert actions(s) == ["execute-api:ManageConnections"], (stack, s)
                        where = resources_text(s)
                        assert where.endswith('/POST/@connections/*"]]}'), (stack, where)
                        assert '"*"' not in where and "ResultsPushApi" in where, (stack, where)


def test_an_environment_agnostic_deployment_scopes_the_grants_to_each_stack(synth_globus):
    """Without an account in the context, each stack writes its own pseudo parameters into
    the ARN and URL; only the API id and the table come from the service stack."""
    raw = synth_globus["raw"]
    name = catalog.function_name("skyfn-devglobus", catalog.BATCH_PROGRESS)
    (post,) = [s for s in function_statements(raw["workflows"], name) if s.get("Sid") == "PostToConnections"]
    parts = post["Resource"]["Fn::Join"][1]
    assert {"Ref": "AWS::AccountId"} in parts and {"Ref": "AWS::Partition"} in parts
    assert any("Fn::ImportValue" in json.dumps(p) and "ResultsPushApi" in json.dumps(p) for p in parts)
    assert parts[-1] == "/devglobus/POST/@connections/*"


def test_dashboard_graphs_latency_per_stage_and_the_push(service):
    raw, _ = service
    (board,) = props(raw, "AWS::CloudWatch::Dashboard")
    body = json.dumps(board["DashboardBody"])
    for metric in ("StageServiceMs", "StageWaitingMs", "StageQueueMs", "StageDispatchMs", "StageRunMs", "StageReturnMs",
                   "TaskTotalMs", "TasksMeasured", "ConnectCount", "MessageCount"):
        assert metric in body, metric
    assert "Task latency per stage" in body and "ResultsPushApi" in body
