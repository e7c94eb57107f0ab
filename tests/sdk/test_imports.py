"""The SDK installs light: it imports nothing above skyfn.protocol, and importing
skyfn.protocol (workers, handlers) does not drag in the SDK's HTTP stack. Issue 14's rule:
`import skyfn` (Client, Executor, skyfn.data) loads none of boto3, botocore, moto, zmq,
pyarrow or numpy -- checked here in the development install, where all of them are installed,
and by scripts/check_install.py in fresh virtualenvs made from the wheels. And imports go one
way: no module of skyfn/ imports infra/ or lambdas/, not even inside a function (the embedded
runtime's commands are a plugin: infra/local/cli.py)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SDK = Path(__file__).resolve().parents[2] / "skyfn"
NOT_FROM_THE_SDK = ("infra", "lambdas")

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


def _imported(tree: ast.AST):
    """(line, module) of every import in `tree`, at any depth, with importlib.import_module("...")
    and __import__("...") of a literal name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) in ("import_module",
                                                                                          "__import__")):
            yield node.lineno, node.args[0].value


def test_the_sdk_never_imports_infra_or_lambdas():
    offending = [f"{path.relative_to(SDK.parent)}:{line}: {module}"
                 for path in sorted(SDK.rglob("*.py"))
                 for line, module in _imported(ast.parse(path.read_text(), str(path)))
                 if module.split(".")[0] in NOT_FROM_THE_SDK]
    assert not offending, "the SDK imports the service or the runtime (one-way imports):\n" + "\n".join(offending)


def test_the_scan_sees_function_local_imports():
    code = ("def f():\n    from infra.local import runtime\n"
            "def g():\n    import lambdas.api\n    importlib.import_module('infra.local.state')\n")
    assert [m for _, m in _imported(ast.parse(code))] == ["infra.local", "lambdas.api", "infra.local.state"]
