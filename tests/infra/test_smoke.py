"""infra/aws/smoke.py, the post-deploy smoke test, run against a stand-in stage: the six
`Skyfn-<stage>-<part>` stacks created in moto's CloudFormation (server mode) with the
outputs a deployment has, pointing at the real API handler behind the embedded gateway
and at a real rendezvous server. What a stand-in can show must pass; what needs the
deployed functions (reaper and history invoked in Lambda, the results event source) must
be reported FAIL with what was seen, and the exit status must say so."""
from __future__ import annotations

import json
import os

import pytest


@pytest.fixture
def stage(unique):
    return f"smoke{unique}"


def _stack(cfn, stage: str, part: str, outputs: dict[str, str]) -> None:
    template = {"Resources": {"Marker": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": f"{stage}-{part}"}}},
                "Outputs": {k: {"Value": v} for k, v in outputs.items()}}
    cfn.create_stack(StackName=f"Skyfn-{stage}-{part}", TemplateBody=json.dumps(template))


@pytest.fixture
def api_url(redis_url, aws_endpoint, monkeypatch):
    from infra.local.standins.gateway import Gateway
    from lambdas.bootstrap import ensure_resources
    from lambdas.core import deps

    for k, v in {"SKYFN_REDIS_URL": redis_url, "SKYFN_AUTH_SECRET": "smoke-" + "s" * 40,
                 "SKYFN_TABLE_PREFIX": "smoke", "SKYFN_QUEUE_KIND": "redis", "POWERTOOLS_LOG_LEVEL": "ERROR",
                 "POWERTOOLS_METRICS_DISABLED": "true"}.items():
        monkeypatch.setenv(k, v)
    deps.reset()
    ensure_resources()
    from lambdas.api import handler

    gateway = Gateway(handler, concurrency=1).start()
    yield gateway.url
    gateway.stop()
    deps.reset()


@pytest.fixture
def rendezvous_address():
    from rendezvous.runner import serve_in_thread

    server = serve_in_thread("127.0.0.1", 0, "smoke-secret")
    yield f"{server.host}:{server.port}"
    server.stop()


def _run(capsys, stage: str) -> tuple[int, dict[str, str]]:
    """Exit status, and per check 'PASS|FAIL <what was seen>' (plus the summary line)."""
    from infra.aws import smoke

    names = [name for name, _ in smoke.checks(smoke.Smoke(stage, "us-east-1"))]
    code = smoke.main(["--stage", stage, "--region", os.environ.get("AWS_DEFAULT_REGION", "us-east-1")])
    lines = capsys.readouterr().out.splitlines()
    checks = {}
    for line, name in zip(lines, names):
        verdict, _, rest = line.partition(" ")
        assert rest.startswith(name + ": "), (line, name)
        checks[name] = f"{verdict} {rest[len(name) + 2:]}"
    assert len(lines) == len(names) + 1, lines
    return code, checks | {"summary": lines[-1]}


def test_smoke_passes_what_a_stand_in_shows_and_fails_the_rest(api_url, rendezvous_address, aws_endpoint, stage,
                                                                capsys):
    import boto3

    cfn = boto3.client("cloudformation")
    for part in ("network", "data", "agent-access", "workflows"):
        _stack(cfn, stage, part, {})
    _stack(cfn, stage, "service", {"ApiEndpoint4F160690": api_url + "/"})
    _stack(cfn, stage, "rendezvous", {"RendezvousAddress": rendezvous_address})
    code, checks = _run(capsys, stage)
    assert code == 1
    assert checks["stacks deployed"] == "PASS 6 stacks complete"
    assert checks["API mapping (GET /openapi.json)"].startswith("PASS 200 in ")
    assert checks["authorizer (POST /tasks, no token)"] == "PASS 401 without a token"
    assert checks["rendezvous NLB"] == f"PASS TCP connect to {rendezvous_address}"
    # nothing deployed in Lambda: each of these names what it could not find
    for name in ("reaper: Redis TLS + AUTH, SQS IAM", "history: DynamoDB IAM", "results queue -> results function"):
        assert checks[name].startswith("FAIL "), checks[name]
    assert f"skyfn-{stage}-reaper" in checks["reaper: Redis TLS + AUTH, SQS IAM"]
    assert checks["summary"] == "4 passed, 3 failed"


def test_smoke_names_a_missing_stack_and_a_missing_output(aws_endpoint, stage, capsys):
    import boto3

    cfn = boto3.client("cloudformation")
    for part in ("network", "data", "service", "agent-access", "workflows"):
        _stack(cfn, stage, part, {})
    code, checks = _run(capsys, stage)
    assert code == 1
    assert checks["stacks deployed"].startswith("FAIL ") and f"Skyfn-{stage}-rendezvous" in checks["stacks deployed"]
    assert checks["API mapping (GET /openapi.json)"] == "FAIL RuntimeError: the service stack has no ApiEndpoint output"
    assert checks["rendezvous NLB"] == "FAIL RuntimeError: the rendezvous stack has no RendezvousAddress output"
