"""The SDK installs light: it imports nothing above skyfn.protocol, and importing
skyfn.protocol (workers, handlers) does not drag in the SDK's HTTP stack. Issue 14's rule:
`import skyfn` (Client, Executor, skyfn.data) loads none of boto3, botocore, moto, zmq,
pyarrow or numpy -- checked here in the development install, where all of them are installed,
and by scripts/check_install.py in fresh virtualenvs made from the wheels."""
from __future__ import annotations

import subprocess
import sys

HEAVY = ("boto3", "botocore", "lambdas", "infra", "endpoint_agent", "comm", "rendezvous", "redis", "zmq", "moto",
         "pyarrow", "numpy", "aws_lambda_powertools", "psutil", "globus_sdk", "cryptography", "matplotlib")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print('\\n'.join(sys.modules))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    return {m.split(".")[0] for m in out}


def test_sdk_imports_nothing_above_protocol():
    mods = _modules_after("import skyfn; skyfn.Client; skyfn.Executor; import skyfn.config, skyfn.http")
    assert not mods & set(HEAVY), mods & set(HEAVY)
    assert "urllib3" in mods  # the transport (skyfn/http.py) did load


def test_sdk_with_data_refs_and_the_cli_stays_light():
    """The data plane's public names and the CLI module (its commands load their parts lazily)."""
    mods = _modules_after("import skyfn, skyfn.data, skyfn.cli, skyfn.extras; skyfn.Client; skyfn.Executor; "
                          "skyfn.data.Store; import skyfn.protocol.allowlist")
    assert not mods & set(HEAVY), mods & set(HEAVY)


def test_protocol_import_stays_light():
    mods = _modules_after("import skyfn.protocol")
    assert not mods & {"requests", "tqdm", "urllib3"}
