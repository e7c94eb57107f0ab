"""Deploys the catalog's state machines to an AWS endpoint without CDK: the payload bucket, a
role, one Lambda function per step handler (Handler = our module.function, Environment =
the service settings) and every state machine, rendered. Idempotent: existing functions
get their configuration updated, existing state machines their definition.

The embedded runtime calls `deploy()` against moto (served by infra.local.standins.sfn.moto_bridge,
which runs these functions' handlers); tests call it against their own moto server.
`api_env()` is the environment the API handler needs to start runs of the deployed machines.
"""
from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass

import boto3
from botocore.exceptions import ClientError

from stepfunctions.catalog import (MACHINES, STEPS, function_name, machine_name, substitutions_for)
from stepfunctions.render import render

ROLE_NAME = "skyfn-local-workflows"
ASSUME_ROLE = json.dumps({"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": ["lambda.amazonaws.com", "states.amazonaws.com"]},
    "Action": "sts:AssumeRole"}]})


def placeholder_zip() -> bytes:
    # The bridge runs the handler from this checkout; the archive only satisfies the API.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("README.txt", "skyfn step handler: code runs from the skyfn checkout (infra.local.standins.sfn.moto_bridge)\n")
    return buf.getvalue()


@dataclass
class Deployment:
    prefix: str
    bucket: str
    role_arn: str
    function_arns: dict[str, str]    # step key -> function ARN
    machine_arns: dict[str, str]     # catalog name -> state machine ARN


def _clients(endpoint_url: str | None, region: str):
    kw = {"region_name": region}
    if endpoint_url:
        kw["endpoint_url"] = endpoint_url
    return (boto3.client("iam", **kw), boto3.client("s3", **kw), boto3.client("lambda", **kw),
            boto3.client("stepfunctions", **kw))


def deploy(function_env: dict[str, str], *, prefix: str = "skyfn", bucket: str = "skyfn-payloads",
           endpoint_url: str | None = None, region: str = "us-east-1") -> Deployment:
    iam, s3, lam, sfn = _clients(endpoint_url, region)
    try:
        role_arn = iam.create_role(RoleName=ROLE_NAME, AssumeRolePolicyDocument=ASSUME_ROLE)["Role"]["Arn"]
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "EntityAlreadyExists":
            raise
        role_arn = iam.get_role(RoleName=ROLE_NAME)["Role"]["Arn"]
    try:
        s3.create_bucket(Bucket=bucket)
    except ClientError as exc:
        if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise

    function_arns = {}
    code = placeholder_zip()
    for key, step in STEPS.items():
        name = function_name(prefix, step)
        config = {"Role": role_arn, "Handler": step.handler, "Runtime": "python3.11",
                  "Timeout": step.timeout_seconds, "MemorySize": step.memory_mb,
                  "Environment": {"Variables": dict(function_env)}, "Description": step.description[:256]}
        try:
            arn = lam.create_function(FunctionName=name, Code={"ZipFile": code}, **config)["FunctionArn"]
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ResourceConflictException":
                raise
            arn = lam.update_function_configuration(FunctionName=name, **config)["FunctionArn"]
        function_arns[key] = arn

    machine_arns = {}
    existing = {m["name"]: m["stateMachineArn"] for page in sfn.get_paginator("list_state_machines").paginate()
                for m in page["stateMachines"]}
    for mname, machine in MACHINES.items():
        name = machine_name(prefix, machine)
        definition = render(machine, substitutions_for(machine, function_arns, bucket))
        if name in existing:
            sfn.update_state_machine(stateMachineArn=existing[name], definition=definition, roleArn=role_arn)
            machine_arns[mname] = existing[name]
        else:
            machine_arns[mname] = sfn.create_state_machine(name=name, definition=definition, roleArn=role_arn,
                                                           type=machine.type)["stateMachineArn"]
    return Deployment(prefix, bucket, role_arn, function_arns, machine_arns)


def _partition(region: str) -> str:
    return "aws-cn" if region.startswith("cn-") else "aws-us-gov" if region.startswith("us-gov-") else "aws"


def planned(*, prefix: str = "skyfn", bucket: str = "skyfn-payloads", region: str = "us-east-1",
            account: str) -> Deployment:
    """The Deployment deploy() makes in `account`, named before it is made: ARNs follow from
    names, as CloudFormation's Fn::Sub builds them for the CDK app. The embedded runtime
    starts the API's environments with api_env(planned(...)) while deploy() runs, then
    checks deploy()'s answer against it (`check`)."""
    part = _partition(region)
    return Deployment(
        prefix, bucket, f"arn:{part}:iam::{account}:role/{ROLE_NAME}",
        {key: f"arn:{part}:lambda:{region}:{account}:function:{function_name(prefix, step)}"
         for key, step in STEPS.items()},
        {key: f"arn:{part}:states:{region}:{account}:stateMachine:{machine_name(prefix, machine)}"
         for key, machine in MACHINES.items()})


def check(deployed: Deployment, plan: Deployment) -> None:
    """deploy()'s answer is what was planned (what the API's environments were given)."""
    differ = {k: (v, api_env(deployed)[k]) for k, v in api_env(plan).items() if api_env(deployed)[k] != v}
    if differ:
        raise RuntimeError("the deployed state machines are not named as planned (planned, deployed): "
                           + "; ".join(f"{k}: {a} != {b}" for k, (a, b) in differ.items()))


def api_env(dep: Deployment) -> dict[str, str]:
    """What the API handler reads to start runs of the deployed machines (see catalog.API_ENV)."""
    return {
        "SKYFN_BATCH_FANOUT_ARN": dep.machine_arns["batch-fanout"],
        "SKYFN_SPMD_GROUP_ARN": dep.machine_arns["spmd-group"],
        "SKYFN_RUN_TASK_FUNCTION_ARN": dep.function_arns["RunTask"],
        "SKYFN_FLOW_ROLE_ARN": dep.role_arn,
        "SKYFN_BUCKET": dep.bucket,
    }
