"""Helpers of the endpoint-agent suite: a private SKYFN_HOME, task packs pushed into a
real Redis stream, a real agent process (`python -m endpoint_agent start NAME
--foreground`) configured with its queues directly (no service), and a results reader."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import orjson
import pytest
import yaml

from skyfn.protocol.messages import ResultPack, TaskPack, TaskSpec
from skyfn.protocol.queues import open_queue
from skyfn.protocol.serialize import pack_args, serialize_function

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "skyfn-home"
    h.mkdir()
    monkeypatch.setenv("SKYFN_HOME", str(h))
    for var in ("SKYFN_SERVICE_URL", "SKYFN_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    return h


class Queues:
    """The service's side of an endpoint's two streams."""

    def __init__(self, redis_url: str, unique: str, lease: float = 60.0):
        self.url = redis_url
        self.task_desc = {"kind": "redis", "name": f"tasks-{unique}", "url": redis_url}
        self.results_desc = {"kind": "redis", "name": f"results-{unique}", "url": redis_url}
        self.control_desc = {"kind": "redis", "name": f"control-{unique}", "url": redis_url}
        self.tasks = open_queue(self.task_desc, consumer="service", visibility_timeout=lease)
        self.tasks.ensure()
        self.results = open_queue(self.results_desc, consumer="service", visibility_timeout=30)
        self.results.ensure()
        self.control = open_queue(self.control_desc, consumer="service", visibility_timeout=30)
        self.control.ensure()
        self.by_task: dict[str, list[dict]] = {}
        self.updates: list[dict] = []
        self.packs_sent: dict[str, list[str]] = {}  # message id -> task ids

    def push(self, fn: Callable | None, calls: list[tuple], **kw) -> list[str]:
        ids, bodies, groups = self.build(fn, calls, **kw)
        self.send(bodies, groups)
        return ids

    def send(self, bodies: list[bytes], groups: list[list[str]]) -> None:
        for mid, group in zip(self.tasks.send(bodies), groups):
            self.packs_sent[mid] = group

    def build(self, fn: Callable | None, calls: list[tuple], *, prefix: str = "t", pack_size: int = 512,
              function_body: str | None = None, function_id: str = "f1", walltime: float | None = None,
              functions: dict[str, str] | None = None, container: str | None = None,
              resources: dict[str, int] | None = None) -> tuple[list[str], list[bytes], list[list[str]]]:
        if functions is None:
            functions = {function_id: function_body if function_body is not None else serialize_function(fn)}
        fns = functions
        ids, bodies, groups = [], [], []
        for start in range(0, len(calls), pack_size):
            specs = []
            for i, args in enumerate(calls[start:start + pack_size], start):
                tid = f"{prefix}{i}"
                ids.append(tid)
                specs.append(TaskSpec(task_id=tid, function_id=function_id, payload=pack_args(args, {}),
                                      walltime=walltime, container=container, resources=resources))
            pack = TaskPack(pack_id=f"{prefix}-pack{start}", endpoint_id="ep", functions=fns, tasks=specs)
            bodies.append(pack.model_dump_json().encode())
            groups.append([s.task_id for s in specs])
        return ids, bodies, groups

    def collect(self, task_ids: list[str], timeout: float = 30.0) -> dict[str, list[dict]]:
        """Read ResultPacks (validated with the protocol model) until every id has a result."""
        want = set(task_ids)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not want <= self.by_task.keys():
            self.drain(wait=0.2)
        missing = want - self.by_task.keys()
        assert not missing, f"{len(missing)} task(s) without a result after {timeout} s, e.g. {sorted(missing)[:5]}"
        return {t: self.by_task[t] for t in task_ids}

    def wait_running(self, task_ids: list[str], timeout: float = 20.0) -> None:
        """Until the agent reported RUNNING (a task running > 0.5 s) for every id."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if set(task_ids) <= {u["task_id"] for u in self.updates if u["state"] == "RUNNING"}:
                return
            self.drain(wait=0.1)
        raise AssertionError(f"no RUNNING update for some of {task_ids}")

    def drain(self, wait: float = 0.0) -> int:
        n = 0
        for m in self.results.receive(max_messages=100, wait_seconds=wait):
            ResultPack.model_validate_json(m.body)  # the wire shape is the protocol model
            pack = orjson.loads(m.body)
            assert pack["endpoint_id"] == "ep"
            for r in pack["results"]:
                self.by_task.setdefault(r["task_id"], []).append(r)
                n += 1
            self.updates.extend(pack["updates"])
            self.results.delete([m.receipt])
        return n

    def cancel(self, task_ids: list[str]) -> None:
        """What the service does on DELETE /tasks/{id}: a ControlMessage on the control queue."""
        self.control.send([orjson.dumps({"cancel": list(task_ids)})])

    def remaining_ids(self) -> set[str]:
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            return {e[0].decode() for e in client.xrange(self.task_desc["name"])}
        finally:
            client.close()

    def leases(self) -> int:
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            return client.zcard(f"{self.task_desc['name']}:leases")
        finally:
            client.close()


@pytest.fixture
def queues(redis_url, unique):
    q = Queues(redis_url, unique)
    yield q
    q.tasks.close()
    q.results.close()
    q.control.close()


class AgentProc:
    """A real agent process for endpoint `name`, started through the CLI in the foreground."""

    def __init__(self, home: Path, name: str, config: dict[str, Any]):
        self.home = home
        self.name = name
        self.dir = home / "endpoints" / name
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.yaml").write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen | None = None
        self.log = self.dir / "test-agent.log"

    def start(self, wait_workers: int | None = None) -> "AgentProc":
        env = dict(os.environ, SKYFN_HOME=str(self.home), PYTHONPATH=str(ROOT))
        self.logf = open(self.log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "endpoint_agent", "start", self.name, "--foreground"],
                                     cwd=str(ROOT), env=env, stdout=self.logf, stderr=subprocess.STDOUT)
        if wait_workers:
            self.wait_status(lambda s: s.get("state") == "running" and len(s.get("worker_pids") or []) >= wait_workers
                             and s.get("pid") == self.proc.pid)
        return self

    def status(self) -> dict:
        try:
            return orjson.loads((self.dir / "status.json").read_bytes())
        except (OSError, ValueError):
            return {}

    def wait_status(self, pred: Callable[[dict], bool], timeout: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status()
            if st and pred(st):
                return st
            assert self.proc is None or self.proc.poll() is None, f"agent exited: {self.tail()}"
            time.sleep(0.05)
        raise AssertionError(f"status never matched; last {self.status()}; log: {self.tail()}")

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.logf.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.logf.close()


@pytest.fixture
def agent_factory(home, queues):
    started: list[AgentProc] = []

    def make(name: str = "ep", **config) -> AgentProc:
        cfg = {"workers": 2, "endpoint_id": "ep", "task_queue": queues.task_desc,
               "results_queue": queues.results_desc, "control_queue": queues.control_desc,
               "receive_wait": 0.5, "log_level": "INFO"}
        cfg.update(config)
        a = AgentProc(home, name, cfg)
        started.append(a)
        return a

    yield make
    for a in started:
        if a.proc is not None and a.proc.poll() is None:
            a.proc.kill()
            a.proc.wait(10)


@pytest.fixture(scope="module")
def shared_python():
    """(python_path, pythonpath_env_value) for processes started as test accounts (issue 23):
    /usr/bin/python3 and a PYTHONPATH of hard-linked copies of the repository's packages and the
    venv's site-packages in a fresh 0755 directory, removed after the module (tests/multiuser.py).
    Skips when the system's python is missing or another minor version than the venv's."""
    from tests.multiuser import shared_python_copy, system_python_problem

    problem = system_python_problem()
    if problem:
        pytest.skip(problem)
    with shared_python_copy() as pair:
        yield pair
