"""Issue 25: "Removing any one statement from a role's policy in a copy of cdk.out/ makes that
run fail with an AccessDenied that names the action and the function."

The app is synthesized once (stage dev, moto's account and region; skipped without the CDK
virtualenv .venv/cdk). Each case copies the assembly, removes one statement from one
function's AWS::IAM::Policy (found by its Sid, or by its actions and the resource it names),
starts the runtime from the copy (`skyfn local up --detach --from-templates`, IAM enforced)
in a private SKYFN_HOME with a one-worker endpoint, does what needs the statement, and checks
that the run fails and that the AccessDenied names the action and the function (the session
`skyfn-dev-<name>` of the assumed-role ARN): in the refusals of the access log, in the least-
privilege report (python -m infra.local.standins.iam.report_cli, exit 1) and where the operator looks
(the service log). The control runs the unmodified assembly: the same scenario, 0 refusals.

- results: the statement of its event-source mapping (sqs:ReceiveMessage ... on the results
  queue) -> results are never taken off the queue: the task stays unfinished.
- api: `EndpointQueues` (sqs:CreateQueue ... sqs:SendMessage on skyfn-dev-tasks-*) -> the
  endpoint's registration cannot create its task queue: the endpoint never comes online.
- history: dynamodb:PutItem/BatchWriteItem on the history table -> archival fails: the
  task's record stays in the outbox.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.infra.test_templates_model import synthesized_assembly

FINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def square(x):
    return x * x


# -- the assembly, and a copy with one statement less -------------------------------------------

@pytest.fixture(scope="module")
def assembly(tmp_path_factory) -> Path:
    return synthesized_assembly(tmp_path_factory)


@dataclass(frozen=True)
class Removal:
    """One statement of one function's role: by `sid`, or by an action it allows and a text
    its Resource holds (e.g. the logical id of the queue or table it names)."""
    function: str                 # the function's name (its FunctionName, its session name)
    action: str                   # the action whose refusal the case expects
    sid: str | None = None
    resource_mentions: str | None = None

    def matches(self, statement: dict) -> bool:
        if self.sid is not None:
            return statement.get("Sid") == self.sid
        actions = statement.get("Action")
        actions = [actions] if isinstance(actions, str) else list(actions or [])
        return self.action in actions and self.resource_mentions in json.dumps(statement.get("Resource"))


def _role_of(templates: dict[Path, dict], function: str) -> tuple[Path, str]:
    for path, template in templates.items():
        for resource in template.get("Resources", {}).values():
            props = resource.get("Properties", {})
            if resource.get("Type") == "AWS::Lambda::Function" and props.get("FunctionName") == function:
                return path, props["Role"]["Fn::GetAtt"][0]
    raise AssertionError(f"no AWS::Lambda::Function named {function} in the assembly")


def without_statement(assembly: Path, dest: Path, removal: Removal) -> dict:
    """A copy of `assembly` at `dest` with the statement of `removal` taken out of the policy of
    the function's role; returns the statement removed (printed: pytest -s shows it)."""
    shutil.copytree(assembly, dest)
    templates = {p: json.loads(p.read_text()) for p in dest.glob("*.template.json")}
    path, role = _role_of(templates, removal.function)
    template = templates[path]
    found = []
    for logical_id, resource in template["Resources"].items():
        if resource.get("Type") != "AWS::IAM::Policy" or {"Ref": role} not in resource["Properties"].get("Roles", []):
            continue
        statements = resource["Properties"]["PolicyDocument"]["Statement"]
        found += [(logical_id, statements, s) for s in statements if removal.matches(s)]
    assert len(found) == 1, f"{removal}: {len(found)} statements of {role}'s policies match, not one"
    logical_id, statements, statement = found[0]
    statements.remove(statement)
    path.write_text(json.dumps(template, indent=1))
    print(f"removed from {path.name} {logical_id} (role {role} of {removal.function}): "
          f"{json.dumps(statement)[:400]}")
    return copy.deepcopy(statement)


# -- a runtime from an assembly, in a private home -----------------------------------------------

class Run:
    def __init__(self, home: Path, cdk_out: Path):
        self.home, self.cdk_out = home, cdk_out
        self.up_error: Exception | None = None

    @property
    def access_log(self) -> Path:
        return self.home / "local" / "templates" / "iam-access.jsonl"

    def entries(self) -> list[dict]:
        from infra.local.standins.iam import report

        return report.read_log(self.access_log)

    def refusals(self) -> list[str]:
        from infra.local.standins.iam import report

        return report.refusals(self.entries())

    def service_log(self) -> str:
        return (self.home / "local" / "service.log").read_text(errors="replace")

    def wait_for(self, what, timeout: float, period: float = 0.25):
        deadline = time.monotonic() + timeout
        while True:
            got = what()
            if got or time.monotonic() > deadline:
                return got
            time.sleep(period)

    def refused(self, function: str, action: str) -> list[dict]:
        """The refused requests of `action` by a session named `function` (a function's own)."""
        return [e for e in self.entries() if not e.get("allowed") and e.get("action") == action
                and "assumed-role/" in e.get("principal", "") and e["principal"].endswith(f"/{function}")]

    def report(self) -> tuple[int, str]:
        import contextlib
        import io

        from infra.local.standins.iam import report_cli

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = report_cli.main(["--home", str(self.home)])
        return code, out.getvalue()


@pytest.fixture
def start(tmp_path, monkeypatch):
    """start(cdk_out) -> Run: the runtime from `cdk_out` in a private SKYFN_HOME, stopped at
    teardown. A failed `up` is recorded in run.up_error (what the user would see), not raised."""
    from infra.local import runtime

    homes = []

    def _start(cdk_out: Path) -> Run:
        home = tmp_path / f"home{len(homes)}"
        cfg = home / "endpoints" / "local"
        cfg.mkdir(parents=True)
        (cfg / "config.yaml").write_text(yaml.safe_dump({
            "workers": 1, "lease_seconds": 4, "heartbeat_period": 1, "grace_period": 5,
            "data": {"default": "redis", "redis": {"start": True}},
        }))
        monkeypatch.setenv("SKYFN_HOME", str(home))
        homes.append(home)
        run = Run(home, cdk_out)
        try:
            runtime.up(home, detach=True, from_templates=True, cdk_out=str(cdk_out), echo=lambda *_: None)
        except runtime.LocalError as exc:
            run.up_error = exc
        return run

    yield _start
    for home in homes:
        runtime.down(home, echo=lambda *_: None)


def submit(function=square, arg: Any = 7):
    from skyfn import Client

    client = Client(retry_seconds=10)
    endpoint = client.endpoint_id("local")
    return client, client.run(client.register_function(function), arg, endpoint_id=endpoint)


def outbox_length() -> int:
    from infra.local import runtime

    backlog = runtime.status(os.environ["SKYFN_HOME"]).get("backlog") or {}
    return int(backlog.get("outbox", -1))


def assert_reported(run: Run, function: str, action: str, where: str) -> None:
    """The AccessDenied names the action and the function in the access log's refusals, the
    least-privilege report (exit 1) and `where` (a text the user or operator sees)."""
    refused = run.refused(function, action)
    assert refused, f"no refusal of {action} for {function} in {run.access_log}: {run.refusals()}"
    lines = run.refusals()
    assert any(line.startswith(f"{function} (role ") and f": {action} on " in line for line in lines), lines
    code, text = run.report()
    assert code == 1, text
    assert any(line.strip().startswith(f"{function} (role ") and f": {action} on " in line
               for line in text.splitlines()), text
    said = rf"assumed-role/[^/\s]+/{re.escape(function)} is not authorized to perform: {re.escape(action)} on resource"
    assert re.search(said, where), where[-3000:]


# -- the control: the templates as synthesized ---------------------------------------------------

def test_unmodified_assembly_runs_with_no_refusal(assembly, start):
    run = start(assembly)
    assert run.up_error is None, run.up_error
    client, tid = submit()
    assert client.get_result(tid, timeout=30) == 49
    # archival: the history function's BatchWriteItem of the task's page, allowed
    assert run.wait_for(lambda: [e for e in run.entries() if e.get("allowed") and e["action"] == "dynamodb:BatchWriteItem"
                                 and e["principal"].endswith("/skyfn-dev-history")
                                 and e["resource"].endswith(":table/skyfn-dev-history")], 15)
    assert run.wait_for(lambda: outbox_length() == 0, 10)
    client.close()
    assert run.refusals() == []
    code, text = run.report()
    assert code == 0, text
    assert "0 refused request(s)" in text


# -- one statement less, one function each -------------------------------------------------------

def test_results_function_without_its_queue_statement_never_stores_a_result(assembly, start, tmp_path):
    removal = Removal("skyfn-dev-results", "sqs:ReceiveMessage", resource_mentions="ResultsQueue")
    removed = without_statement(assembly, tmp_path / "cdk.out", removal)
    assert "sqs:ReceiveMessage" in removed["Action"]
    run = start(tmp_path / "cdk.out")
    assert run.up_error is None, run.up_error  # the service starts; its results mapping cannot poll
    client, tid = submit()
    with pytest.raises(TimeoutError):
        client.get_result(tid, timeout=8)
    assert client.get_task(tid)["state"] not in FINAL  # the task ran; its result is still on the queue
    client.close()
    assert run.wait_for(lambda: "is not authorized to perform: sqs:ReceiveMessage" in run.service_log(), 5)
    assert_reported(run, "skyfn-dev-results", "sqs:ReceiveMessage", run.service_log())


def test_api_function_without_endpoint_queues_cannot_register_the_endpoint(assembly, start, tmp_path):
    removal = Removal("skyfn-dev-api", "sqs:CreateQueue", sid="EndpointQueues")
    removed = without_statement(assembly, tmp_path / "cdk.out", removal)
    assert {"sqs:CreateQueue", "sqs:SendMessage"} <= set(removed["Action"])
    run = start(tmp_path / "cdk.out")
    # the endpoint's registration must create its task queue: it is refused, the endpoint never
    # comes online, `skyfn local up` fails
    assert run.up_error is not None, "the runtime came up although the api may not create the endpoint's queue"
    print(f"skyfn local up: {run.up_error}")
    assert "local" in str(run.up_error)
    assert_reported(run, "skyfn-dev-api", "sqs:CreateQueue", run.service_log())
    assert not run.refused("skyfn-dev-api", "sqs:SendMessage")  # nothing was submitted: no queue to send to


def test_history_function_without_its_history_table_statement_cannot_archive(assembly, start, tmp_path):
    removal = Removal("skyfn-dev-history", "dynamodb:BatchWriteItem", resource_mentions="HistoryTable")
    removed = without_statement(assembly, tmp_path / "cdk.out", removal)
    assert "dynamodb:BatchWriteItem" in removed["Action"]
    run = start(tmp_path / "cdk.out")
    assert run.up_error is None, run.up_error
    client, tid = submit()
    assert client.get_result(tid, timeout=30) == 49  # the task path does not need the history
    client.close()
    assert run.wait_for(lambda: run.refused("skyfn-dev-history", "dynamodb:BatchWriteItem"), 15), run.refusals()
    assert run.wait_for(lambda: "is not authorized to perform: dynamodb:BatchWriteItem" in run.service_log(), 5)
    # archival failed: the batch went back to the outbox (a drainer may hold it for a moment)
    assert run.wait_for(lambda: outbox_length() > 0, 5)
    assert_reported(run, "skyfn-dev-history", "dynamodb:BatchWriteItem", run.service_log())
    assert all(e["resource"].endswith(":table/skyfn-dev-history")
               for e in run.refused("skyfn-dev-history", "dynamodb:BatchWriteItem"))
