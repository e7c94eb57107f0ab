"""The import rules (.importlinter, issue 22): the layers hold and no package has an import
circle among its children -- and the contracts really catch both kinds of breach, shown on a
copy of the source tree with one deliberate upward import, then one deliberate circle."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"
PACKAGES = ("skyfn", "lambdas", "endpoint_agent", "infra", "benchmarks", "comm", "rendezvous", "stepfunctions")


def lint(cwd: Path) -> subprocess.CompletedProcess:
    # PYTHONPATH first: the packages under `cwd` are the ones analysed, not the editable install's
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_import_contracts_hold():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Contracts: 3 kept, 0 broken." in out.stdout


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The Python sources of every package in the contracts, and the contracts, in tmp_path."""

    def only_python(directory: str, names: list[str]) -> list[str]:
        return [n for n in names if not (n.endswith(".py") or (Path(directory) / n).is_dir()) or n == "__pycache__"]

    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=only_python)
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    assert lint(tmp_path).returncode == 0  # the copy is as clean as the tree
    return tmp_path


def test_an_upward_import_breaks_the_layers(tree: Path):
    states = tree / "skyfn" / "protocol" / "states.py"
    states.write_text(states.read_text() + "\nimport endpoint_agent.config  # deliberate: the SDK reaching up\n")
    out = lint(tree)
    assert out.returncode == 1
    assert "Contracts: 2 kept, 1 broken." in out.stdout
    assert "skyfn is not allowed to import endpoint_agent:" in out.stdout
    assert "skyfn.protocol.states -> endpoint_agent.config" in out.stdout


def test_a_circle_inside_a_package_breaks_acyclic_siblings(tree: Path):
    # skyfn.protocol.serialize already imports skyfn.protocol.errors; the way back closes a circle
    errors = tree / "skyfn" / "protocol" / "errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _late():\n    from skyfn.protocol import serialize  # deliberate circle\n")
    out = lint(tree)
    assert out.returncode == 1
    assert "Contracts: 2 kept, 1 broken." in out.stdout
    assert "No cycles are allowed in skyfn.protocol." in out.stdout


def test_a_redis_import_in_the_services_logic_breaks_the_store_contract(tree: Path):
    ids = tree / "lambdas" / "core" / "ids.py"
    ids.write_text(ids.read_text() + "\nimport redis  # deliberate: the logic talking to its store\n")
    out = lint(tree)
    assert out.returncode == 1
    assert "Contracts: 2 kept, 1 broken." in out.stdout
    assert "lambdas.core is not allowed to import redis:" in out.stdout
