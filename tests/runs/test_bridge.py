"""The moto Lambda bridge (infra.local.standins.sfn.moto_bridge, started by start_moto): invoking a
function whose handler is one of the catalog's runs that handler's real code, its
exception coming back as a Lambda function error; any other function keeps moto's
behaviour (an echo)."""
from __future__ import annotations

import json

import boto3


def _lambda(url):
    return boto3.client("lambda", endpoint_url=url, region_name="us-east-1")


def _function(lam, iam, name, handler, env):
    role = iam.create_role(RoleName=f"r-{name}", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    lam.create_function(FunctionName=name, Role=role, Handler=handler, Runtime="python3.11",
                        Code={"ZipFile": b"PK\x05\x06" + b"\0" * 18}, Environment={"Variables": env})


def test_catalog_handler_runs_for_real_and_others_echo(aws_endpoint, redis_url, unique):
    lam, iam = _lambda(aws_endpoint), boto3.client("iam", endpoint_url=aws_endpoint, region_name="us-east-1")
    env = {"SKYFN_REDIS_URL": redis_url, "AWS_ENDPOINT_URL": aws_endpoint}
    _function(lam, iam, f"run-task-{unique}", "lambdas.sfn_steps.run_task.handler", env)
    _function(lam, iam, f"other-{unique}", "index.handler", env)

    r = lam.invoke(FunctionName=f"run-task-{unique}", Payload=json.dumps({"action": "nope"}))
    assert r["FunctionError"] == "Unhandled"
    error = json.loads(r["Payload"].read())
    assert error["errorType"] == "ValueError" and "unknown action 'nope'" in error["errorMessage"]
    assert any("run_task.py" in line for line in error["stackTrace"])

    r = lam.invoke(FunctionName=f"other-{unique}", Payload=json.dumps({"action": "nope"}))
    assert "FunctionError" not in r and json.loads(r["Payload"].read()) == {"action": "nope"}
