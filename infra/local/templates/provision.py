"""Creates a Deployment's data resources in moto (or any AWS endpoint), idempotently:
DynamoDB tables (keys, indexes, billing, TTL, streams), SQS queues (dead-letter queues
first; redrive, visibility, retention), S3 buckets, Secrets Manager secrets (a generated
value unless the caller supplies one) and Step Functions state machines (resolved
definition and role). A second run changes nothing: existing resources are compared and
only what differs from the template is updated. IAM roles, Lambda functions and API
gateways are other parts' work."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from botocore.exceptions import ClientError

from infra.local.templates.model import Deployment, Queue, Secret, Table

# moto reads the `_custom_id_` tag as the random part of an id it generates: a secret
# created with it has exactly the ARN the templates' references resolved to.
CUSTOM_ID_TAG = "_custom_id_"

ClientFactory = Callable[[str], Any]


@dataclass
class ProvisionSummary:
    """Names per kind (tables, queues, buckets, secrets, state_machines)."""
    created: dict[str, list[str]] = field(default_factory=dict)
    updated: dict[str, list[str]] = field(default_factory=dict)
    unchanged: dict[str, list[str]] = field(default_factory=dict)

    def add(self, outcome: dict[str, list[str]], kind: str, name: str) -> None:
        outcome.setdefault(kind, []).append(name)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated)


def client_factory(deployment: Deployment, session_or_factory: Any = None) -> ClientFactory:
    """A function service name -> client: from a boto3 Session (or the default session)
    reaching the deployment's endpoint and region, or `session_or_factory` itself when it
    is already such a function."""
    if callable(session_or_factory) and not hasattr(session_or_factory, "client"):
        return session_or_factory
    if session_or_factory is None:
        import boto3

        session_or_factory = boto3.session.Session()
    settings = deployment.settings
    kwargs = {"region_name": settings.region}
    if settings.aws_endpoint_url:
        kwargs["endpoint_url"] = settings.aws_endpoint_url
    return lambda service: session_or_factory.client(service, **kwargs)


def provision(deployment: Deployment, session_or_client_factory: Any = None, *,
              secret_values: Mapping[str, str] | None = None) -> ProvisionSummary:
    """Create (or bring in line) the deployment's data resources. `secret_values` gives
    the value of a secret by its logical id, name or ARN (e.g. the Redis AUTH token must
    be the local redis password); other secrets get a value generated as the template's
    GenerateSecretString says, once."""
    clients = client_factory(deployment, session_or_client_factory)
    summary = ProvisionSummary()
    _Tables(clients("dynamodb"), summary).run(deployment.tables.values())
    _Queues(clients("sqs"), summary).run(deployment.queues.values())
    _buckets(clients("s3"), deployment, summary)
    _Secrets(clients("secretsmanager"), summary, dict(secret_values or {})).run(deployment.secrets.values())
    _state_machines(clients("stepfunctions"), deployment, summary)
    return summary


def _code(exc: ClientError) -> str:
    return exc.response.get("Error", {}).get("Code", "")


class _Tables:
    def __init__(self, client: Any, summary: ProvisionSummary):
        self.client, self.summary = client, summary

    def run(self, tables) -> None:
        for table in tables:
            created = self.create(table)
            ttl_changed = self.ensure_ttl(table)
            if created:
                self.summary.add(self.summary.created, "tables", table.name)
            else:
                self.summary.add(self.summary.updated if ttl_changed else self.summary.unchanged, "tables", table.name)

    def create(self, t: Table) -> bool:
        provisioned = t.billing_mode == "PROVISIONED"

        def index(spec: dict) -> dict:
            out = {k: spec[k] for k in ("IndexName", "KeySchema", "Projection") if k in spec}
            if provisioned and spec.get("ProvisionedThroughput"):
                out["ProvisionedThroughput"] = _throughput(spec["ProvisionedThroughput"])
            return out

        kwargs: dict[str, Any] = {"TableName": t.name, "KeySchema": t.key_schema,
                                  "AttributeDefinitions": t.attribute_definitions, "BillingMode": t.billing_mode}
        if provisioned:
            kwargs["ProvisionedThroughput"] = _throughput(t.provisioned_throughput or {})
        if t.global_secondary_indexes:
            kwargs["GlobalSecondaryIndexes"] = [index(i) for i in t.global_secondary_indexes]
        if t.local_secondary_indexes:
            kwargs["LocalSecondaryIndexes"] = [index(i) for i in t.local_secondary_indexes]
        if t.stream_view_type:
            kwargs["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": t.stream_view_type}
        try:
            self.client.create_table(**kwargs)
        except ClientError as exc:
            if _code(exc) != "ResourceInUseException":
                raise
            return False
        self.client.get_waiter("table_exists").wait(TableName=t.name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})
        return True

    def ensure_ttl(self, t: Table) -> bool:
        if not t.ttl_attribute:
            return False
        current = self.client.describe_time_to_live(TableName=t.name).get("TimeToLiveDescription", {})
        enabled = current.get("TimeToLiveStatus") in ("ENABLED", "ENABLING")
        if enabled and current.get("AttributeName") == t.ttl_attribute:
            return False
        self.client.update_time_to_live(TableName=t.name, TimeToLiveSpecification={
            "Enabled": True, "AttributeName": t.ttl_attribute})
        return True


def _throughput(spec: dict) -> dict:
    return {"ReadCapacityUnits": int(spec.get("ReadCapacityUnits", 5)),
            "WriteCapacityUnits": int(spec.get("WriteCapacityUnits", 5))}


class _Queues:
    def __init__(self, client: Any, summary: ProvisionSummary):
        self.client, self.summary = client, summary

    def run(self, queues) -> None:
        for queue in _dead_letter_queues_first(list(queues)):
            wanted = queue.attributes()
            try:
                url = self.client.get_queue_url(QueueName=queue.name)["QueueUrl"]
            except ClientError as exc:
                if _code(exc) not in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"):
                    raise
                self.client.create_queue(QueueName=queue.name, Attributes=wanted)
                self.summary.add(self.summary.created, "queues", queue.name)
                continue
            current = self.client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"]).get("Attributes", {})
            differing = {k: v for k, v in wanted.items()
                         if k != "FifoQueue" and not _same_attribute(k, current.get(k), v)}
            if differing:
                self.client.set_queue_attributes(QueueUrl=url, Attributes=differing)
                self.summary.add(self.summary.updated, "queues", queue.name)
            else:
                self.summary.add(self.summary.unchanged, "queues", queue.name)


def _same_attribute(name: str, current: str | None, wanted: str) -> bool:
    if current is None:
        return False
    if name == "RedrivePolicy":
        a, b = json.loads(current), json.loads(wanted)
        return (a.get("deadLetterTargetArn") == b.get("deadLetterTargetArn")
                and int(a.get("maxReceiveCount", 0)) == int(b.get("maxReceiveCount", 0)))
    return str(current) == str(wanted)


def _dead_letter_queues_first(queues: list[Queue]) -> list[Queue]:
    by_arn = {q.arn: q for q in queues}
    ordered: list[Queue] = []

    def visit(q: Queue, seen: frozenset) -> None:
        if q in ordered or q.arn in seen:
            return
        target = by_arn.get(q.redrive_target_arn or "")
        if target is not None:
            visit(target, seen | {q.arn})
        ordered.append(q)

    for q in queues:
        visit(q, frozenset())
    return ordered


def _buckets(client: Any, deployment: Deployment, summary: ProvisionSummary) -> None:
    region = deployment.settings.region
    for bucket in deployment.buckets.values():
        try:
            client.head_bucket(Bucket=bucket.name)   # create_bucket in us-east-1 succeeds again: ask first
        except ClientError as exc:
            if _code(exc) not in ("404", "NoSuchBucket", "NotFound"):
                raise
        else:
            summary.add(summary.unchanged, "buckets", bucket.name)
            continue
        kwargs: dict[str, Any] = {"Bucket": bucket.name}
        if region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        client.create_bucket(**kwargs)
        summary.add(summary.created, "buckets", bucket.name)


class _Secrets:
    def __init__(self, client: Any, summary: ProvisionSummary, values: dict[str, str]):
        self.client, self.summary, self.values = client, summary, values

    def supplied(self, s: Secret) -> str | None:
        for key in (s.logical_id, f"{s.stack}/{s.logical_id}", s.name, s.arn):
            if key in self.values:
                return self.values[key]
        return None

    def run(self, secrets) -> None:
        for secret in secrets:
            value = self.supplied(secret)
            try:
                self.client.describe_secret(SecretId=secret.arn)
            except ClientError as exc:
                if _code(exc) != "ResourceNotFoundException":
                    raise
                self.create(secret, value)
                continue
            if value is None and not secret.generated:
                value = secret.secret_string
            if value is not None and self.client.get_secret_value(SecretId=secret.arn).get("SecretString") != value:
                self.client.put_secret_value(SecretId=secret.arn, SecretString=value)
                self.summary.add(self.summary.updated, "secrets", secret.name)
            else:
                self.summary.add(self.summary.unchanged, "secrets", secret.name)

    def create(self, s: Secret, value: str | None) -> None:
        if value is None:
            value = s.secret_string if not s.generated else self.generate(s.generate or {})
        kwargs: dict[str, Any] = {"Name": s.name, "SecretString": value,
                                  "Tags": [{"Key": CUSTOM_ID_TAG, "Value": s.arn_suffix}]}
        if s.description:
            kwargs["Description"] = s.description
        arn = self.client.create_secret(**kwargs)["ARN"]
        if arn != s.arn:
            raise RuntimeError(f"secret {s.name} was created as {arn}, not {s.arn} as the templates' references "
                               f"resolved: the endpoint ignores the {CUSTOM_ID_TAG} tag (is it moto?)")
        self.summary.add(self.summary.created, "secrets", s.name)

    def generate(self, spec: dict) -> str:
        options = {k: spec[k] for k in ("ExcludeCharacters", "ExcludeNumbers", "ExcludePunctuation",
                                        "ExcludeUppercase", "ExcludeLowercase", "IncludeSpace",
                                        "RequireEachIncludedType") if k in spec}
        options["PasswordLength"] = int(spec.get("PasswordLength", 32))
        for k in ("ExcludeNumbers", "ExcludePunctuation", "ExcludeUppercase", "ExcludeLowercase", "IncludeSpace",
                  "RequireEachIncludedType"):
            if k in options:
                options[k] = str(options[k]).lower() == "true"
        password = self.client.get_random_password(**options)["RandomPassword"]
        if spec.get("SecretStringTemplate") and spec.get("GenerateStringKey"):
            document = json.loads(spec["SecretStringTemplate"])
            document[spec["GenerateStringKey"]] = password
            return json.dumps(document)
        return password


def _state_machines(client: Any, deployment: Deployment, summary: ProvisionSummary) -> None:
    existing = {m["name"]: m["stateMachineArn"] for page in client.get_paginator("list_state_machines").paginate()
                for m in page["stateMachines"]}
    for machine in deployment.state_machines.values():
        if machine.name not in existing:
            arn = client.create_state_machine(name=machine.name, definition=machine.definition,
                                              roleArn=machine.role_arn, type=machine.type)["stateMachineArn"]
            if arn != machine.arn:
                raise RuntimeError(f"state machine {machine.name} was created as {arn}, not {machine.arn} as the "
                                   "templates' references resolved: check the account and region settings")
            summary.add(summary.created, "state_machines", machine.name)
            continue
        current = client.describe_state_machine(stateMachineArn=existing[machine.name])
        if current.get("definition") != machine.definition or current.get("roleArn") != machine.role_arn:
            client.update_state_machine(stateMachineArn=existing[machine.name], definition=machine.definition,
                                        roleArn=machine.role_arn)
            summary.add(summary.updated, "state_machines", machine.name)
        else:
            summary.add(summary.unchanged, "state_machines", machine.name)
