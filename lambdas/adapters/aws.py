"""S3 and Step Functions clients of the runs (batches, flows, SPMD groups) (boto3, honouring
AWS_ENDPOINT_URL, so moto or LocalStack serve them locally)."""
from __future__ import annotations

import functools
import json
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

_CONFIG = Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=5, read_timeout=60,
                 max_pool_connections=32)


@functools.lru_cache(maxsize=1)
def s3():
    return boto3.client("s3", config=_CONFIG)


@functools.lru_cache(maxsize=1)
def sfn():
    return boto3.client("stepfunctions", config=_CONFIG)


def put_json(bucket: str, key: str, value: Any) -> None:
    s3().put_object(Bucket=bucket, Key=key, Body=json.dumps(value, separators=(",", ":")).encode(),
                    ContentType="application/json")


def get_json(bucket: str, key: str) -> Any:
    return json.loads(s3().get_object(Bucket=bucket, Key=key)["Body"].read())


def ensure_machine(name: str, definition: str, role_arn: str) -> str:
    """Create the state machine `name`, or update its definition; returns its ARN."""
    client = sfn()
    try:
        return client.create_state_machine(name=name, definition=definition, roleArn=role_arn)["stateMachineArn"]
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "StateMachineAlreadyExists":
            raise
    arn = _arn_of(name)
    client.update_state_machine(stateMachineArn=arn, definition=definition, roleArn=role_arn)
    return arn


def _arn_of(name: str) -> str:
    for page in sfn().get_paginator("list_state_machines").paginate():
        for m in page["stateMachines"]:
            if m["name"] == name:
                return m["stateMachineArn"]
    raise LookupError(f"state machine {name} not found")


def start(machine_arn: str, name: str, payload: Any) -> str:
    return sfn().start_execution(stateMachineArn=machine_arn, name=name,
                                 input=json.dumps(payload, separators=(",", ":")))["executionArn"]


def describe(execution_arn: str) -> dict[str, Any]:
    return sfn().describe_execution(executionArn=execution_arn)
