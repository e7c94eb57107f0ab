"""tests/aws: the CDK app, synthesized once per session.

aws-cdk-lib lives in its own virtualenv, .venv/cdk (`make cdk-venv`): its jsii pins
typeguard 2 while parsl (the benchmarks' peer) needs typeguard 4. So under the main
virtualenv this directory runs one test, test_in_cdk_venv.py, which runs the suite in
.venv/cdk and fails with its output if anything fails there; under .venv/cdk the stack
tests themselves run. test_config.py needs no CDK and runs under both.
"""
from __future__ import annotations

import os

import pytest

try:
    import aws_cdk.assertions  # noqa: F401

    IN_CDK_VENV = True
except ImportError:
    IN_CDK_VENV = False
collect_ignore = ["test_in_cdk_venv.py"] if IN_CDK_VENV else ["test_stacks.py", "test_push_stack.py", "test_ui_stack.py",
                                                               "test_archival_capacity.py", "test_function_settings.py"]

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("CDK_DISABLE_CLI_TELEMETRY", "true")

# Bundling (pip installing the layer's wheels) is for `cdk synth`/`cdk deploy`; templates
# do not depend on it, so the tests skip it and need no network.
NO_BUNDLING = {"aws:cdk:bundling-stacks": []}


def _synth(tmp_path_factory, context):
    from aws_cdk.assertions import Template

    from infra.aws.app import build

    outdir = tmp_path_factory.mktemp("cdk.out")
    app, skyfn = build({**NO_BUNDLING, **context}, outdir=str(outdir), environ={})
    assembly = app.synth()
    prefix = f"Skyfn-{skyfn.network.node.try_get_context('stage')}-"
    raw = {s.stack_name.removeprefix(prefix): s.template for s in assembly.stacks}
    return {"app": skyfn, "outdir": outdir, "raw": raw,
            "templates": {name: Template.from_json(t) for name, t in raw.items()}}


@pytest.fixture(scope="session")
def synth(tmp_path_factory):
    """The default deployment: stage ci (data retained), Cognito, one account/region."""
    return _synth(tmp_path_factory, {"stage": "ci", "region": "eu-west-1", "account": "123456789012"})


@pytest.fixture(scope="session")
def synth_globus(tmp_path_factory):
    return _synth(tmp_path_factory, {"stage": "devglobus", "auth": "globus",
                                     "globus_audience": "0a1b2c3d-client", "region": "us-east-2"})


@pytest.fixture(scope="session")
def synth_five_drainers(tmp_path_factory):
    """The most history drainers one EventBridge rule can start (issue 24)."""
    return _synth(tmp_path_factory, {"stage": "test5", "region": "eu-west-1", "history_drainers": "5"})
