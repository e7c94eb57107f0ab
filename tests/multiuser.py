"""Helpers for tests that run processes as real local accounts (multi-user endpoints, issue 23).

A process started as a test account cannot run the venv's interpreter: it lives under /root
(0700). It runs the system's /usr/bin/python3 (the same minor version, so the venv's compiled
extensions load) with PYTHONPATH pointing at `shared_python_copy()`: a fresh 0755 directory
holding hard links (`cp -al`: instant, no bytes copied) to the venv's site-packages and the
repository's packages, readable by every account, removed afterwards. The conftest fixture
`shared_python` (tests/agent/conftest.py) wraps it per test module.

`write_site_files(directory, pythonpath=..., template=...)` writes what a site's administrator
edits after `skyfn-endpoint configure --multi-user`: users mapped by their email
`<account>@users.example.org`, the environment file, the template and, when given, the schema.

`LocalAccounts` creates accounts with `useradd -m` under unique names (parallel runs cannot
collide), each home 0700, and removes them with `userdel -r` in `remove_all()`.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = "/usr/bin/python3"
PACKAGES = ("skyfn", "endpoint_agent", "comm", "rendezvous")   # the repository's packages user processes import


def system_python_problem() -> str | None:
    """None when SYSTEM_PYTHON can run the venv's packages, else why not (a skip reason)."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} is not installed (processes as test accounts need an interpreter outside /root)"
    out = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, timeout=60)
    mine = "%d.%d" % sys.version_info[:2]
    if out.returncode != 0 or out.stdout.strip() != mine:
        return (f"{SYSTEM_PYTHON} is Python {out.stdout.strip() or '?'}, the venv's is {mine}: its compiled "
                "extensions would not load")
    return None


def _link_tree(src: Path, dst: Path) -> None:
    """`cp -al` (hard links, modes kept); a plain copy where hard links cannot be made (another file system)."""
    done = subprocess.run(["cp", "-al", str(src), str(dst)], capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(dst, ignore_errors=True)
        subprocess.run(["cp", "-a", str(src), str(dst)], check=True, capture_output=True)


@contextmanager
def shared_python_copy(packages: tuple[str, ...] = PACKAGES) -> Iterator[tuple[str, str]]:
    """(python_path, pythonpath_env_value): an interpreter every account may run and a PYTHONPATH
    (the repository's packages, then the venv's site-packages) every account may read."""
    base = Path(tempfile.mkdtemp(prefix="skyfn-shared-python-"))
    try:
        base.chmod(0o755)
        src = base / "src"
        src.mkdir(mode=0o755)
        src.chmod(0o755)
        for pkg in packages:
            _link_tree(ROOT / pkg, src / pkg)
        site = base / "site-packages"
        _link_tree(Path(sysconfig.get_paths()["purelib"]), site)
        # The venv's .pth files (its editable install of this repository) are not read: the copy is
        # no site directory of /usr/bin/python3, and the repository's packages come first anyway.
        yield SYSTEM_PYTHON, f"{src}{os.pathsep}{site}"
    finally:
        shutil.rmtree(base, ignore_errors=True)


class LocalAccounts:
    """Accounts made for a test (useradd -m, unique names, homes 0700); `remove_all()` removes them."""

    def __init__(self, prefix: str = "sfp"):
        self.prefix = prefix
        self.made: list[str] = []

    def user(self) -> str:
        name = f"{self.prefix}{secrets.token_hex(4)}"
        self.made.append(name)
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True, capture_output=True)
        home = Path(os.path.expanduser(f"~{name}"))
        if home.is_dir():
            home.chmod(0o700)
        return name

    def remove_all(self) -> None:
        for name in self.made:
            subprocess.run(["userdel", "-f", "-r", name], capture_output=True)
        self.made.clear()


MAPPING_DOMAIN = "users.example.org"


def write_site_files(directory: Path, *, pythonpath: str, template: str, schema: dict | None = None) -> None:
    """The administrator's files of a multi-user endpoint in `directory` (see the module docstring)."""
    import json

    import yaml

    directory = Path(directory)
    (directory / "identity_mapping.yaml").write_text(yaml.safe_dump([{
        "DATA_TYPE": "expression_identity_mapping#1.0.0",
        "mappings": [{"source": "{email}", "match": r"(.*)@users\.example\.org", "output": "{0}"}]}]))
    (directory / "user_environment").write_text(f"LANG=C.UTF-8\nPYTHONPATH={pythonpath}\n")
    (directory / "user_config_template.yaml.j2").write_text(template)
    if schema is not None:
        (directory / "user_config_schema.json").write_text(json.dumps(schema))
