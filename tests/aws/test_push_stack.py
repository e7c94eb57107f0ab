"""The results push in the CDK app (issue 13): the WebSocket API, its authorizer with the
REST API's tokens, the connection table with TTL, and the results function posting to
connections with least privilege (infra/aws/stacks/push.py). Runs in .venv/cdk."""
from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Match

from tests.aws.test_stacks import actions, function, function_statements, props, res, resources_text


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


def _push_statements(raw, name):
    return [s for s in function_statements(raw, name)
            if any(a.startswith(("execute-api:", "dynamodb:")) for a in actions(s))]


def test_results_function_posts_to_connections_with_least_privilege(service):
    raw, _ = service
    _, fn = function(raw, "skyfn-ci-results")
    env = fn["Environment"]["Variables"]
    assert env["SKYFN_PUSH"] == "apigw" and "ResultsPushConnectionTable" in json.dumps(env["SKYFN_CONNECTION_TABLE"])
    assert "execute-api" in json.dumps(env["SKYFN_WS_ENDPOINT"]) and "/ci" in json.dumps(env["SKYFN_WS_ENDPOINT"])
    stmts = {s["Sid"]: s for s in _push_statements(raw, "skyfn-ci-results")}
    assert set(stmts) == {"ConnectionTableRead", "PostToConnections"}
    assert actions(stmts["PostToConnections"]) == ["execute-api:ManageConnections"]
    where = resources_text(stmts["PostToConnections"])
    assert "ResultsPushApi" in where and "/ci/POST/@connections/*" in where and '"*"' not in where
    assert sorted(actions(stmts["ConnectionTableRead"])) == ["dynamodb:DeleteItem", "dynamodb:Query"]
    assert "ResultsPushConnectionTable" in resources_text(stmts["ConnectionTableRead"])
    # the routes function writes connections and nothing else of DynamoDB; nobody else posts
    (routes,) = _push_statements(raw, "skyfn-ci-ws")
    assert sorted(actions(routes)) == ["dynamodb:DeleteItem", "dynamodb:PutItem"]
    assert "ResultsPushConnectionTable" in resources_text(routes)
    for key in ("api", "reaper", "history", "ws", "ws-authorizer"):
        assert not any("execute-api:ManageConnections" in actions(s)
                       for s in function_statements(raw, f"skyfn-ci-{key}")), key
    _, api = function(raw, "skyfn-ci-api")
    assert "SKYFN_PUSH" not in api["Environment"]["Variables"]  # push is "off" with SQS: the results function posts


def test_dashboard_graphs_latency_per_stage_and_the_push(service):
    raw, _ = service
    (board,) = props(raw, "AWS::CloudWatch::Dashboard")
    body = json.dumps(board["DashboardBody"])
    for metric in ("StageServiceMs", "StageQueueMs", "StageDispatchMs", "StageRunMs", "StageReturnMs",
                   "TaskTotalMs", "TasksMeasured", "ConnectCount", "MessageCount"):
        assert metric in body, metric
    assert "Task latency per stage" in body and "ResultsPushApi" in body
