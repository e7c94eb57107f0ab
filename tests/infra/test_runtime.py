"""`skyfn local up --detach | status | down | token` through the real CLI in a temporary
SKYFN_HOME: every process starts, status reports it, the endpoint comes online, down
stops every recorded pid, and Redis's append-only file stays."""
from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import redis as redis_lib
import requests

REPO = Path(__file__).resolve().parents[2]

_missing = [m for m in ("lambdas.api", "lambdas.results", "lambdas.bootstrap", "lambdas.auth", "endpoint_agent.cli")
            if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(_missing), reason=f"service or agent modules missing: {_missing}")


def skyfn(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, SKYFN_HOME=str(home), PYTHONPATH=str(REPO))
    env.pop("AWS_ENDPOINT_URL", None)
    return subprocess.run([sys.executable, "-m", "skyfn.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_up_status_down(tmp_path):
    home = tmp_path / "skyfn-home"
    try:
        r = skyfn(home, "local", "up", "--detach")
        assert r.returncode == 0, r.stderr + r.stdout
        assert "online" in r.stdout

        config_file = home / "config.json"
        assert stat.S_IMODE(config_file.stat().st_mode) == 0o600
        # the local issuer's private key and the Redis password are the owner's alone; the
        # service verifies with the public key set only (H9: security)
        assert stat.S_IMODE((home / "local" / "signing_key.pem").stat().st_mode) == 0o600
        assert stat.S_IMODE((home / "local" / "redis" / "redis.password").stat().st_mode) == 0o600
        assert json.loads((home / "local" / "jwks.json").read_text())["keys"][0]["kty"] == "EC"
        config = json.loads(config_file.read_text())
        assert config["service_url"].startswith("http://127.0.0.1:") and config["token"]

        r = skyfn(home, "local", "status", "--json")
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert report["healthy"] and report["service_url"] == config["service_url"]
        procs = report["processes"]
        for name in ("redis", "moto", "service", "agent"):
            assert procs[name]["alive"], (name, procs)
            assert psutil.pid_exists(procs[name]["pid"])
        assert procs["service"]["port"] == int(config["service_url"].rsplit(":", 1)[1])
        # the hot store runs with the parameters of the ElastiCache parameter group (infra/hot_store.py)
        hot = redis_lib.Redis.from_url(json.loads((home / "local" / "runtime.json").read_text())["redis_url"])
        assert hot.config_get("hash-max-listpack-value") == {"hash-max-listpack-value": "512"}
        assert hot.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert hot.config_get("maxmemory") == {"maxmemory": "0"}  # SKYFN_REDIS_MAXMEMORY unset: no limit
        hot.close()
        # the hot store's backlog gauge (lambdas/core/tasks/backlog.py), the embedded alarm
        assert report["backlog"]["warning"] is None and report["backlog"]["backlog_max"] == 1_000_000, report
        assert report["backlog"]["outbox"] >= 0 and report["backlog"]["task_records"] > 0
        text = skyfn(home, "local", "status")
        assert text.returncode == 0 and "  backlog  outbox " in text.stdout and "WARNING" not in text.stdout
        # moto stands in for AWS's managed services: it yields the task path's cores (nice +10)
        assert psutil.Process(procs["moto"]["pid"]).nice() == psutil.Process(procs["redis"]["pid"]).nice() + 10
        assert [(e["name"], e["status"]) for e in report["endpoints"]] == [("local", "online")]

        # the service answers the client's token; a token minted for another user works too
        auth = {"Authorization": f"Bearer {config['token']}"}
        assert requests.get(f"{config['service_url']}/endpoints", headers=auth, timeout=5).status_code == 200
        other = skyfn(home, "local", "token", "--user", "alice")
        assert other.returncode == 0 and other.stdout.count(".") == 2
        r = requests.get(f"{config['service_url']}/endpoints", timeout=5,
                         headers={"Authorization": f"Bearer {other.stdout.strip()}"})
        assert r.status_code == 200 and r.json()["endpoints"] == []  # alice owns no endpoint
        assert requests.get(f"{config['service_url']}/endpoints", timeout=5).status_code == 401

        again = skyfn(home, "local", "up", "--detach")
        assert again.returncode != 0 and "already running" in again.stderr
        assert len(again.stderr.strip().splitlines()) == 1

        pids = {name: p["pid"] for name, p in procs.items()}
        r = skyfn(home, "local", "down")
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not all(gone(p) for p in pids.values()):
            time.sleep(0.1)
        assert all(gone(p) for p in pids.values()), pids
        assert not list((home / "local").glob("*.pid"))
        assert list((home / "local" / "redis").rglob("*.aof"))  # task data survives a restart

        r = skyfn(home, "local", "status")
        assert r.returncode != 0 and "not running" in r.stdout
        assert "not running" in skyfn(home, "local", "down").stdout
    finally:
        skyfn(home, "local", "down")


def test_token_without_runtime_is_one_clear_error(tmp_path):
    r = skyfn(tmp_path / "empty", "local", "token", "--user", "bob")
    assert r.returncode == 1
    assert r.stderr.strip() == f"error: no local runtime in {tmp_path / 'empty' / 'local'}: run `skyfn local up` first"


def test_taken_port_is_one_clear_error(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = skyfn(tmp_path / "h", "local", "up", "--detach", "--port", str(s.getsockname()[1]), timeout=60)
    assert r.returncode == 1 and "is taken" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not list((tmp_path / "h" / "local").glob("*.pid"))  # what was started is stopped again
