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
    arn = machine_arn(name, role_arn, client.meta.region_name)
    client.update_state_machine(stateMachineArn=arn, definition=definition, roleArn=role_arn)
    return arn


def machine_arn(name: str, role_arn: str, region: str) -> str:
    """The ARN of the state machine `name` of the account its role belongs to: built, not
    listed (states:ListStateMachines is only grantable on "*", which the API role does not get)."""
    partition, account = role_arn.split(":")[1], role_arn.split(":")[4]
    return f"arn:{partition}:states:{region}:{account}:stateMachine:{name}"


def start(machine_arn: str, name: str, payload: Any) -> str:
    return sfn().start_execution(stateMachineArn=machine_arn, name=name,
                                 input=json.dumps(payload, separators=(",", ":")))["executionArn"]


def describe(execution_arn: str) -> dict[str, Any]:
    return sfn().describe_execution(executionArn=execution_arn)
