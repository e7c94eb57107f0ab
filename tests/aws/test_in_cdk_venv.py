"""Runs tests/aws in .venv/cdk (see conftest.py for why it is a separate virtualenv)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CDK_PYTHON = REPO / ".venv" / "cdk" / "bin" / "python"


@pytest.mark.timeout(900)
def test_cdk_stacks_suite_passes_in_its_virtualenv():
    assert CDK_PYTHON.exists(), f"{CDK_PYTHON} is missing: run `make cdk-venv` (make test does)"
    env = dict(os.environ, CDK_DISABLE_CLI_TELEMETRY="true", JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20")
    proc = subprocess.run([str(CDK_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/aws"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=850)
    sys.stdout.write(proc.stdout[-4000:])
    assert proc.returncode == 0, f"tests/aws failed in .venv/cdk:\n{proc.stdout[-8000:]}\n{proc.stderr[-4000:]}"
    assert " passed" in proc.stdout and " failed" not in proc.stdout
