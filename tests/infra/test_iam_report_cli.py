"""The least-privilege report CLI (python -m infra.local.standins.iam.report_cli; issue 25) on a hand-
written access log and hand-written role specs: per function, the actions its role allows,
those it used, those never used and the refused requests; other principals after the
functions; exit code 1 when any request was refused, 0 when none, 2 with nothing to report."""
from __future__ import annotations

import json

import pytest

from infra.local.standins.iam import report_cli
from infra.local.standins.iam.roles import RoleSpec

ACCOUNT = "123456789012"
TRUST = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"},
                                                 "Action": "sts:AssumeRole"}]}
API_ROLE, HISTORY_ROLE, AGENT_ROLE = "Skyfn-dev-service-ApiRole", "Skyfn-dev-service-HistoryRole", "skyfn-dev-agent"
HISTORY_TABLE = f"arn:aws:dynamodb:us-east-1:{ACCOUNT}:table/skyfn-dev-history"
TASKS_QUEUE = f"arn:aws:sqs:us-east-1:{ACCOUNT}:skyfn-dev-tasks-e1"


def _doc(*statements):
    return {"Version": "2012-10-17", "Statement": list(statements)}


SPECS = [
    RoleSpec(API_ROLE, TRUST, [("ApiPolicy", _doc(
        {"Sid": "EndpointQueues", "Effect": "Allow", "Action": ["sqs:CreateQueue", "sqs:SendMessage"],
         "Resource": f"arn:aws:sqs:us-east-1:{ACCOUNT}:skyfn-dev-tasks-*"},
        {"Effect": "Allow", "Action": ["dynamodb:GetItem", "dynamodb:Query"], "Resource": HISTORY_TABLE},
        {"Effect": "Allow", "Action": "s3:GetObject*", "Resource": "arn:aws:s3:::payloads/*"}))],
             ["arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"]),
    RoleSpec(HISTORY_ROLE, TRUST, [("HistoryPolicy", _doc(
        {"Effect": "Allow", "Action": "secretsmanager:GetSecretValue", "Resource": "*"}))]),
    RoleSpec(AGENT_ROLE, TRUST, [("AgentPolicy", _doc(
        {"Effect": "Allow", "Action": "sqs:ReceiveMessage", "Resource": TASKS_QUEUE}))]),
]
FUNCTIONS = {"skyfn-dev-api": API_ROLE, "skyfn-dev-history": HISTORY_ROLE, "skyfn-dev-ui": API_ROLE}


def session(role: str, name: str) -> str:
    return f"arn:aws:sts::{ACCOUNT}:assumed-role/{role}/{name}"


def entry(principal: str, action: str, resource: str, allowed: bool = True) -> dict:
    return {"time": "2026-01-01T00:00:00.000+00:00", "principal": principal, "action": action, "resource": resource,
            "allowed": allowed, "reason": "allowed" if allowed else "because no identity-based policy allows the "
                                                                     f"{action} action", "api": action}


LOG = [
    entry(f"arn:aws:iam::{ACCOUNT}:user/skyfn-deployer", "sts:AssumeRole", f"arn:aws:iam::{ACCOUNT}:role/{API_ROLE}"),
    entry(session(API_ROLE, "skyfn-dev-api"), "sqs:CreateQueue", TASKS_QUEUE),
    entry(session(API_ROLE, "skyfn-dev-api"), "sqs:SendMessage", TASKS_QUEUE),
    entry(session(API_ROLE, "skyfn-dev-api"), "sqs:SendMessage", TASKS_QUEUE),
    entry(session(API_ROLE, "skyfn-dev-api"), "s3:GetObjectTagging", "arn:aws:s3:::payloads/k"),
    entry(session(HISTORY_ROLE, "skyfn-dev-history"), "secretsmanager:GetSecretValue", "arn:secret"),
    entry(session(HISTORY_ROLE, "skyfn-dev-history"), "dynamodb:BatchWriteItem", HISTORY_TABLE, allowed=False),
    entry(session(HISTORY_ROLE, "skyfn-dev-history"), "dynamodb:BatchWriteItem", HISTORY_TABLE, allowed=False),
    entry(session(AGENT_ROLE, "endpoint-e1"), "sqs:ReceiveMessage", TASKS_QUEUE),
]


def by_name(reports):
    return {r.name: r for r in reports}


def test_build_per_function():
    reports = report_cli.build(LOG, SPECS, FUNCTIONS)
    names = [r.name for r in reports]
    # functions first (sorted), then the other principals of the log
    assert names[:3] == ["skyfn-dev-api", "skyfn-dev-history", "skyfn-dev-ui"]
    assert set(names[3:]) == {f"arn:aws:iam::{ACCOUNT}:user/skyfn-deployer", session(AGENT_ROLE, "endpoint-e1")}
    r = by_name(reports)

    api = r["skyfn-dev-api"]
    assert api.role == API_ROLE and api.principals == [session(API_ROLE, "skyfn-dev-api")]
    assert api.allowed_actions == ["sqs:CreateQueue", "sqs:SendMessage", "dynamodb:GetItem", "dynamodb:Query",
                                   "s3:GetObject*"]
    assert api.managed_policies == ["arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"]
    assert api.used_actions == ["s3:GetObjectTagging", "sqs:CreateQueue", "sqs:SendMessage"]
    assert api.unused_allowed == ["dynamodb:GetItem", "dynamodb:Query"]  # s3:GetObject* matched by a use
    assert api.refused == []

    history = r["skyfn-dev-history"]
    assert history.used_actions == ["secretsmanager:GetSecretValue"]
    assert history.unused_allowed == []
    assert history.refused == [{"principal": session(HISTORY_ROLE, "skyfn-dev-history"),
                                "action": "dynamodb:BatchWriteItem", "resource": HISTORY_TABLE,
                                "reason": "because no identity-based policy allows the dynamodb:BatchWriteItem action",
                                "count": 2}]

    ui = r["skyfn-dev-ui"]  # shares the api's role, made no request: nothing of the api's is its
    assert ui.principals == [] and ui.used_actions == [] and ui.unused_allowed == ui.allowed_actions

    agent = r[session(AGENT_ROLE, "endpoint-e1")]
    assert agent.function == "" and agent.role == AGENT_ROLE and agent.used_actions == ["sqs:ReceiveMessage"]

    assert report_cli.refused_lines(reports) == [
        f"skyfn-dev-history (role {HISTORY_ROLE}): dynamodb:BatchWriteItem on {HISTORY_TABLE} refused because no "
        "identity-based policy allows the dynamodb:BatchWriteItem action (x2)"]


def test_a_role_of_one_function_owns_its_other_sessions():
    log = [entry(session(HISTORY_ROLE, "bridge-session"), "secretsmanager:GetSecretValue", "arn:secret")]
    r = by_name(report_cli.build(log, SPECS, FUNCTIONS))
    assert r["skyfn-dev-history"].principals == [session(HISTORY_ROLE, "bridge-session")]
    assert r["skyfn-dev-history"].used_actions == ["secretsmanager:GetSecretValue"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    log = tmp_path / "local" / "templates" / "iam-access.jsonl"
    log.parent.mkdir(parents=True)
    monkeypatch.setattr(report_cli, "load_roles", lambda home, cdk_out=None: (SPECS, FUNCTIONS))
    return tmp_path, log


def _write(log, entries):
    log.write_text("".join(json.dumps(e) + "\n" for e in entries) + '{"cut by a cra')


def test_main_text_exit_1_on_refusals(home, capsys):
    root, log = home
    _write(log, LOG)
    assert report_cli.main(["--home", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"skyfn-dev-api  (role {API_ROLE})" in out
    assert "  allowed, never used:     dynamodb:GetItem, dynamodb:Query" in out
    assert f"  REFUSED dynamodb:BatchWriteItem on {HISTORY_TABLE}" in out
    assert "skyfn-dev-ui" in out and "(made no request in this run)" in out
    assert "1 refused request(s):" in out
    assert out.rstrip().splitlines()[-1].startswith(f"  skyfn-dev-history (role {HISTORY_ROLE}): "
                                                    "dynamodb:BatchWriteItem on ")


def test_main_markdown_exit_0_without_refusals(home, capsys):
    root, log = home
    _write(log, [e for e in LOG if e["allowed"]])
    assert report_cli.main(["--home", str(root), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Least privilege")
    assert f"| skyfn-dev-api | `{API_ROLE}` | 5 | 3 | 2 | 0 |" in out
    assert "## skyfn-dev-history" in out
    assert "- allowed, never used: `dynamodb:GetItem`, `dynamodb:Query`" in out
    assert "**0 refused request(s)**" in out


def test_main_without_a_runtime_from_the_templates(tmp_path, capsys):
    assert report_cli.main(["--home", str(tmp_path)]) == 2
    assert "not started from the templates" in capsys.readouterr().err


def test_main_without_an_access_log(home, capsys):
    root, log = home
    assert report_cli.main(["--home", str(root)]) == 2
    assert "no access log" in capsys.readouterr().err
