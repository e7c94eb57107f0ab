"""lambdas/adapters/aws.ensure_machine: a flow's state machine is created once and updated
in place when it exists, its ARN built from the role's account (the API role has no
states:ListStateMachines, which AWS only grants on "*")."""
from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from lambdas.adapters import aws

DEFINITION = {"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}}


@pytest.fixture
def stepfunctions(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        role = boto3.client("iam").create_role(RoleName="flow", AssumeRolePolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                    "Principal": {"Service": "states.amazonaws.com"}}]}))
        yield role["Role"]["Arn"]


def test_the_built_arn_is_the_one_step_functions_gives(stepfunctions):
    # (moto answers a second create of the same name with the existing ARN where AWS says
    # StateMachineAlreadyExists, so the update branch itself is AWS's to exercise)
    first = aws.ensure_machine("skyfn-dev-flow-abc", json.dumps(DEFINITION), stepfunctions)
    assert first == aws.machine_arn("skyfn-dev-flow-abc", stepfunctions, "eu-west-1") == \
        "arn:aws:states:eu-west-1:123456789012:stateMachine:skyfn-dev-flow-abc"
    changed = json.dumps({**DEFINITION, "Comment": "second"})
    boto3.client("stepfunctions").update_state_machine(stateMachineArn=first, definition=changed)
    assert aws.ensure_machine("skyfn-dev-flow-abc", changed, stepfunctions) == first


def test_the_arn_follows_the_roles_partition_and_account():
    assert aws.machine_arn("m", "arn:aws-us-gov:iam::210987654321:role/flow", "us-gov-west-1") == \
        "arn:aws-us-gov:states:us-gov-west-1:210987654321:stateMachine:m"
