"""The status page in the CDK app (issue 13; infra/aws/stacks/status_page.py): GET /ui and
GET /ui/{proxy+} on the REST API without an authorizer while every data route keeps one,
the UI function told where the WebSocket API is, and its role and environment holding no
data access. Runs in .venv/cdk (cfn-lint of every template: test_stacks.py)."""
from __future__ import annotations

import json

import pytest

from tests.aws.test_stacks import actions, function, function_statements, props, res

PUBLIC_PATHS = {"/openapi.json", "/ui", "/ui/{proxy+}"}  # OpenAPI document, the page's files
DATA_ACTION_PREFIXES = ("dynamodb:", "sqs:", "s3:", "elasticache:", "secretsmanager:", "kms:", "execute-api:",
                        "states:", "sts:", "ec2:")
DATA_ENV = ("SKYFN_REDIS_URL", "SKYFN_TABLE_PREFIX", "SKYFN_SQS_PREFIX", "SKYFN_BUCKET", "SKYFN_SECRET_ENV",
            "SKYFN_CONNECTION_TABLE", "SKYFN_REDIS_PASSWORD", "SKYFN_RENDEZVOUS_SECRET")


def resource_paths(template: dict) -> dict[str, str]:
    """logical id of each AWS::ApiGateway::Resource -> its full path ("/ui/{proxy+}")."""
    resources = res(template, "AWS::ApiGateway::Resource")

    def path(lid: str) -> str:
        p = resources[lid]["Properties"]
        parent = p["ParentId"]
        head = path(parent["Ref"]) if isinstance(parent, dict) and "Ref" in parent else ""
        return f"{head}/{p['PathPart']}"

    return {lid: path(lid) for lid in resources}


def methods(template: dict) -> list[tuple[str, str, dict]]:
    """(path, HTTP method, properties) of every REST API method."""
    paths = resource_paths(template)
    out = []
    for m in props(template, "AWS::ApiGateway::Method"):
        rid = m["ResourceId"]
        out.append((paths[rid["Ref"]] if "Ref" in rid else "/", m["HttpMethod"], m))
    return out


@pytest.fixture(scope="module")
def service(synth):
    return synth["raw"]["service"]


def test_ui_routes_are_get_without_authorizer_on_the_ui_function(service):
    lid, _ = function(service, "skyfn-ci-ui")
    ui = {(path, verb): m for path, verb, m in methods(service) if path.startswith("/ui")}
    assert set(ui) == {("/ui", "GET"), ("/ui/{proxy+}", "GET")}
    for m in ui.values():
        assert m["AuthorizationType"] == "NONE" and "AuthorizerId" not in m
        assert m["Integration"]["Type"] == "AWS_PROXY"
        assert lid in json.dumps(m["Integration"]["Uri"])
    # API Gateway may invoke the function for these two paths of this API only
    perms = [p for p in props(service, "AWS::Lambda::Permission") if lid in json.dumps(p["FunctionName"])]
    assert perms and all(p["Principal"] == "apigateway.amazonaws.com" for p in perms)
    assert all("/GET/ui" in json.dumps(p["SourceArn"]) for p in perms)


@pytest.mark.parametrize("variant,kind", [("synth", "COGNITO_USER_POOLS"), ("synth_globus", "CUSTOM")])
def test_every_data_route_keeps_its_authorizer(variant, kind, request):
    template = request.getfixturevalue(variant)["raw"]["service"]
    seen = set()
    for path, verb, m in methods(template):
        seen.add(path)
        if path in PUBLIC_PATHS:
            assert verb == "GET" and m["AuthorizationType"] == "NONE", (path, verb)
        else:
            assert m["AuthorizationType"] == kind and "AuthorizerId" in m, (path, verb)
    assert {"/", "/{proxy+}"} <= seen and PUBLIC_PATHS <= seen


def test_ui_function_knows_the_websocket_url_and_nothing_of_the_data(service):
    _, fn = function(service, "skyfn-ci-ui")
    assert fn["Handler"] == "lambdas.ui.handler" and fn["Runtime"] == "python3.11" and fn["Architectures"] == ["arm64"]
    assert len(fn["Layers"]) == 1  # Powertools
    assert fn["ReservedConcurrentExecutions"] == 5  # reachable without a token: capped
    assert "VpcConfig" not in fn  # nothing to reach inside the VPC
    env = fn["Environment"]["Variables"]
    ws = json.dumps(env["SKYFN_WS_URL"])
    assert "wss://" in ws and "ResultsPushApi" in ws and "/ci" in ws
    assert not set(DATA_ENV) & set(env), set(DATA_ENV) & set(env)
    assert "resolve:secretsmanager" not in json.dumps(env)


def test_ui_role_has_no_data_permissions(service):
    _, fn = function(service, "skyfn-ci-ui")
    granted = [a for s in function_statements(service, "skyfn-ci-ui") for a in actions(s)]
    assert granted and all(a.startswith("xray:") for a in granted), granted  # active tracing only
    assert not [a for a in granted if a.startswith(DATA_ACTION_PREFIXES)]
    role = res(service, "AWS::IAM::Role")[fn["Role"]["Fn::GetAtt"][0]]["Properties"]
    managed = json.dumps(role.get("ManagedPolicyArns", []))
    assert "AWSLambdaBasicExecutionRole" in managed and "VPCAccess" not in managed
    assert role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "lambda.amazonaws.com"}
    # and no secret policy names this role
    for p in props(service, "AWS::SecretsManager::ResourcePolicy"):
        assert fn["Role"]["Fn::GetAtt"][0] not in json.dumps(p)


def test_ui_function_alarms_and_its_url_is_an_output(service):
    lid, _ = function(service, "skyfn-ci-ui")
    alarms = [p for p in props(service, "AWS::CloudWatch::Alarm")
              if {"Ref": lid} in [d["Value"] for d in p["Dimensions"]]]
    assert {a["MetricName"] for a in alarms} == {"Errors", "Throttles"}
    (url,) = [v for k, v in service["Outputs"].items() if k.startswith("StatusPageUrl")]
    assert "/ui/" in json.dumps(url["Value"])
