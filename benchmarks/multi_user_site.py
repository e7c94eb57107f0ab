"""The site of the multi-user benchmarks (benchmarks/multi_user.py, multi_user_idle.py): the
embedded runtime in a private SKYFN_HOME, fresh local accounts (tests/multiuser.py
LocalAccounts: `useradd -m`, removed with `userdel -r`), a shared interpreter every account
can run, one multi-user endpoint `mu` (and, for the comparisons of multi_user.py, one
ordinary single-user endpoint `su`), each started as root with
`python -m endpoint_agent start NAME --foreground`. `Site.close()` removes everything made,
also after an error: each step of the teardown runs whatever the previous ones did.

`settings` are put into the multi-user endpoint's config.yaml over the defaults (the
benchmark of idle users sets a short idle_timeout and lane_idle_timeout); `data_redis`
says whether each user agent starts a data redis-server, as a site's default template does.
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

from tests.multiuser import MAPPING_DOMAIN as DOMAIN

ROOT = Path(__file__).resolve().parent.parent
MU, SU = "mu", "su"
TOKEN_TTL = 6 * 3600


def problem() -> str | None:
    """Why this machine cannot run the benchmark, or None."""
    if os.geteuid() != 0:
        return ("benchmarks/multi_user.py must run as root: a multi-user endpoint's privileged process starts each "
                "user agent as a local account, and the benchmark makes those accounts (useradd). Run it with sudo.")
    for tool in ("useradd", "userdel", "redis-server"):
        if not shutil.which(tool):
            return f"benchmarks/multi_user.py needs {tool} on PATH"
    from tests.multiuser import system_python_problem

    return system_python_problem()


class Site:
    """The runtime, the accounts, the two endpoints; `close()` removes everything."""

    def __init__(self, users: int, workers: int, echo, *, single_user: bool = True, settings: dict | None = None,
                 data_redis: bool = True):
        from tests.multiuser import LocalAccounts

        self.n_users, self.workers, self.echo = users, workers, echo
        self.single_user, self.settings, self.data_redis = single_user, dict(settings or {}), data_redis
        self.accounts_made = LocalAccounts("mub")
        self.accounts: list[str] = []
        self.python_copy = None
        self.python = self.pythonpath = ""
        self.home = Path(tempfile.mkdtemp(prefix="skyfn-mub-home-"))
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="skyfn-mub-run-"))
        os.chmod(self.runtime_dir, 0o755)
        self.state = None
        self.runtime_up = False
        self.procs: dict[str, subprocess.Popen] = {}
        self.endpoint_ids: dict[str, str] = {}
        self.clients: list = []
        self.old_home = os.environ.get("SKYFN_HOME")

    # --- setup -----------------------------------------------------------------------
    def open(self) -> "Site":
        from infra.local import runtime
        from infra.local.state import StateDir
        from tests.multiuser import shared_python_copy

        self.python_copy = shared_python_copy()
        self.python, self.pythonpath = self.python_copy.__enter__()
        os.environ["SKYFN_HOME"] = str(self.home)
        self.state = StateDir.at(self.home)
        self.echo(f"making {self.n_users} accounts")
        self.accounts = [self.accounts_made.user() for _ in range(self.n_users)]
        self.echo("starting the embedded runtime")
        self.runtime_up = True
        runtime.up(self.home, detach=True, endpoint=False, echo=lambda *_: None)
        self._write_multi_user()
        admin_token = runtime.mint_token(self.state, "site-admin", TOKEN_TTL)
        self.echo("starting the multi-user endpoint" + (" and the single-user endpoint" if self.single_user else ""))
        self._start(MU, self.home / "endpoints" / MU, sys.executable, {"SKYFN_TOKEN": admin_token}, cwd=ROOT)
        if self.single_user:
            self._write_single_user()
            self._start(SU, self.home / "endpoints" / SU, self.python,
                        {"SKYFN_TOKEN": self.token(0), "PYTHONPATH": self.pythonpath}, cwd=self.home)
        for name in self.procs:
            self._wait_running(name)
        admin = self.client_of("site-admin", None)
        admin.share("endpoints", self.endpoint_ids[MU], "all-users", "run")
        return self

    @property
    def service_url(self) -> str:
        return self.state.read_runtime()["service_url"]

    def endpoint_dir(self, name: str) -> Path:
        return self.home / "endpoints" / name

    def token(self, i: int) -> str:
        from infra.local import runtime

        return runtime.mint_token(self.state, f"user{i}-id", TOKEN_TTL, email=f"{self.accounts[i]}@{DOMAIN}")

    def client_of(self, user: str, email: str | None):
        from infra.local import runtime
        from skyfn import Client

        c = Client(service_url=self.service_url, token=runtime.mint_token(self.state, user, TOKEN_TTL, email=email))
        self.clients.append(c)
        return c

    def user_client(self, i: int):
        return self.client_of(f"user{i}-id", f"{self.accounts[i]}@{DOMAIN}")

    def _write_multi_user(self) -> None:
        import yaml

        from endpoint_agent.multiuser.configure import write_multi_user_files
        from endpoint_agent.paths import EndpointPaths
        from tests.multiuser import write_site_files

        paths = EndpointPaths(MU, root=self.home / "endpoints").ensure()
        write_multi_user_files(paths)
        config = yaml.safe_load(paths.config.read_text())
        config.update({"runtime_directory": str(self.runtime_dir / "{name}"), "user_agent_python": self.python,
                       **self.settings})
        paths.config.write_text(yaml.safe_dump(config))
        write_site_files(paths.dir, pythonpath=self.pythonpath, template=(
            "provider: local\n"
            f"workers: {{{{ workers | default({self.workers}) }}}}\n"
            "log_level: INFO\n"
            + ("data:\n  default: redis\n  redis:\n    start: true\n" if self.data_redis else "")))

    def _write_single_user(self) -> None:
        from endpoint_agent.paths import EndpointPaths

        paths = EndpointPaths(SU, root=self.home / "endpoints").ensure()
        paths.config.write_text(f"provider: local\nworkers: {self.workers}\nlog_level: INFO\n"
                                "data:\n  default: redis\n  redis:\n    start: true\n")

    def _start(self, name: str, directory: Path, python: str, env: dict, cwd: Path) -> None:
        env = {**os.environ, "SKYFN_HOME": str(self.home), "SKYFN_SERVICE_URL": self.service_url, **env}
        with open(directory / "agent-foreground.log", "ab") as log:
            self.procs[name] = subprocess.Popen([python, "-m", "endpoint_agent", "start", name, "--foreground"],
                                                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                                cwd=str(cwd), start_new_session=True)

    def _wait_running(self, name: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status(name)
            if status.get("state") == "running" and status.get("endpoint_id"):
                self.endpoint_ids[name] = status["endpoint_id"]
                return
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"endpoint {name} exited: {self.log_tail(name)}")
            time.sleep(0.1)
        raise RuntimeError(f"endpoint {name} did not start within {timeout:.0f} s: {self.log_tail(name)}")

    def status(self, name: str) -> dict:
        try:
            return json.loads((self.endpoint_dir(name) / "status.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def log_tail(self, name: str, n: int = 30) -> str:
        try:
            lines = (self.endpoint_dir(name) / "agent-foreground.log").read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def user_agent(self, account: str, timeout: float = 10.0) -> dict:
        """The status.json entry of the account's user agent (written within ~0.5 s of a change)."""
        deadline = time.monotonic() + timeout
        while True:
            for ua in self.status(MU).get("user_agents", []):
                if ua["account"] == account and ua.get("pid") and ua.get("alive"):
                    return ua
            if time.monotonic() > deadline:
                raise RuntimeError(f"no running user agent of {account} in {self.endpoint_dir(MU) / 'status.json'}")
            time.sleep(0.1)

    def save_logs(self, target: Path) -> None:
        target.mkdir(parents=True, exist_ok=True)
        for path in list(self.endpoint_dir(MU).glob("*.log")) + list(self.endpoint_dir(SU).glob("*.log")) + \
                list((self.endpoint_dir(MU) / "router" / "agents").glob("*.log")):
            shutil.copy(path, target / f"{path.parent.name}-{path.name}")
        self.echo(f"logs copied to {target}")

    # --- teardown ----------------------------------------------------------------------
    def close(self) -> None:
        """Everything made, in order; each step runs whatever the previous ones did."""
        from infra.local import runtime

        steps = [("clients", self._close_clients)]
        for name in (MU, SU):
            steps.append((f"endpoint {name}", lambda n=name: self._stop(n)))
        steps += [("leftover redis-servers", self._end_leftover_redis),
                  ("processes of the accounts", self._kill_account_processes)]
        if self.runtime_up:
            steps.append(("runtime", lambda: runtime.down(self.home, echo=lambda *_: None)))
        steps += [("accounts", self.accounts_made.remove_all),
                  ("directories", self._remove_directories)]
        if self.python_copy is not None:
            steps.append(("shared interpreter", lambda: self.python_copy.__exit__(None, None, None)))
        for what, step in steps:
            try:
                step()
            except BaseException as exc:  # noqa: BLE001 - clean up the rest whatever happens
                print(f"cleanup of {what} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        if self.old_home is None:
            os.environ.pop("SKYFN_HOME", None)
        else:
            os.environ["SKYFN_HOME"] = self.old_home

    def _remove_directories(self) -> None:
        for path in (self.runtime_dir, self.home):
            shutil.rmtree(path, ignore_errors=True)

    def _close_clients(self) -> None:
        for c in self.clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
        self.clients.clear()

    def _stop(self, name: str, timeout: float = 90.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            print(f"endpoint {name} did not stop within {timeout:.0f} s: killing it (pid {proc.pid})", file=sys.stderr)
            proc.kill()
            proc.wait(10)

    def _end_leftover_redis(self) -> None:
        """Redis servers a killed endpoint left: the router's (its record) and the single-user agent's data one."""
        from endpoint_agent.data.plane import end_leftover_redis
        from endpoint_agent.data.redis_process import end_redis, is_redis

        record = self.endpoint_dir(MU) / "router" / "redis.json"
        try:
            pid = json.loads(record.read_text()).get("pid")
        except (OSError, ValueError):
            pid = None
        if pid and is_redis(pid):
            end_redis(pid)
        end_leftover_redis(self.endpoint_dir(SU))

    def _kill_account_processes(self) -> None:
        """Whatever still runs as one of the accounts made here (user agents, their workers and
        data redis-servers after a hard stop): killed by pid."""
        import pwd

        import psutil

        uids = set()
        for name in self.accounts_made.made:
            try:
                uids.add(pwd.getpwnam(name).pw_uid)
            except KeyError:
                pass
        if not uids:
            return
        left = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real in uids]
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=10)
