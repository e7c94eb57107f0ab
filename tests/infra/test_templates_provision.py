"""infra.local.templates.provision against a real moto server (the runtime's own launcher):
the synthesized templates' tables, queues, bucket, secrets and state machines exist as the
model describes them, their references (queue URLs, secret and state machine ARNs) reach
them, and provisioning again changes nothing."""
from __future__ import annotations

import json

import boto3
import pytest

from infra.local.processes import start_moto
from infra.local.templates import CloudAssembly, Deployment, LocalSettings
from infra.local.templates.provision import provision
from tests.infra.test_templates_model import synthesized_assembly

REDIS_PASSWORD = "local-redis-password"


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    server = start_moto(tmp_path_factory.mktemp("moto-templates"))   # its own: names are the templates'
    yield server
    server.stop()


@pytest.fixture(scope="module")
def dep(tmp_path_factory, moto) -> Deployment:
    assembly = CloudAssembly.load(synthesized_assembly(tmp_path_factory))
    return Deployment.from_assembly(assembly, LocalSettings(aws_endpoint_url=moto.url))


@pytest.fixture(scope="module")
def client(moto):
    return lambda service: boto3.client(service, endpoint_url=moto.url, region_name="us-east-1")


@pytest.fixture(scope="module")
def first(dep, client):
    iam = client("iam")
    for machine in dep.state_machines.values():   # roles are the IAM part's; a plain one will do here
        role = dep.role_by_arn(machine.role_arn)
        iam.create_role(RoleName=role.name, Path=role.path,
                        AssumeRolePolicyDocument=json.dumps(role.assume_role_policy))
    token = next(s for s in dep.secrets.values() if s.logical_id.startswith("RedisAuthToken"))
    return provision(dep, client, secret_values={token.logical_id: REDIS_PASSWORD})


def test_first_run_creates_everything(first, dep):
    assert sorted(first.created["tables"]) == sorted(dep.tables)
    assert sorted(first.created["queues"]) == sorted(dep.queues)
    assert first.created["buckets"] == list(dep.buckets)
    assert sorted(first.created["secrets"]) == sorted(dep.secrets)
    assert sorted(first.created["state_machines"]) == sorted(dep.state_machines)
    assert not first.updated


def test_tables_have_the_template_keys_indexes_and_ttl(first, dep, client):
    ddb = client("dynamodb")
    history = ddb.describe_table(TableName="skyfn-dev-history")["Table"]
    assert history["KeySchema"] == dep.tables["skyfn-dev-history"].key_schema
    assert history["TableArn"] == dep.tables["skyfn-dev-history"].arn
    assert history["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    ttl = ddb.describe_time_to_live(TableName="skyfn-dev-submissions")["TimeToLiveDescription"]
    assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "expires_at")
    assert ddb.describe_time_to_live(TableName="skyfn-dev-connections")["TimeToLiveDescription"]["AttributeName"] == \
        "expires"
    endpoints = ddb.describe_table(TableName="skyfn-dev-endpoints")["Table"]
    assert [(i["IndexName"], i["KeySchema"]) for i in endpoints["GlobalSecondaryIndexes"]] == [
        ("owner-index", [{"AttributeName": "owner", "KeyType": "HASH"}])]


def test_queues_have_redrive_and_their_model_urls_reach_them(first, dep, client):
    sqs = client("sqs")
    results, dlq = dep.queues["skyfn-dev-results"], dep.queues["skyfn-dev-results-dlq"]
    for queue in dep.queues.values():
        assert sqs.get_queue_url(QueueName=queue.name)["QueueUrl"] == queue.url
    attrs = sqs.get_queue_attributes(QueueUrl=results.url, AttributeNames=["All"])["Attributes"]
    redrive = json.loads(attrs["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == dlq.arn and int(redrive["maxReceiveCount"]) == 5
    assert (attrs["VisibilityTimeout"], attrs["QueueArn"]) == ("60", results.arn)
    assert sqs.get_queue_attributes(QueueUrl=dlq.url, AttributeNames=["MessageRetentionPeriod"])["Attributes"] == {
        "MessageRetentionPeriod": "1209600"}
    sqs.send_message(QueueUrl=results.url, MessageBody="through the model's URL")
    got = sqs.receive_message(QueueUrl=results.url, WaitTimeSeconds=1)["Messages"]
    assert [m["Body"] for m in got] == ["through the model's URL"]
    sqs.delete_message(QueueUrl=results.url, ReceiptHandle=got[0]["ReceiptHandle"])


def test_bucket_and_secrets(first, dep, client):
    (bucket,) = dep.buckets.values()
    client("s3").head_bucket(Bucket=bucket.name)
    sm = client("secretsmanager")
    for secret in dep.secrets.values():
        described = sm.describe_secret(SecretId=secret.arn)      # the ARN the functions' SKYFN_SECRET_ENV names
        assert (described["ARN"], described["Name"]) == (secret.arn, secret.name)
    token = next(s for s in dep.secrets.values() if s.logical_id.startswith("RedisAuthToken"))
    assert sm.get_secret_value(SecretId=token.arn)["SecretString"] == REDIS_PASSWORD
    rendezvous = next(s for s in dep.secrets.values() if s.logical_id.startswith("RendezvousSecret"))
    generated = sm.get_secret_value(SecretId=rendezvous.arn)["SecretString"]
    assert len(generated) == 64 and generated.isalnum()          # PasswordLength 64, ExcludePunctuation
    names = json.loads(dep.functions["skyfn-dev-api"].environment["SKYFN_SECRET_ENV"])
    assert sm.get_secret_value(SecretId=names["SKYFN_REDIS_PASSWORD"])["SecretString"] == REDIS_PASSWORD


def test_state_machines_run_the_model_functions(first, dep, client):
    sfn = client("stepfunctions")
    for machine in dep.state_machines.values():
        described = sfn.describe_state_machine(stateMachineArn=machine.arn)
        assert (described["name"], described["roleArn"], described["type"]) == (machine.name, machine.role_arn,
                                                                                 "STANDARD")
        assert described["definition"] == machine.definition
    spmd = json.loads(sfn.describe_state_machine(stateMachineArn=dep.state_machines["skyfn-dev-spmd-group"].arn)
                      ["definition"])
    arns = set()

    def collect(node):
        if isinstance(node, dict):
            if isinstance(node.get("FunctionName"), str):
                arns.add(node["FunctionName"])
            for v in node.values():
                collect(v)
        elif isinstance(node, list):
            for v in node:
                collect(v)

    collect(spmd)
    assert arns == {dep.functions["skyfn-dev-wf-SpmdInit"].arn, dep.functions["skyfn-dev-wf-RunTask"].arn}


def test_provisioning_again_changes_nothing(first, dep, client):
    token = next(s for s in dep.secrets.values() if s.logical_id.startswith("RedisAuthToken"))
    rendezvous = next(s for s in dep.secrets.values() if s.logical_id.startswith("RendezvousSecret"))
    sm = client("secretsmanager")
    before = sm.get_secret_value(SecretId=rendezvous.arn)["SecretString"]
    again = provision(dep, client, secret_values={token.name: REDIS_PASSWORD})
    assert not again.changed, again
    assert sorted(again.unchanged["tables"]) == sorted(dep.tables)
    assert sorted(again.unchanged["queues"]) == sorted(dep.queues)
    assert sorted(again.unchanged["state_machines"]) == sorted(dep.state_machines)
    assert sm.get_secret_value(SecretId=rendezvous.arn)["SecretString"] == before   # generated once

    # a new local redis password is written into the existing secret, and only that changes
    changed = provision(dep, client, secret_values={token.arn: "another-password"})
    assert changed.updated == {"secrets": [token.name]} and not changed.created
    assert sm.get_secret_value(SecretId=token.arn)["SecretString"] == "another-password"
    provision(dep, client, secret_values={token.logical_id: REDIS_PASSWORD})
