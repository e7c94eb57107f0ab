"""infra.local.templates: reading a synthesized cloud assembly and resolving it for the
local runtime. The real app is synthesized once per session (in .venv/cdk, the CDK's own
virtualenv); small hand-written templates pin down the intrinsic functions."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from infra.local.templates import AssemblyError, CloudAssembly, Deployment, LocalSettings, Physical, Resolver
from infra.local.templates import UnresolvedReference
from infra.local.templates.naming import generated_name, queue_url
from infra.local.templates.model import schedule_seconds

REPO = Path(__file__).resolve().parents[2]
CDK_PYTHON = REPO / ".venv" / "cdk" / "bin" / "python"
SYNTH = """
from infra.aws.app import build
app, _ = build({'aws:cdk:bundling-stacks': [], 'stage': 'dev', 'region': 'us-east-1', 'account': '123456789012'},
               outdir=%r, environ={})
app.synth()
"""
_synthesized: dict[str, Path] = {}


def synthesized_assembly(tmp_path_factory) -> Path:
    """The app's cloud assembly (stage dev, moto's account and region), synthesized once
    per test session; the provisioning tests share it."""
    if "path" not in _synthesized:
        if not CDK_PYTHON.exists():
            pytest.skip("the CDK virtualenv .venv/cdk does not exist (`make cdk-venv`): cannot synthesize")
        outdir = tmp_path_factory.mktemp("cdk.out")
        env = dict(os.environ, CDK_DISABLE_CLI_TELEMETRY="true", JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20")
        done = subprocess.run([str(CDK_PYTHON), "-c", SYNTH % str(outdir)], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, f"synth failed:\n{done.stderr[-4000:]}"
        _synthesized["path"] = outdir
    return _synthesized["path"]


LOCAL = LocalSettings(aws_endpoint_url="http://127.0.0.1:4566", redis_host="127.0.0.9", redis_port=6390,
                      gateway_url="http://127.0.0.1:8700/", websocket_url="ws://127.0.0.1:8700/ws",
                      websocket_management_url="http://127.0.0.1:8700/ws-management", rendezvous_host="127.0.0.7")


@pytest.fixture(scope="module")
def assembly(tmp_path_factory) -> CloudAssembly:
    return CloudAssembly.load(synthesized_assembly(tmp_path_factory))


@pytest.fixture(scope="module")
def dep(assembly) -> Deployment:
    return Deployment.from_assembly(assembly, LOCAL)


# -- the assembly ----------------------------------------------------------------------

def test_missing_assembly_names_the_path_and_the_fix(tmp_path, monkeypatch):
    with pytest.raises(AssemblyError) as missing:
        CloudAssembly.load(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(missing.value)
    assert "make synth" in str(missing.value) and "SKYFN_CDK_OUT" in str(missing.value)

    monkeypatch.setenv("SKYFN_CDK_OUT", str(tmp_path))
    with pytest.raises(AssemblyError, match="no manifest.json"):
        CloudAssembly.load()

    (tmp_path / "manifest.json").write_text(json.dumps({"version": "55.0.0", "artifacts": {
        "Tree": {"type": "cdk:tree", "properties": {"file": "tree.json"}}}}))
    with pytest.raises(AssemblyError, match="names no CloudFormation stack") as empty:
        CloudAssembly.load()
    assert "make synth" in str(empty.value)


def test_assembly_stacks_resources_and_exports(assembly):
    assert set(assembly.stacks) == {f"Skyfn-dev-{s}" for s in
                                    ("network", "data", "service", "agent-access", "rendezvous", "workflows")}
    assert assembly.stage_prefix() == "skyfn-dev"
    assert assembly.environment() == ("123456789012", "us-east-1")
    tables = {r.properties["TableName"] for r in assembly.resources("AWS::DynamoDB::Table")}
    assert tables == {"skyfn-dev-functions", "skyfn-dev-endpoints", "skyfn-dev-submissions", "skyfn-dev-history",
                      "skyfn-dev-connections"}
    api = next(r for r in assembly.resources("AWS::Lambda::Function")
               if r.properties.get("FunctionName") == "skyfn-dev-api")
    assert assembly.resource(api.stack, api.logical_id).properties["Handler"] == "lambdas.api.handler"
    assert assembly.resource(api.stack, "NoSuchThing") is None
    exports = assembly.exports()
    bucket_export = next(name for name in exports if name.startswith("Skyfn-dev-data:ExportsOutputRefPayloads"))
    stack, value = exports[bucket_export]
    assert stack == "Skyfn-dev-data" and list(value) == ["Ref"]


# -- the resolved deployment -------------------------------------------------------------

def test_api_function_as_the_templates_describe_it(dep):
    api = dep.functions["skyfn-dev-api"]
    assert (api.handler, api.module, api.attr) == ("lambdas.api.handler", "lambdas.api", "handler")
    assert api.runtime == "python3.11" and api.memory == 1024 and api.timeout > 0
    env = api.environment
    (bucket,) = dep.buckets.values()
    assert env["SKYFN_BUCKET"] == bucket.name
    # (the results queue's ARN: see the agent role's policy and the event-source mapping below)
    assert env["SKYFN_REDIS_URL"] == "redis://127.0.0.9:6390/0"          # rediss:// of the template, no TLS here
    assert env["SKYFN_CONNECTION_TABLE"] == "skyfn-dev-connections" and "skyfn-dev-connections" in dep.tables
    assert env["SKYFN_BATCH_FANOUT_ARN"] == dep.state_machines["skyfn-dev-batch-fanout"].arn
    assert env["SKYFN_RUN_TASK_FUNCTION_ARN"] == dep.functions["skyfn-dev-wf-RunTask"].arn
    assert env["SKYFN_FLOW_ROLE_ARN"] == dep.roles["skyfn-dev-flow"].arn
    assert env["SKYFN_RENDEZVOUS_ADDRESS"] == "127.0.0.7:7300"
    secret_env = json.loads(env["SKYFN_SECRET_ENV"])
    assert {secret.arn for secret in dep.secrets.values()} == set(secret_env.values())
    role = dep.role_by_arn(api.role_arn)
    assert role is not None and api.role_logical_id == role.logical_id and role.stack == api.stack


def test_every_function_environment_resolves_to_strings(dep):
    python = [f for f in dep.functions.values() if f.runtime.startswith("python")]
    assert {f.name for f in python} >= {"skyfn-dev-api", "skyfn-dev-results", "skyfn-dev-reaper", "skyfn-dev-history",
                                        "skyfn-dev-ws", "skyfn-dev-ws-authorizer", "skyfn-dev-ui",
                                        "skyfn-dev-wf-RunTask", "skyfn-dev-wf-SpmdInit"}
    for f in python:
        assert f.handler.startswith("lambdas."), f.name
        assert f.role_arn == dep.roles[f.role_arn.rsplit("/", 1)[1]].arn
        for key, value in f.environment.items():
            assert isinstance(value, str) and "Fn::" not in value and '"Ref"' not in value, (f.name, key)
            assert ".execute-api." not in value and "rediss://" not in value, (f.name, key, value)
    assert dep.functions["skyfn-dev-results"].reserved_concurrency == 50
    # the workflow steps reach the service stack's resources through exports
    step = dep.functions["skyfn-dev-wf-RouteChunk"].environment
    assert step["SKYFN_CONNECTION_TABLE"] == "skyfn-dev-connections"
    assert step["SKYFN_WS_ENDPOINT"] == "http://127.0.0.1:8700/ws-management"
    assert dep.functions["skyfn-dev-ui"].environment["SKYFN_WS_URL"] == "ws://127.0.0.1:8700/ws"


def test_tables_queues_buckets_and_secrets(dep):
    history = dep.tables["skyfn-dev-history"]
    assert history.key_schema == [{"AttributeName": "k", "KeyType": "HASH"}, {"AttributeName": "s", "KeyType": "RANGE"}]
    assert history.ttl_attribute == "expires_at" and history.billing_mode == "PAY_PER_REQUEST"
    assert history.arn == "arn:aws:dynamodb:us-east-1:123456789012:table/skyfn-dev-history"
    assert [i["IndexName"] for i in dep.tables["skyfn-dev-endpoints"].global_secondary_indexes] == ["owner-index"]
    assert dep.tables["skyfn-dev-functions"].ttl_attribute is None

    results, dlq = dep.queues["skyfn-dev-results"], dep.queues["skyfn-dev-results-dlq"]
    assert results.url == "http://127.0.0.1:4566/123456789012/skyfn-dev-results"
    assert results.arn == "arn:aws:sqs:us-east-1:123456789012:skyfn-dev-results"
    assert (results.redrive_target_arn, results.max_receive_count, results.visibility_timeout) == (dlq.arn, 5, 60)
    assert dlq.message_retention_period == 1209600 and dlq.redrive_target_arn is None
    assert json.loads(results.attributes()["RedrivePolicy"]) == {"deadLetterTargetArn": dlq.arn, "maxReceiveCount": 5}

    (bucket,) = dep.buckets.values()
    assert bucket.name == "skyfn-dev-data-payloadscdfaa0a2" and bucket.arn == f"arn:aws:s3:::{bucket.name}"

    token = next(s for s in dep.secrets.values() if s.logical_id.startswith("RedisAuthToken"))
    assert token.generated and token.generate == {"ExcludePunctuation": True, "PasswordLength": 64}
    assert token.arn == f"arn:aws:secretsmanager:us-east-1:123456789012:secret:{token.name}-{token.arn_suffix}"
    assert len(token.arn_suffix) == 6 and token.arn_suffix.isalpha()


def test_state_machines_invoke_the_model_functions(dep):
    fanout = dep.state_machines["skyfn-dev-batch-fanout"]
    assert fanout.arn == "arn:aws:states:us-east-1:123456789012:stateMachine:skyfn-dev-batch-fanout"
    assert fanout.type == "STANDARD" and fanout.role_arn == dep.role_by_arn(fanout.role_arn).arn
    definition = json.loads(fanout.definition)
    assert "${" not in fanout.definition
    invoked = {m for m in (dep.functions[n].arn for n in ("skyfn-dev-wf-RouteChunk", "skyfn-dev-wf-BatchProgress"))
               if m in fanout.definition}
    assert len(invoked) == 2 and definition["StartAt"]
    spmd = dep.state_machines["skyfn-dev-spmd-group"].definition
    assert dep.functions["skyfn-dev-wf-SpmdInit"].arn in spmd and dep.functions["skyfn-dev-wf-RunTask"].arn in spmd


def test_rules_and_event_source_mappings(dep):
    history = next(r for r in dep.rules.values() if r.logical_id.startswith("HistorySchedule"))
    assert history.schedule_expression == "rate(1 minute)" and history.schedule_seconds == 60 and history.enabled
    assert [json.loads(t.input) for t in history.targets] == [{"drainer": i} for i in range(len(history.targets))]
    assert {t.function_name for t in history.targets} == {"skyfn-dev-history"}
    reaper = next(r for r in dep.rules.values() if r.logical_id.startswith("ReaperSchedule"))
    assert [(t.function_name, t.input) for t in reaper.targets] == [("skyfn-dev-reaper", None)]

    (mapping,) = dep.event_source_mappings
    assert (mapping.function_name, mapping.queue, mapping.event_source_arn) == (
        "skyfn-dev-results", "skyfn-dev-results", dep.queues["skyfn-dev-results"].arn)
    assert (mapping.batch_size, mapping.max_batching_window, mapping.report_batch_item_failures,
            mapping.max_concurrency, mapping.enabled) == (10, 0, True, 50, True)  # no batching window: results leave by group commit (issue 37)
    assert mapping.function == dep.functions["skyfn-dev-results"].logical_id


def test_roles_carry_resolved_policy_documents(dep):
    agent = dep.roles["skyfn-dev-agent"]
    api_role = dep.roles[dep.functions["skyfn-dev-api"].role_arn.rsplit("/", 1)[1]]
    assert agent.assume_role_policy["Statement"][0]["Principal"] == {"AWS": api_role.arn}
    statements = {s.get("Sid"): s for doc in agent.inline_policies.values() for s in doc["Statement"]}
    assert statements["ReturnResults"]["Resource"] == dep.queues["skyfn-dev-results"].arn
    assert agent.max_session_duration == 3600
    assert "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole" in api_role.managed_policy_arns
    text = json.dumps([r.inline_policies for r in dep.roles.values()])
    assert "Fn::" not in text and '"Ref"' not in text
    # the API may read the payload bucket: the policy names the model's bucket ARN
    (bucket,) = dep.buckets.values()
    assert bucket.arn in json.dumps(api_role.inline_policies)


def test_not_local_lists_the_other_types(dep, assembly):
    counts = assembly.types()
    assert dep.not_local["AWS::ApiGateway::RestApi"] == 1
    assert dep.not_local["AWS::ElastiCache::ReplicationGroup"] == 1
    assert dep.not_local["AWS::Lambda::Permission"] == counts["AWS::Lambda::Permission"]
    assert not set(dep.not_local) & {"AWS::Lambda::Function", "AWS::SQS::Queue", "AWS::IAM::Role"}


def test_outputs_are_localized(dep):
    assert dep.output("Skyfn-dev-service", "WebSocketUrl") == "ws://127.0.0.1:8700/ws"
    assert dep.output("Skyfn-dev-service", "StatusPageUrl") == "http://127.0.0.1:8700/ui/"
    plain = Deployment.from_assembly(dep.assembly, LocalSettings())
    assert plain.output("Skyfn-dev-service", "WebSocketUrl").startswith("wss://")
    assert plain.functions["skyfn-dev-api"].environment["SKYFN_REDIS_URL"] == "redis://127.0.0.1:6379/0"
    assert plain.queues["skyfn-dev-results"].url == "https://sqs.us-east-1.amazonaws.com/123456789012/skyfn-dev-results"
    tls = Deployment.from_assembly(dep.assembly, LocalSettings(redis_tls=True))
    assert tls.functions["skyfn-dev-api"].environment["SKYFN_REDIS_URL"] == "rediss://127.0.0.1:6379/0"


# -- intrinsic functions on small templates ------------------------------------------------

def write_assembly(root: Path, templates: dict[str, dict]) -> CloudAssembly:
    artifacts = {}
    for name, template in templates.items():
        (root / f"{name}.template.json").write_text(json.dumps(template))
        artifacts[name] = {"type": "aws:cloudformation:stack", "environment": "aws://123456789012/us-east-1",
                           "properties": {"templateFile": f"{name}.template.json"}}
    (root / "manifest.json").write_text(json.dumps({"version": "55.0.0", "artifacts": artifacts}))
    return CloudAssembly.load(root)


@pytest.fixture
def small(tmp_path):
    producer = {
        "Parameters": {"Size": {"Type": "String", "Default": "7"},
                       "Boot": {"Type": "AWS::SSM::Parameter::Value<String>", "Default": "/cdk-bootstrap/version"}},
        "Resources": {"Table": {"Type": "AWS::DynamoDB::Table"}, "Queue": {"Type": "AWS::SQS::Queue"}},
        "Outputs": {"TableArn": {"Value": {"Fn::GetAtt": ["Table", "Arn"]}, "Export": {"Name": "producer:TableArn"}},
                    "QueueUrl": {"Value": {"Ref": "Queue"}, "Export": {"Name": {"Fn::Sub": "${AWS::StackName}:Url"}}}},
    }
    consumer = {"Resources": {"Fn": {"Type": "AWS::Lambda::Function"}}}
    assembly = write_assembly(tmp_path, {"producer": producer, "consumer": consumer})
    physical = {
        ("producer", "Table"): Physical("tbl", {"Arn": "arn:aws:dynamodb:us-east-1:123456789012:table/tbl"}),
        ("producer", "Queue"): Physical("http://q/123456789012/q", {"Arn": "arn:q", "QueueName": "q"}),
        ("consumer", "Fn"): Physical("fn", {"Arn": "arn:fn"}),
    }
    return Resolver(assembly, physical, parameters={"consumer.Stage": "dev"})


def test_ref_getatt_join_and_pseudo_parameters(small):
    r = small.resolve
    assert r("producer", {"Ref": "Table"}) == "tbl"
    assert r("producer", {"Fn::GetAtt": ["Queue", "QueueName"]}) == "q"
    assert r("producer", {"Fn::GetAtt": "Table.Arn"}) == "arn:aws:dynamodb:us-east-1:123456789012:table/tbl"
    assert r("producer", {"Fn::Join": ["-", [{"Ref": "AWS::Region"}, {"Ref": "AWS::AccountId"},
                                              {"Ref": "AWS::Partition"}, {"Ref": "AWS::URLSuffix"},
                                              {"Ref": "AWS::StackName"}, {"Ref": "Size"}]]}) == \
        "us-east-1-123456789012-aws-amazonaws.com-producer-7"
    assert r("producer", {"a": {"Ref": "AWS::NoValue"}, "b": [1, {"Ref": "AWS::NoValue"}, 2]}) == {"b": [1, 2]}


def test_sub_select_split(small):
    r = small.resolve
    assert r("producer", {"Fn::Sub": "arn:${AWS::Partition}:x:${AWS::Region}:${Table}/${Table.Arn}/${!Literal}"}) == \
        "arn:aws:x:us-east-1:tbl/arn:aws:dynamodb:us-east-1:123456789012:table/tbl/${Literal}"
    assert r("producer", {"Fn::Sub": ["${Name}-${Queue.QueueName}", {"Name": {"Ref": "Table"}}]}) == "tbl-q"
    assert r("producer", {"Fn::Split": [",", "a,b,c"]}) == ["a", "b", "c"]
    assert r("producer", {"Fn::Select": ["1", {"Fn::Split": ["/", {"Ref": "Queue"}]}]}) == ""
    assert r("producer", {"Fn::Select": [3, {"Fn::Split": ["/", {"Ref": "Queue"}]}]}) == "123456789012"


def test_import_value_resolves_in_the_exporting_stack(small):
    assert small.resolve("consumer", {"Fn::ImportValue": "producer:TableArn"}) == \
        "arn:aws:dynamodb:us-east-1:123456789012:table/tbl"
    # an export name that is itself an expression (resolved in the exporting stack)
    assert small.resolve("consumer", {"Fn::ImportValue": {"Fn::Sub": "producer:Url"}}) == "http://q/123456789012/q"
    assert small.resolve("consumer", {"Ref": "AWS::StackName"}) == "consumer"


def test_unknown_references_name_stack_logical_id_and_path(small):
    with pytest.raises(UnresolvedReference) as unknown:
        small.resolve("consumer", {"Variables": {"X": {"Fn::GetAtt": ["Missing", "Arn"]}}}, "Fn.Properties.Environment")
    e = unknown.value
    assert (e.stack, e.logical_id) == ("consumer", "Missing")
    assert "Fn.Properties.Environment.Variables.X" in e.path
    assert "consumer" in str(e) and "Missing" in str(e) and "Environment.Variables.X" in str(e)

    with pytest.raises(UnresolvedReference, match="attribute StreamArn"):
        small.resolve("producer", {"Fn::GetAtt": ["Table", "StreamArn"]})
    with pytest.raises(UnresolvedReference, match="no stack of the assembly exports") as export:
        small.resolve("consumer", {"Fn::ImportValue": "nobody:Exports"})
    assert export.value.logical_id == "nobody:Exports"
    with pytest.raises(UnresolvedReference, match="without a local value"):
        small.resolve("producer", {"Ref": "Boot"})
    with pytest.raises(UnresolvedReference, match="not supported"):
        small.resolve("producer", {"Fn::If": ["Cond", 1, 2]})


def test_referenced_follows_refs_and_exports(small):
    assert small.referenced("consumer", {"Fn::ImportValue": "producer:TableArn"}) == ("producer", "Table")
    assert small.referenced("producer", {"Ref": "Queue"}) == ("producer", "Queue")
    assert small.referenced("producer", {"Fn::Join": ["", ["a"]]}) is None


# -- naming ------------------------------------------------------------------------------

def test_generated_names_are_stable_and_within_limits():
    assert generated_name("Skyfn-dev-data", "Payloads1234", 63, lower=True, allowed=r"a-z0-9.\-") == \
        "skyfn-dev-data-payloads1234"
    long = generated_name("Skyfn-dev-service", "ResultsPushWsAuthorizerFunctionServiceRoleED261565", 64)
    assert len(long) == 64 and long.startswith("Skyfn-dev-service-ResultsPush")
    assert long == generated_name("Skyfn-dev-service", "ResultsPushWsAuthorizerFunctionServiceRoleED261565", 64)
    assert generated_name("S", "Q", 80, suffix=".fifo") == "S-Q.fifo"


def test_queue_url_and_schedules():
    local = LocalSettings(aws_endpoint_url="http://127.0.0.1:5000/").with_environment(None, None)
    assert queue_url(local, "q") == "http://127.0.0.1:5000/123456789012/q"
    assert schedule_seconds("rate(5 minutes)") == 300 and schedule_seconds("rate(1 hour)") == 3600
    assert schedule_seconds("rate(2 days)") == 172800 and schedule_seconds("cron(0 12 * * ? *)") is None
