"""Every stack of infra/aws, synthesized once (conftest.py): resources and their
properties, least privilege of every role, encryption everywhere, nothing public but the
API and the rendezvous port, names that match what the handlers look for, and cfn-lint."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from aws_cdk.assertions import Match

from infra.aws import sizing
from infra.aws.config import FUNCTIONS, RESULTS_BATCH_SIZE
from infra.aws.stacks.service import SQS_ENDPOINT_QUEUE_ACTIONS
from lambdas.core.identity.agent_credentials import CONSUME_ACTIONS, RESULT_ACTIONS
from stepfunctions import catalog


# --- helpers -------------------------------------------------------------------------
def res(template: dict, rtype: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == rtype}


def props(template: dict, rtype: str) -> list[dict]:
    return [v.get("Properties", {}) for v in res(template, rtype).values()]


def function(template: dict, name: str) -> tuple[str, dict]:
    for lid, r in res(template, "AWS::Lambda::Function").items():
        if r["Properties"].get("FunctionName") == name:
            return lid, r["Properties"]
    raise AssertionError(f"no function {name}")


def role_statements(template: dict, role_id: str) -> list[dict]:
    out = []
    for r in res(template, "AWS::IAM::Policy").values():
        if {"Ref": role_id} in r["Properties"]["Roles"]:
            out.extend(r["Properties"]["PolicyDocument"]["Statement"])
    return out


def function_statements(template: dict, name: str) -> list[dict]:
    _, p = function(template, name)
    return role_statements(template, p["Role"]["Fn::GetAtt"][0])


def actions(statement: dict) -> list[str]:
    a = statement["Action"]
    return [a] if isinstance(a, str) else a


def resources_text(statement: dict) -> str:
    return json.dumps(statement.get("Resource"))


def dynamo_access(statements: list[dict]) -> dict[str, set[str]]:
    """table logical name (as in the export) -> DynamoDB actions granted on it."""
    out: dict[str, set[str]] = {}
    for s in statements:
        acts = {a for a in actions(s) if a.startswith("dynamodb:")}
        if not acts:
            continue
        text = resources_text(s)
        for table in ("Functions", "Endpoints", "Submissions", "History"):
            if f"{table}Table" in text:
                out.setdefault(table.lower(), set()).update(acts)
    return out


DYNAMO_WRITES = {"dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem"}


@pytest.fixture(scope="module")
def t(synth):
    return synth["raw"]


@pytest.fixture(scope="module")
def tpl(synth):
    return synth["templates"]


# --- the set of stacks ------------------------------------------------------------------
def test_one_stack_per_part(t):
    assert set(t) == {"network", "data", "service", "agent-access", "rendezvous", "workflows"}


# --- network --------------------------------------------------------------------------
def test_network_two_azs_nat_and_endpoints(tpl, t):
    n = tpl["network"]
    n.resource_count_is("AWS::EC2::VPC", 1)
    n.resource_count_is("AWS::EC2::Subnet", 6)  # public, private, isolated x 2 AZs
    n.resource_count_is("AWS::EC2::NatGateway", 1)
    endpoints = props(t["network"], "AWS::EC2::VPCEndpoint")
    gateways = [json.dumps(e["ServiceName"]) for e in endpoints if e.get("VpcEndpointType") == "Gateway"]
    assert sorted(g.split(".")[-1].strip('"]}') for g in gateways) == ["dynamodb", "s3"]
    interfaces = sorted(json.dumps(e["ServiceName"]).split(".")[-1].strip('"]}') for e in endpoints
                        if e.get("VpcEndpointType") == "Interface")
    assert interfaces == ["logs", "secretsmanager", "sqs", "states", "sts"]
    assert all(e.get("PrivateDnsEnabled") for e in endpoints if e.get("VpcEndpointType") == "Interface")


# --- data --------------------------------------------------------------------------------
def test_tables_have_the_keys_and_indexes_the_service_queries(t):
    tables = {p["TableName"]: p for p in props(t["data"], "AWS::DynamoDB::Table")}
    assert set(tables) == {f"skyfn-ci-{n}" for n in ("functions", "endpoints", "submissions", "history")}
    keys = {name: [(k["AttributeName"], k["KeyType"]) for k in p["KeySchema"]] for name, p in tables.items()}
    assert keys == {"skyfn-ci-functions": [("function_id", "HASH")], "skyfn-ci-endpoints": [("endpoint_id", "HASH")],
                    "skyfn-ci-submissions": [("submission_id", "HASH")],
                    "skyfn-ci-history": [("k", "HASH"), ("s", "RANGE")]}  # pages and markers (issue 24)
    gsi = {name: [(i["IndexName"], [(k["AttributeName"], k["KeyType"]) for k in i["KeySchema"]],
                   i["Projection"]["ProjectionType"]) for i in p.get("GlobalSecondaryIndexes", [])]
           for name, p in tables.items()}
    assert gsi["skyfn-ci-endpoints"] == [("owner-index", [("owner", "HASH")], "ALL")]
    assert gsi["skyfn-ci-history"] == []  # no index: one write per page, not two per task
    assert tables["skyfn-ci-history"]["AttributeDefinitions"] == [{"AttributeName": "k", "AttributeType": "S"},
                                                                 {"AttributeName": "s", "AttributeType": "S"}]
    for name, p in tables.items():
        assert p["BillingMode"] == "PAY_PER_REQUEST"
        assert p["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
        assert p["SSESpecification"]["SSEEnabled"] is True and p["SSESpecification"]["SSEType"] == "KMS"
        assert p["DeletionProtectionEnabled"] is True  # stage "ci" retains data
    for name in ("skyfn-ci-submissions", "skyfn-ci-history"):
        assert tables[name]["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}


def test_redis_tls_auth_token_failover_noeviction(tpl, t):
    d = tpl["data"]
    d.has_resource_properties("AWS::ElastiCache::ReplicationGroup", {
        "Engine": "redis", "TransitEncryptionEnabled": True, "TransitEncryptionMode": "required",
        "AtRestEncryptionEnabled": True, "AutomaticFailoverEnabled": True, "MultiAZEnabled": True,
        "NumCacheClusters": 2, "Port": 6379,
        "AuthToken": Match.object_like({"Fn::Join": Match.array_with([Match.array_with(
            [Match.string_like_regexp("resolve:secretsmanager")])])}),
    })
    d.has_resource_properties("AWS::ElastiCache::ParameterGroup",
                              {"Properties": {"maxmemory-policy": "noeviction", "hash-max-listpack-value": "512"}})
    ingress = props(t["data"], "AWS::EC2::SecurityGroupIngress")
    assert len(ingress) == 1 and ingress[0]["FromPort"] == ingress[0]["ToPort"] == 6379
    assert "LambdaSg" in json.dumps(ingress[0]["SourceSecurityGroupId"])


def test_payload_bucket_encrypted_private_tls_only_expiring(tpl, t):
    d = tpl["data"]
    d.has_resource_properties("AWS::S3::Bucket", {
        "BucketEncryption": {"ServerSideEncryptionConfiguration": [Match.object_like({
            "ServerSideEncryptionByDefault": Match.object_like({"SSEAlgorithm": "aws:kms"})})]},
        "PublicAccessBlockConfiguration": {"BlockPublicAcls": True, "BlockPublicPolicy": True,
                                           "IgnorePublicAcls": True, "RestrictPublicBuckets": True},
        "LifecycleConfiguration": {"Rules": [Match.object_like({"ExpirationInDays": 30, "Status": "Enabled"})]},
    })
    (policy,) = props(t["data"], "AWS::S3::BucketPolicy")
    deny = [s for s in policy["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert deny and deny[0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


# --- service ---------------------------------------------------------------------------------
def test_functions_match_the_config_module(t):
    fns = {p["FunctionName"]: p for p in props(t["service"], "AWS::Lambda::Function") if "FunctionName" in p}
    for key, spec in FUNCTIONS.items():
        p = fns[f"skyfn-ci-{key}"]
        assert p["Handler"] == spec.handler and p["MemorySize"] == spec.memory_mb and p["Timeout"] == spec.timeout_s
        assert p["Runtime"] == "python3.11" and p["Architectures"] == ["arm64"]
        reserved = sizing.reserved_concurrency(4) if key == "history" else spec.reserved_concurrency
        assert p.get("ReservedConcurrentExecutions") == reserved  # history: 2 x drainers (sizing.py)
        assert p["TracingConfig"] == {"Mode": "Active"} and len(p["Layers"]) == 1
        assert len(p["VpcConfig"]["SubnetIds"]) == 2 and "LambdaSg" in json.dumps(p["VpcConfig"]["SecurityGroupIds"])
    assert "skyfn-ci-authorizer" not in fns  # Cognito: no Lambda authorizer


def test_environment_is_what_lambdas_config_reads(t, monkeypatch):
    from lambdas.config import settings

    _, p = function(t["service"], "skyfn-ci-api")
    env = p["Environment"]["Variables"]
    assert {k: env[k] for k in ("SKYFN_QUEUE_KIND", "SKYFN_TABLE_PREFIX", "SKYFN_SQS_PREFIX",
                                "SKYFN_LEASE_SECONDS", "SKYFN_MAX_DELIVERIES", "SKYFN_AUTH_PROVIDER")} == {
        "SKYFN_QUEUE_KIND": "sqs", "SKYFN_TABLE_PREFIX": "skyfn-ci", "SKYFN_SQS_PREFIX": "skyfn-ci",
        "SKYFN_LEASE_SECONDS": "60", "SKYFN_MAX_DELIVERIES": "5", "SKYFN_AUTH_PROVIDER": "cognito"}
    assert "rediss://" in json.dumps(env["SKYFN_REDIS_URL"])  # TLS to ElastiCache
    assert "SKYFN_REDIS_PASSWORD" in json.dumps(env["SKYFN_SECRET_ENV"])  # the token by ARN, not by value
    assert "SKYFN_AUTH_SECRET" not in env and "resolve:secretsmanager" not in json.dumps(env)
    for k in ("SKYFN_QUEUE_KIND", "SKYFN_TABLE_PREFIX", "SKYFN_SQS_PREFIX", "SKYFN_LEASE_SECONDS",
              "SKYFN_MAX_DELIVERIES"):
        monkeypatch.setenv(k, env[k])
    settings.cache_clear()
    try:
        s = settings()
        queues = {p["QueueName"]: p for p in props(t["service"], "AWS::SQS::Queue")}
        results = queues[s.results_queue_name]
        assert results["VisibilityTimeout"] == s.lease_seconds
        assert results["RedrivePolicy"]["maxReceiveCount"] == s.max_deliveries
        assert f"{s.results_queue_name}-dlq" in queues  # the name SqsQueue.ensure() gives its DLQ
        tables = {p["TableName"] for p in props(t["data"], "AWS::DynamoDB::Table")}
        assert {f"{s.table_prefix}-{n}" for n in ("functions", "endpoints", "submissions", "history")} == tables
    finally:
        settings.cache_clear()
    for fn in catalog.API_ENV:
        assert fn in env, f"the API handler reads {fn} (stepfunctions/catalog.py) but the stack does not set it"


def test_each_handler_gets_only_its_tables(t):
    access = {key: dynamo_access(function_statements(t["service"], f"skyfn-ci-{key}")) for key in FUNCTIONS}
    assert set(access["api"]) == {"functions", "endpoints", "history"}
    # exactly what lambdas/adapters/dynamodb.py and lambdas/core/identity call (issue 25):
    # no Scan, BatchGetItem, ConditionCheckItem, DescribeTable, DeleteItem or stream reads
    assert access["api"]["functions"] == {"dynamodb:GetItem", "dynamodb:PutItem"}
    assert access["api"]["endpoints"] == {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem",
                                          "dynamodb:Query"}  # Query: the owner-index
    assert access["api"]["history"] == {"dynamodb:Query"}  # read-only, pages and markers by key condition
    assert set(access["history"]) == {"submissions", "history"}
    assert access["history"]["history"] == {"dynamodb:BatchWriteItem"}  # pages, markers (batch_writer)
    assert access["history"]["submissions"] == {"dynamodb:BatchWriteItem"}
    # releasing dependents (issue 26): function bodies and share items not in Redis, by key
    for key in ("results", "reaper"):
        assert access[key] == {"functions": {"dynamodb:GetItem"}, "endpoints": {"dynamodb:GetItem"}}, key


def test_each_handler_gets_only_its_queues(t):
    def sqs(key):
        return [(sorted(a for a in actions(s) if a.startswith("sqs:")), resources_text(s))
                for s in function_statements(t["service"], f"skyfn-ci-{key}") if any(a.startswith("sqs:") for a in actions(s))]

    for key in FUNCTIONS:
        for acts, where in sqs(key):
            assert "sqs:*" not in acts and "sqs:DeleteQueue" not in acts
            assert '"*"' not in where, f"{key}: SQS on every queue"
    api = sqs("api")
    assert all("skyfn-ci-tasks-*" in w and "skyfn-ci-control-*" in w for a, w in api if "sqs:SendMessage" in a)
    assert not any("sqs:ReceiveMessage" in a for a, _ in api)
    # results: consumes its queue; sends released dependents to task queues, never a control queue
    (consume, release) = sorted(sqs("results"), key=lambda s: "ResultsQueue" not in s[1])
    assert "ResultsQueue" in consume[1] and "sqs:ReceiveMessage" in consume[0] and "sqs:SendMessage" not in consume[0]
    assert release[0] == sorted([*SQS_ENDPOINT_QUEUE_ACTIONS, "sqs:SendMessage"])
    assert "skyfn-ci-tasks-*" in release[1] and "control" not in release[1] and "ResultsQueue" not in release[1]
    (reaper,) = sqs("reaper")  # drains dead letters; sends the dependents its sweep releases (issue 26)
    assert reaper[0] == sorted([*SQS_ENDPOINT_QUEUE_ACTIONS, "sqs:SendMessage", "sqs:ReceiveMessage",
                                "sqs:DeleteMessage"]) and "skyfn-ci-tasks-*" in reaper[1]
    assert sqs("history") == []


# What CDK's grant helpers add and no handler calls (issue 25, docs/deploy.md "Least
# privilege: allowed against used"): no function's role may hold any of these.
NEVER_CALLED = {
    "dynamodb:Scan", "dynamodb:BatchGetItem", "dynamodb:ConditionCheckItem", "dynamodb:DescribeTable",
    "dynamodb:GetRecords", "dynamodb:GetShardIterator", "secretsmanager:DescribeSecret",
    "s3:GetObject*", "s3:GetBucket*", "s3:List*", "s3:DeleteObject*", "s3:Abort*", "s3:PutObjectLegalHold",
    "s3:PutObjectRetention", "s3:PutObjectTagging", "s3:PutObjectVersionTagging",
    "states:StopExecution", "states:DescribeStateMachine", "states:TagResource",
}


def test_no_function_holds_what_its_code_never_calls(t):
    for stack in ("service", "workflows"):
        for lid, r in res(t[stack], "AWS::Lambda::Function").items():
            name = r["Properties"]["FunctionName"]
            held = {a for s in function_statements(t[stack], name) if s["Effect"] == "Allow" for a in actions(s)}
            assert not held & NEVER_CALLED, (name, sorted(held & NEVER_CALLED))
            reads = [s for s in function_statements(t[stack], name) if "secretsmanager:GetSecretValue" in actions(s)]
            assert all(actions(s) == ["secretsmanager:GetSecretValue"] for s in reads), name


def test_api_may_run_and_compile_workflows_but_not_stop_or_tag_them(t):
    by_sid = {s.get("Sid"): s for s in function_statements(t["service"], "skyfn-ci-api")}
    assert actions(by_sid["WatchWorkflows"]) == ["states:DescribeExecution", "states:GetExecutionHistory"]
    assert actions(by_sid["CompileFlows"]) == ["states:CreateStateMachine", "states:UpdateStateMachine"]
    # the payload bucket: objects under the service's three prefixes, nothing on the bucket itself
    assert actions(by_sid["PayloadWrites"]) == ["s3:PutObject"]
    assert actions(by_sid["PayloadReads"]) == ["s3:GetObject"]
    for sid, prefixes in (("PayloadWrites", ["/batches/*", "/args/*", "/results/*"]),
                          ("PayloadReads", ["/args/*", "/results/*"])):
        text = resources_text(by_sid[sid])
        assert all(p in text for p in prefixes) and len(by_sid[sid]["Resource"]) == len(prefixes), (sid, text)


def test_results_and_reaper_hold_what_releasing_dependents_needs(t):
    """lambdas/core/tasks/dataflow.py `release` (issue 26): envelopes put under args/,
    presigned GETs of args/ and results/, each pack's result-upload form for results/; the
    data key to read and to put objects, not to write items."""
    from infra.aws.stacks.data import KEY_READ_UPLOAD_ACTIONS

    for key in ("results", "reaper"):
        by_sid = {s.get("Sid"): s for s in function_statements(t["service"], f"skyfn-ci-{key}")}
        for sid, acts in (("PayloadWrites", ["s3:PutObject"]), ("PayloadReads", ["s3:GetObject"])):
            text = resources_text(by_sid[sid])
            assert actions(by_sid[sid]) == acts and len(by_sid[sid]["Resource"]) == 2, (key, sid)
            assert "/args/*" in text and "/results/*" in text and "/batches/" not in text, (key, sid)
        assert sorted(actions(by_sid["DataKey"])) == sorted(KEY_READ_UPLOAD_ACTIONS), key
        s3 = {a for s in by_sid.values() for a in actions(s) if a.startswith("s3:")}
        assert s3 == {"s3:PutObject", "s3:GetObject"}, key


def test_results_role_holds_what_lambdas_poller_calls(t):
    """The event-source mapping polls with the function's role: receive, delete, read
    attributes (not grantConsumeMessages' ChangeMessageVisibility and GetQueueUrl)."""
    (consume,) = [s for s in function_statements(t["service"], "skyfn-ci-results")
                  if any(a.startswith("sqs:") for a in actions(s)) and s.get("Sid") != "EndpointQueues"]
    assert consume["Sid"] == "ResultsQueueConsume"
    assert sorted(actions(consume)) == ["sqs:DeleteMessage", "sqs:GetQueueAttributes", "sqs:ReceiveMessage"]
    assert "ResultsQueue" in resources_text(consume)
    (mapping,) = props(t["service"], "AWS::Lambda::EventSourceMapping")
    assert "ResultsQueue" in json.dumps(mapping["EventSourceArn"])
    # no batching window: a window would hold every result pack up to that long (issue 37)
    assert not mapping.get("MaximumBatchingWindowInSeconds")


def test_no_handler_has_wildcard_actions_or_admin(t):
    for stack in ("service", "workflows", "agent-access"):
        for r in res(t[stack], "AWS::IAM::Policy").values():
            for s in r["Properties"]["PolicyDocument"]["Statement"]:
                for a in actions(s):
                    assert a != "*" and not (a.endswith(":*") and s["Effect"] == "Allow"), (stack, a)
        for r in res(t[stack], "AWS::IAM::Role").values():
            assert "AdministratorAccess" not in json.dumps(r["Properties"].get("ManagedPolicyArns", []))


def test_api_gateway_authorizer_throttling_access_logs(tpl, t):
    s = tpl["service"]
    s.resource_count_is("AWS::ApiGateway::RestApi", 1)
    s.resource_count_is("AWS::ApiGateway::Authorizer", 1)
    s.has_resource_properties("AWS::ApiGateway::Authorizer", {"Type": "COGNITO_USER_POOLS"})
    methods = props(t["service"], "AWS::ApiGateway::Method")
    auth = sorted((m["HttpMethod"], m["AuthorizationType"]) for m in methods)
    assert auth == [("ANY", "COGNITO_USER_POOLS"), ("ANY", "COGNITO_USER_POOLS")] + [("GET", "NONE")] * 3
    public = [m for m in methods if m["AuthorizationType"] == "NONE"]
    parts = {res(t["service"], "AWS::ApiGateway::Resource")[m["ResourceId"]["Ref"]]["Properties"]["PathPart"]
             for m in public}
    assert parts == {"openapi.json", "ui", "{proxy+}"}  # the OpenAPI document, the status page (test_ui_stack.py)
    (stage,) = props(t["service"], "AWS::ApiGateway::Stage")
    assert stage["StageName"] == "ci" and stage["TracingEnabled"] is True
    assert "requestId" in stage["AccessLogSetting"]["Format"]
    (ms,) = stage["MethodSettings"]
    assert ms["ThrottlingRateLimit"] == 1000 and ms["ThrottlingBurstLimit"] == 2000


def test_results_event_source_schedules_alarms_dashboard(tpl, t):
    s = tpl["service"]
    s.has_resource_properties("AWS::Lambda::EventSourceMapping", {
        "BatchSize": RESULTS_BATCH_SIZE, "FunctionResponseTypes": ["ReportBatchItemFailures"]})
    rules = props(t["service"], "AWS::Events::Rule")
    assert sorted(r["ScheduleExpression"] for r in rules) == ["rate(1 minute)", "rate(1 minute)"]
    assert all("DeadLetterConfig" in target for r in rules for target in r["Targets"])
    alarms = props(t["service"], "AWS::CloudWatch::Alarm")
    names = {a["MetricName"] for a in alarms}
    assert {"Errors", "Throttles", "ApproximateNumberOfMessagesVisible", "ApproximateAgeOfOldestMessage",
            "5XXError"} <= names
    assert len(alarms) == 2 * (len(FUNCTIONS) + 1) + 5  # + the status page's function (test_ui_stack.py)
    assert all(a["AlarmActions"] for a in alarms)
    s.resource_count_is("AWS::CloudWatch::Dashboard", 1)


# --- agent access ------------------------------------------------------------------------------
def test_agent_role_is_assumed_by_the_api_only_and_consumes_only_its_prefix(t):
    (role,) = res(t["agent-access"], "AWS::IAM::Role").values()
    p = role["Properties"]
    assert p["RoleName"] == "skyfn-ci-agent" and p["MaxSessionDuration"] == 3600
    (trust,) = p["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Action"] == "sts:AssumeRole"
    assert "ApiFunctionServiceRole" in json.dumps(trust["Principal"])
    statements = role_statements(t["agent-access"], next(iter(res(t["agent-access"], "AWS::IAM::Role"))))
    allow = [s for s in statements if s["Effect"] == "Allow"]
    consume, send = sorted(allow, key=lambda s: len(actions(s)), reverse=True)
    assert sorted(actions(consume)) == sorted(CONSUME_ACTIONS)
    text = resources_text(consume)
    assert "skyfn-ci-tasks-*" in text and "skyfn-ci-control-*" in text and text.count("sqs") == 2
    assert actions(send) == list(RESULT_ACTIONS) and "ResultsQueue" in resources_text(send)
    (deny,) = [s for s in statements if s["Effect"] == "Deny"]
    assert "skyfn-ci-*-dlq" in resources_text(deny)
    # the API may assume it, by the same fixed name
    assume = [s for s in function_statements(t["service"], "skyfn-ci-api") if "sts:AssumeRole" in actions(s)]
    assert len(assume) == 1 and "role/skyfn-ci-agent" in resources_text(assume[0])


# --- rendezvous -------------------------------------------------------------------------------
def test_rendezvous_fargate_behind_public_nlb_with_client_ip(tpl, t):
    r = tpl["rendezvous"]
    r.resource_count_is("AWS::ECS::Service", 1)
    r.has_resource_properties("AWS::ECS::Service", {
        "DesiredCount": 1, "LaunchType": "FARGATE",
        "DeploymentConfiguration": Match.object_like({"MaximumPercent": 100, "MinimumHealthyPercent": 0}),
        "NetworkConfiguration": {"AwsvpcConfiguration": Match.object_like({"AssignPublicIp": "DISABLED"})}})
    r.has_resource_properties("AWS::ElasticLoadBalancingV2::LoadBalancer", {"Scheme": "internet-facing",
                                                                           "Type": "network"})
    r.has_resource_properties("AWS::ElasticLoadBalancingV2::Listener", {"Port": 7300, "Protocol": "TCP"})
    r.has_resource_properties("AWS::ElasticLoadBalancingV2::TargetGroup", {
        "TargetType": "ip", "Protocol": "TCP", "Port": 7300,
        "TargetGroupAttributes": Match.array_with([{"Key": "preserve_client_ip.enabled", "Value": "true"}])})
    (task,) = props(t["rendezvous"], "AWS::ECS::TaskDefinition")
    (container,) = task["ContainerDefinitions"]
    assert [s["Name"] for s in container["Secrets"]] == ["SKYFN_RENDEZVOUS_SECRET"]
    assert "SKYFN_RENDEZVOUS_SECRET" not in json.dumps(container.get("Environment", []))
    assert container["Command"][:2] == ["--port", "7300"] and container["ReadonlyRootFilesystem"] is True
    assert "ContainerAssetsRepository" in json.dumps(container["Image"]) or "dkr.ecr" in json.dumps(container["Image"])


def test_nothing_public_but_the_rendezvous_port(t):
    """Every ingress rule open to the internet, in every stack: only the NLB's port 7300."""
    open_rules = []
    for stack, template in t.items():
        for lid, r in template["Resources"].items():
            rules = []
            if r["Type"] == "AWS::EC2::SecurityGroup":
                rules = r["Properties"].get("SecurityGroupIngress", [])
            elif r["Type"] == "AWS::EC2::SecurityGroupIngress":
                rules = [r["Properties"]]
            for rule in rules:
                if rule.get("CidrIp") == "0.0.0.0/0" or rule.get("CidrIpv6") == "::/0":
                    open_rules.append((stack, lid, rule["IpProtocol"], rule.get("FromPort"), rule.get("ToPort")))
    assert len(open_rules) == 1
    stack, lid, proto, low, high = open_rules[0]
    assert (stack, proto, low, high) == ("rendezvous", "tcp", 7300, 7300) and lid.startswith("NlbSg")
    task_ingress = [r["Properties"] for r in res(t["rendezvous"], "AWS::EC2::SecurityGroupIngress").values()]
    assert all("NlbSg" in json.dumps(r.get("SourceSecurityGroupId")) for r in task_ingress)
    for template in t.values():  # no function URLs, no public ECS tasks, no public buckets
        assert not res(template, "AWS::Lambda::Url")


def test_encryption_everywhere(t):
    for stack, template in t.items():
        for q in props(template, "AWS::SQS::Queue"):
            assert q.get("SqsManagedSseEnabled") or q.get("KmsMasterKeyId"), (stack, q.get("QueueName"))
        for topic in props(template, "AWS::SNS::Topic"):
            assert topic.get("KmsMasterKeyId"), stack
        for table in props(template, "AWS::DynamoDB::Table"):
            assert table["SSESpecification"]["SSEEnabled"], stack
        for bucket in props(template, "AWS::S3::Bucket"):
            assert bucket["BucketEncryption"], stack
        for key in props(template, "AWS::KMS::Key"):
            assert key["EnableKeyRotation"] is True
        for policy in props(template, "AWS::SQS::QueuePolicy"):  # enforce_ssl on every queue
            assert "aws:SecureTransport" in json.dumps(policy)


# --- workflows -------------------------------------------------------------------------------------
def test_state_machines_invoke_only_their_own_steps(tpl, t):
    w = t["workflows"]
    machines = {p["StateMachineName"]: p for p in props(w, "AWS::StepFunctions::StateMachine")}
    assert set(machines) == {catalog.machine_name("skyfn-ci", m) for m in catalog.MACHINES.values()}
    step_ids = {key: function(w, catalog.function_name("skyfn-ci", step))[0] for key, step in catalog.STEPS.items()}
    for m in catalog.MACHINES.values():
        p = machines[catalog.machine_name("skyfn-ci", m)]
        assert p["TracingConfiguration"] == {"Enabled": True}
        assert p["LoggingConfiguration"]["Level"] == "ALL"
        assert p["LoggingConfiguration"]["IncludeExecutionData"] is False
        assert set(p["DefinitionSubstitutions"]) == {catalog.STEPS[k].placeholder for k in m.steps} | set(
            m.extra_placeholders)
        role_id = p["RoleArn"]["Fn::GetAtt"][0]
        invoked = set()
        for s in role_statements(w, role_id):
            if "lambda:InvokeFunction" in actions(s):
                invoked |= {k for k, lid in step_ids.items() if lid in resources_text(s)}
                assert "*\"" not in resources_text(s).replace(":*\"", "")
        assert invoked == set(m.steps), m.name
    (flow_role,) = [lid for lid, r in res(w, "AWS::IAM::Role").items()
                    if r["Properties"].get("RoleName") == "skyfn-ci-flow"]
    invoked = {k for s in role_statements(w, flow_role) if "lambda:InvokeFunction" in actions(s)
               for k, lid in step_ids.items() if lid in resources_text(s)}
    assert invoked == set(catalog.FLOW_STEPS)


def test_step_functions_get_their_needs(t):
    from infra.aws.stacks.workflows import HISTORY_READING_STEPS, STEP_OBJECTS, SUBMITTING_STEPS

    w = t["workflows"]
    for key, step in catalog.STEPS.items():
        statements = function_statements(w, catalog.function_name("skyfn-ci", step))
        by_sid = {s.get("Sid"): s for s in statements}
        tables = dynamo_access(statements)
        assert bool(tables) == ("dynamodb" in step.needs), key
        assert all(not (a & DYNAMO_WRITES) for a in tables.values()), key
        if tables:  # registry reads by key; task history only where task status is read
            assert tables["functions"] == tables["endpoints"] == {"dynamodb:GetItem"}, key
            assert tables.get("history") == ({"dynamodb:Query"} if key in HISTORY_READING_STEPS else None), key
        # payload objects: the "s3" steps, on their own prefixes only
        assert ("PayloadObjects" in by_sid) == ("s3" in step.needs), key
        if "s3" in step.needs:
            acts, prefixes = STEP_OBJECTS[key]
            assert actions(by_sid["PayloadObjects"]) == acts, key
            assert all(f"/{p}*" in resources_text(by_sid["PayloadObjects"]) for p in prefixes), key
        # the steps that submit sign the packs' result-upload forms: PutObject under results/ only
        assert ("ResultUploadForms" in by_sid) == (key in SUBMITTING_STEPS), key
        if key in SUBMITTING_STEPS:
            forms = by_sid["ResultUploadForms"]
            assert actions(forms) == ["s3:PutObject"] and "/results/*" in resources_text(forms), key
        s3 = {a for s in statements for a in actions(s) if a.startswith("s3:")}
        assert s3 <= {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket"}, (key, s3)
        assert ("s3:ListBucket" in s3) == (key == "BatchProgress"), key  # list_objects_v2 before deleting
        # sending packs: the submitting steps only (SpmdInit declares the queue to read its depth)
        sends = [s for s in statements if "sqs:SendMessage" in actions(s)]
        assert bool(sends) == ("sqs" in step.needs and key in SUBMITTING_STEPS), key
        assert all("skyfn-ci-tasks-*" in resources_text(s) for s in sends), key
        declares = [s for s in statements if "sqs:CreateQueue" in actions(s)]
        assert bool(declares) == ("sqs" in step.needs), key
        _, p = function(w, catalog.function_name("skyfn-ci", step))
        secret_env = json.dumps(p["Environment"]["Variables"]["SKYFN_SECRET_ENV"])
        assert ("SKYFN_RENDEZVOUS_SECRET" in secret_env) == ("rendezvous_secret" in step.needs), key
        for name in step.env:
            assert name in p["Environment"]["Variables"] or name in secret_env, (key, name)


# --- Globus variant -----------------------------------------------------------------------------------
def test_globus_auth_uses_the_token_authorizer(synth_globus):
    t = synth_globus["raw"]["service"]
    assert not res(t, "AWS::Cognito::UserPool")
    (authz,) = props(t, "AWS::ApiGateway::Authorizer")
    assert authz["Type"] == "TOKEN" and authz["IdentitySource"] == "method.request.header.Authorization"
    _, fn = function(t, "skyfn-devglobus-authorizer")
    assert fn["Handler"] == "lambdas.authorizer.handler"
    env = fn["Environment"]["Variables"]
    assert env["SKYFN_AUTH_ISSUER"] == "https://auth.globus.org" and env["SKYFN_AUTH_AUDIENCE"] == "0a1b2c3d-client"
    tables = {p["TableName"]: p for p in props(synth_globus["raw"]["data"], "AWS::DynamoDB::Table")}
    assert all(p["DeletionProtectionEnabled"] is False for p in tables.values())  # a dev stage


def test_action_provider_is_deployed_behind_the_api_authorizer(t, synth_globus):
    """Globus Flows action provider (issue 14): the API function serves /flows-ap through the
    authorized {proxy+} resource; its scope is the Globus app's action_all scope; the stack
    outputs the URL a flow's Action state names."""
    svc = t["service"]
    proxy = [r for r in res(svc, "AWS::ApiGateway::Resource").values() if r["Properties"]["PathPart"] == "{proxy+}"
             and "RootResourceId" in json.dumps(r["Properties"]["ParentId"])]  # not /ui/{proxy+}
    assert len(proxy) == 1
    methods = [m["Properties"] for m in res(svc, "AWS::ApiGateway::Method").values()]
    assert any(m["HttpMethod"] == "ANY" and m["AuthorizationType"] == "COGNITO_USER_POOLS" for m in methods)
    outputs = svc["Outputs"]
    (url,) = [v for k, v in outputs.items() if k.startswith("ActionProviderUrl")]
    assert "/flows-ap" in json.dumps(url["Value"])
    _, p = function(svc, "skyfn-ci-api")
    env = p["Environment"]["Variables"]
    assert env["SKYFN_AP_SCOPE"] == "skyfn-ci:flows-ap:all" and env["SKYFN_AP_ADMIN_CONTACT"]
    _, g = function(synth_globus["raw"]["service"], "skyfn-devglobus-api")
    assert g["Environment"]["Variables"]["SKYFN_AP_SCOPE"] == \
        "https://auth.globus.org/scopes/0a1b2c3d-client/action_all"


# --- cfn-lint -------------------------------------------------------------------------------------------
def test_cfn_lint_reports_no_errors(synth):
    templates = sorted(str(p) for p in synth["outdir"].glob("*.template.json"))
    assert len(templates) == 6
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    proc = subprocess.run([str(cfn_lint), "--format", "json", "--", *templates],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 4, 8, 12), proc.stderr[-2000:]  # 2 = errors; 4/8 warnings/informational
    findings = json.loads(proc.stdout)
    errors = [f for f in findings if f["Level"] == "Error"]
    assert not errors, json.dumps(errors, indent=1)[:4000]


def test_api_issues_rendezvous_tokens_with_the_deployed_address(t):
    """POST /rendezvous/tokens in AWS: the API signs with the rendezvous secret (loaded at
    cold start, never in its configuration) and hands out the NLB's address."""
    _, p = function(t["service"], "skyfn-ci-api")
    env = p["Environment"]["Variables"]
    assert "SKYFN_RENDEZVOUS_SECRET" in json.dumps(env["SKYFN_SECRET_ENV"])
    assert "SKYFN_RENDEZVOUS_SECRET" not in env
    address = json.dumps(env["SKYFN_RENDEZVOUS_ADDRESS"])
    assert "Fn::ImportValue" in address and "Skyfn-ci-rendezvous" in address
    reads = [s for s in function_statements(t["service"], "skyfn-ci-api") if "secretsmanager:GetSecretValue" in actions(s)]
    assert any("RendezvousSecret" in resources_text(s) for s in reads), reads
    for key in ("results", "reaper", "history"):  # no one else holds the signing secret
        _, other = function(t["service"], f"skyfn-ci-{key}")
        assert "SKYFN_RENDEZVOUS_SECRET" not in json.dumps(other["Environment"]["Variables"]), key


# --- backpressure (issue 24: lambdas/core/tasks/backlog.py) -----------------------------------------
def test_history_backlog_alarm_dashboard_and_bounds_in_the_environment(t):
    """The HistoryBacklog alarm watches the outbox length the history drain publishes (EMF:
    namespace skyfn, service history) at half the bound past which submissions get 429
    backlog; every function that submits (the API, the workflow steps) reads the same bounds."""
    from infra.aws.config import DeployConfig

    config = DeployConfig()
    [(lid, backlog)] = [(k, v["Properties"]) for k, v in res(t["service"], "AWS::CloudWatch::Alarm").items()
                        if v["Properties"].get("MetricName") == "OutboxLength"]
    assert lid.startswith("HistoryBacklog")
    assert backlog["Namespace"] == "skyfn" and backlog["Dimensions"] == [{"Name": "service", "Value": "history"}]
    assert backlog["Statistic"] == "Maximum" and backlog["Period"] == 300 and backlog["EvaluationPeriods"] == 1
    assert backlog["Threshold"] == config.backlog_max // 2 == 500_000
    assert backlog["ComparisonOperator"] == "GreaterThanOrEqualToThreshold" and backlog["AlarmActions"]
    assert "SKYFN_BACKLOG_MAX" in backlog["AlarmDescription"]
    for name in ("skyfn-ci-api", "skyfn-ci-history"):
        _, p = function(t["service"], name)
        env = p["Environment"]["Variables"]
        assert env["SKYFN_BACKLOG_MAX"] == "1000000" and env["SKYFN_BACKLOG_MEMORY_FRACTION"] == "0.8", name
    steps = [p for p in props(t["workflows"], "AWS::Lambda::Function") if "Environment" in p]
    assert steps and all(p["Environment"]["Variables"]["SKYFN_BACKLOG_MAX"] == "1000000" for p in steps)
    (board,) = props(t["service"], "AWS::CloudWatch::Dashboard")
    body = json.dumps(board["DashboardBody"])
    for metric in ("OutboxLength", "RedisUsedBytes", "RedisBytesPerTask"):
        assert f'\\"skyfn\\",\\"{metric}\\",\\"service\\",\\"history\\"' in body, metric
