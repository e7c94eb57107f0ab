"""A multi-user endpoint on the embedded runtime, as a site runs one (issue 23).

Package-scoped: the runtime (`skyfn local up`, no single-user endpoint), real accounts made
with `useradd -m` (unique names; removed with `userdel -r` at the end), a multi-user endpoint
written by `skyfn-endpoint configure --multi-user` and edited as an administrator would, and
its privileged process started as root with `skyfn-endpoint start NAME --foreground`.
Users are mapped by an expression rule on their email: `<account>@users.example.org`.

The venv's interpreter lives under /root (0700), so user agents run /usr/bin/python3 (the
same 3.11 ABI) with a PYTHONPATH of hard-linked copies of the venv's site-packages and of
the repository's packages in a 0755 directory (tests/multiuser.py).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.multiuser import (MAPPING_DOMAIN, LocalAccounts, shared_python_copy, system_python_problem,
                             write_site_files)

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = MAPPING_DOMAIN



class Site:
    """What the tests use: the runtime, the accounts, the endpoint and its process."""

    def __init__(self, home: Path, state, accounts: dict[str, str], endpoint_dir: Path, runtime_dir: Path):
        self.home = home
        self.state = state
        self.accounts = accounts  # role (alice, bob, carol, dave) -> account name; carol is denied
        self.endpoint_dir = endpoint_dir
        self.runtime_dir = runtime_dir
        self.proc: subprocess.Popen | None = None
        self.endpoint_id: str | None = None
        self.admin_token = ""

    @property
    def service_url(self) -> str:
        return self.state.read_runtime()["service_url"]

    def token(self, user: str, email: str | None) -> str:
        from infra.local import runtime

        return runtime.mint_token(self.state, user, 3600, email=email)

    def client(self, user: str, email: str | None = None):
        from skyfn import Client

        return Client(service_url=self.service_url, token=self.token(user, email))

    def user(self, role: str):
        """A Client of the skyfn user whose email maps to the account of `role`."""
        account = self.accounts[role]
        return self.client(f"{role}-id", f"{account}@{DOMAIN}")

    def start(self) -> None:
        env = {**os.environ, "SKYFN_HOME": str(self.home), "SKYFN_SERVICE_URL": self.service_url,
               "SKYFN_TOKEN": self.admin_token}
        log = open(self.endpoint_dir / "mep.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "endpoint_agent", "start", "mu", "--foreground"], env=env,
                                     stdout=log, stderr=log, cwd=ROOT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = self.status()
            if status.get("state") == "running" and status.get("endpoint_id"):
                self.endpoint_id = status["endpoint_id"]
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"the multi-user endpoint exited: {self.log_tail()}")
            time.sleep(0.1)
        raise RuntimeError(f"the multi-user endpoint did not start: {self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout)
        self.proc = None

    def status(self) -> dict:
        try:
            return json.loads((self.endpoint_dir / "status.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def user_agents(self) -> list[dict]:
        return self.status().get("user_agents", [])

    def audit_lines(self) -> list[dict]:
        path = self.endpoint_dir / "audit.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def audit(self) -> list[dict]:
        """The tasks' records (not the disagreements)."""
        return [r for r in self.audit_lines() if "task_id" in r]

    def disagreements(self) -> list[dict]:
        """What user agents reported that did not fit the routing record."""
        return [r for r in self.audit_lines() if "disagreement" in r]

    def audit_of(self, task_ids, timeout: float = 30) -> list[dict]:
        """The audit records of these tasks, once each has one (a lane's agent copies them to the
        router, which writes them once the service confirms the outcome), and a period more for
        any duplicate."""
        ids = set(task_ids)
        deadline = time.monotonic() + timeout
        while not ids <= {r["task_id"] for r in self.audit()} and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        return [r for r in self.audit() if r["task_id"] in ids]

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join((self.endpoint_dir / "mep.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@pytest.fixture(scope="package")
def site(tmp_path_factory):
    from endpoint_agent.multiuser.configure import write_multi_user_files
    from endpoint_agent.paths import EndpointPaths
    from infra.local import runtime
    from infra.local.state import StateDir

    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("redis-server"):
        pytest.skip("multi-user endpoints need root, useradd and redis-server")
    problem = system_python_problem()
    if problem:
        pytest.skip(problem)
    made = LocalAccounts("mu")
    runtime_dir = Path(tempfile.mkdtemp(prefix="skyfn-mu-run-"))
    os.chmod(runtime_dir, 0o755)
    python_copy = shared_python_copy()
    python, pythonpath = python_copy.__enter__()
    home = tmp_path_factory.mktemp("skyfn-mu-home")
    old_home = os.environ.get("SKYFN_HOME")
    os.environ["SKYFN_HOME"] = str(home)
    state = StateDir.at(home)
    try:
        accounts = {role: made.user() for role in ("alice", "bob", "carol", "dave")}
        runtime.up(home, detach=True, endpoint=False, echo=lambda *_: None)
        paths = EndpointPaths("mu", root=home / "endpoints").ensure()
        write_multi_user_files(paths)
        config = yaml.safe_load(paths.config.read_text())
        config.update({"runtime_directory": str(runtime_dir / "{name}"), "user_agent_python": python,
                       "deny_accounts": ["root", accounts["carol"]], "idle_timeout": 600, "lease_seconds": 4,
                       "heartbeat_period": 1, "receive_wait": 0.5})
        paths.config.write_text(yaml.safe_dump(config))
        write_site_files(paths.dir, pythonpath=pythonpath, template=(
            "workers: {{ workers | default(2) }}\n"
            "lease_seconds: 4\n"
            "grace_period: 5\n"
            "receive_wait: 0.2\n"
            "log_level: {{ log_level | default('INFO') }}\n"
            "data:\n  default: redis\n  redis:\n    start: true\n"), schema={
            "type": "object", "additionalProperties": False,
            "properties": {"workers": {"type": "integer", "minimum": 1, "maximum": 8},
                           "log_level": {"type": "string"}}})
        s = Site(home, state, accounts, paths.dir, runtime_dir / "mu")
        s.admin_token = runtime.mint_token(state, "site-admin", 3600)
        s.start()
        admin = s.client("site-admin")
        admin.share("endpoints", s.endpoint_id, "all-users", "run")
        s.admin = admin
        yield s
        s.stop()
        admin.close()
    finally:
        runtime.down(home, echo=lambda *_: None)
        for name in made.made:
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        made.remove_all()
        shutil.rmtree(runtime_dir, ignore_errors=True)
        python_copy.__exit__(None, None, None)
        if old_home is None:
            os.environ.pop("SKYFN_HOME", None)
        else:
            os.environ["SKYFN_HOME"] = old_home
