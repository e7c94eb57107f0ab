"""Packaging (issue 14): what each install brings, ranges in the metadata and exact pins in
requirements.txt kept in step, and commands of parts not installed saying which extra to
install. (Building and installing the wheels themselves: scripts/check_install.py.)"""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from typer.testing import CliRunner

from skyfn import extras

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
COMM_PROJECT = tomllib.loads((ROOT / "packaging" / "skyfn-comm" / "pyproject.toml").read_text())["project"]
NOT_IN_SDK = {"boto3", "botocore", "moto", "pyarrow", "numpy", "pyzmq", "aws-lambda-powertools", "redis",
              "cryptography", "psutil"}


def _name(req: Requirement) -> str:
    return re.sub(r"[-_.]+", "-", req.name).lower()


def _reqs(lines: list[str]) -> list[Requirement]:
    return [Requirement(line) for line in lines]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"requirements.txt must pin exactly: {line}"
            pins[_name(req)] = spec.version
    return pins


def test_the_sdk_brings_none_of_the_heavy_parts():
    names = {_name(r) for r in _reqs(PROJECT["dependencies"])}
    assert not names & NOT_IN_SDK, names & NOT_IN_SDK
    assert {"requests", "pydantic", "cloudpickle", "dill", "tqdm", "typer", "pyyaml"} <= names


def test_extras_bring_their_parts():
    opt = {k: {_name(r) for r in _reqs(v)} for k, v in PROJECT["optional-dependencies"].items()}
    assert {"pyzmq", "psutil", "redis", "globus-sdk"} <= opt["endpoint"]
    assert {"skyfn-comm", "numpy", "pyarrow"} <= opt["comm"]
    assert {"skyfn", "moto", "aws-lambda-powertools"} <= opt["local"]  # skyfn[endpoint] and the service
    assert {"aws-cdk-lib", "constructs"} <= opt["aws"]
    (everything,) = _reqs(PROJECT["optional-dependencies"]["all"])
    assert {"matplotlib"} <= opt["report"]
    assert everything.extras == {"endpoint", "comm", "local", "report"}


def test_metadata_uses_ranges_and_the_pins_satisfy_them():
    pins = _pins()
    reqs = _reqs(PROJECT["dependencies"]) + [r for v in PROJECT["optional-dependencies"].values() for r in _reqs(v)]
    for req in reqs:
        name = _name(req)
        if name == "skyfn":
            continue
        if name == "skyfn-comm":  # the communicator of the same release, exactly
            assert str(req.specifier) == f"=={PROJECT['version']}" == f"=={COMM_PROJECT['version']}"
            continue
        assert not any(s.operator in ("==", "===") for s in req.specifier), f"{req}: use a range, pins go in " \
                                                                              "requirements.txt"
        assert any(s.operator in ("<", "<=", "~=") for s in req.specifier) or name == "cryptography", \
            f"{req}: give an upper bound (the next major)"
        if name in pins:  # aws-cdk-lib and constructs are pinned in requirements-aws.txt
            assert req.specifier.contains(pins[name], prereleases=True), \
                f"requirements.txt pins {name}=={pins[name]}, outside the metadata's range {req.specifier}"
    aws_pins = {}
    for line in (ROOT / "requirements-aws.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            aws_pins[_name(req)] = next(iter(req.specifier)).version
    for req in _reqs(PROJECT["optional-dependencies"]["aws"]):
        assert req.specifier.contains(aws_pins[_name(req)]), f"requirements-aws.txt is outside {req}"


def test_every_pinned_runtime_requirement_belongs_to_some_install():
    declared = {_name(r) for r in _reqs(PROJECT["dependencies"])}
    for v in PROJECT["optional-dependencies"].values():
        declared |= {_name(r) for r in _reqs(v)}
    assert not set(_pins()) - declared, f"pinned in requirements.txt but in no install: {set(_pins()) - declared}"


def test_the_development_install_has_every_extra():
    for extra in extras.MODULES:
        assert extras.missing(extra) == [], extra


def test_a_missing_extra_names_the_command_the_modules_and_the_pip_line(monkeypatch):
    monkeypatch.setitem(extras.MODULES, "local", extras.MODULES["local"] + ("no_such_module_here",))
    with pytest.raises(extras.MissingExtra) as info:
        extras.require("local", "skyfn local up")
    assert str(info.value) == ("skyfn local up needs skyfn[local], which is not installed here (missing: "
                               "no_such_module_here): pip install 'skyfn[local]'")


@pytest.mark.parametrize("args", [["local", "up", "--detach"], ["local", "status"], ["local", "down"],
                                  ["local", "token", "--user", "bob"], ["login", "--local"]])
def test_local_commands_without_the_runtime_say_how_to_install_it(monkeypatch, tmp_path, args):
    from skyfn.cli import app

    monkeypatch.setitem(extras.MODULES, "local", ("no_such_module_here",))
    result = CliRunner().invoke(app, args, env={"SKYFN_HOME": str(tmp_path)})
    assert result.exit_code == 1
    assert "pip install 'skyfn[local]'" in result.output and "no_such_module_here" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "local").exists()  # nothing was started


def test_the_embedded_runtime_is_a_plugin_of_the_cli():
    """Its commands come through entry points, declared in pyproject.toml and registered by
    the installation (an editable one too: `make install` re-runs when pyproject.toml changes)."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared[extras.CLI_PLUGINS] == {"local": "infra.local.cli:app"}
    assert declared[extras.LOGIN_PLUGINS] == {"local": "infra.local.cli:local_login"}
    from infra.local import cli
    from skyfn.cli import app

    assert extras.plugin(extras.CLI_PLUGINS, "local") is cli.app
    assert extras.plugin(extras.LOGIN_PLUGINS, "local") is cli.local_login
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0 and "local" in result.output and "embedded" in result.output


def test_the_plugin_loads_with_the_sdk_dependencies_alone():
    """infra/local/cli.py ships in the pure wheel, so an SDK-only install finds it: at import it
    may load the SDK and typer, nothing of the runtime (its commands check the extra first)."""
    code = ("import sys, infra.local.cli; "
            "print('\\n'.join(sorted({m.split('.')[0] for m in sys.modules})))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                cwd=ROOT).stdout.split())
    heavy = {"boto3", "botocore", "moto", "zmq", "redis", "psutil", "aws_lambda_powertools", "jwt", "cryptography",
             "lambdas", "endpoint_agent", "numpy", "pyarrow"}
    assert not loaded & heavy, loaded & heavy


@pytest.mark.parametrize("args,what", [(["local", "up", "--detach"], "skyfn local up"),
                                       (["local", "status"], "skyfn local status"),
                                       (["local"], "skyfn local"), (["login", "--local"], "skyfn login --local")])
def test_without_the_plugin_registered_the_commands_say_how_to_install_it(monkeypatch, tmp_path, args, what):
    """An installation without the runtime's entry points: `skyfn local ...` still exists and
    answers with one line naming the extra, the same as a missing extra's."""
    from skyfn.cli import app

    monkeypatch.setattr(extras, "plugin", lambda group, name: None)
    monkeypatch.setattr(extras, "plugin_names", lambda group: [])
    monkeypatch.setitem(extras.MODULES, "local", ("no_such_module_here",))
    result = CliRunner().invoke(app, args, env={"SKYFN_HOME": str(tmp_path)})
    assert result.exit_code == 1
    assert result.output.strip() == (f"error: {what} needs skyfn[local], which is not installed here (missing: "
                                     "no_such_module_here): pip install 'skyfn[local]'")
    assert not (tmp_path / "local").exists()
    monkeypatch.setitem(extras.MODULES, "local", ())  # the modules are there, the entry points are not
    result = CliRunner().invoke(app, args, env={"SKYFN_HOME": str(tmp_path)})
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "not registered" in result.output and "pip install 'skyfn[local]'" in result.output
    assert "local" in CliRunner().invoke(app, ["--help"]).output


def test_skyfn_endpoint_without_the_agent_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(extras.MODULES, "endpoint", ("no_such_module_here",))
    with pytest.raises(SystemExit) as info:
        extras.endpoint_main()
    assert info.value.code == 1
    assert "pip install 'skyfn[endpoint]'" in capsys.readouterr().err
