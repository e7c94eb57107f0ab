"""`skyfn-endpoint` as a user runs it: configure, start (daemonized), status, list, stop,
a second start refused, start after stop, a stale pid file after SIGKILL."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import re
import time

import yaml

from skyfn.protocol.serialize import deserialize
from tests.agent import fns
from tests.agent.conftest import ROOT


def cli(home, *args, timeout=60):
    env = dict(os.environ, SKYFN_HOME=str(home), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "endpoint_agent", *args], cwd=str(ROOT), env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


def _gone(pid, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_configure_refuses_overwrite(home):
    r = cli(home, "list")
    assert r.returncode == 0 and "no endpoints configured" in r.stdout
    r = cli(home, "configure", "alpha")
    assert r.returncode == 0, r.stderr
    cfg = home / "endpoints" / "alpha" / "config.yaml"
    assert cfg.exists() and "# skyfn endpoint" in cfg.read_text()
    cfg.write_text("workers: 1\n")
    r = cli(home, "configure", "alpha")
    assert r.returncode == 1 and "--force" in r.stderr
    assert cfg.read_text() == "workers: 1\n"
    assert cli(home, "configure", "alpha", "--force").returncode == 0
    assert "# skyfn endpoint" in cfg.read_text()
    r = cli(home, "configure", "bad/name")
    assert r.returncode == 2 and "invalid endpoint name" in r.stderr


def test_start_without_config_writes_default_and_explains(home):
    r = cli(home, "start", "fresh")
    assert (home / "endpoints" / "fresh" / "config.yaml").exists()
    assert "wrote the default" in r.stderr
    # no service configured anywhere: the agent says what to set
    assert r.returncode == 2 and "no service URL" in r.stderr, (r.stdout, r.stderr)


def test_bad_config_refused_at_start(home):
    d = home / "endpoints" / "broken"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text("workers: lots\n")
    r = cli(home, "start", "broken")
    assert r.returncode == 2 and "key 'workers'" in r.stderr and "'lots'" in r.stderr


def test_start_status_list_stop_cycle(home, queues):
    d = home / "endpoints" / "svc"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({
        "workers": 1, "endpoint_id": "ep", "task_queue": queues.task_desc, "results_queue": queues.results_desc,
        "receive_wait": 0.5, "grace_period": 5}))
    r = cli(home, "start", "svc")
    assert r.returncode == 0 and "started endpoint svc" in r.stdout, (r.stdout, r.stderr)
    pid = int((d / "agent.pid").read_text())

    r = cli(home, "start", "svc")
    assert r.returncode == 1 and "already running" in r.stderr and str(pid) in r.stderr

    ids = queues.push(fns.square, [(5,)])
    assert deserialize(queues.collect(ids, timeout=20)[ids[0]][0]["result"]) == 25

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = cli(home, "status", "svc")
        if "completed    1" in r.stdout:
            break
        time.sleep(0.3)
    assert r.returncode == 0 and f"running (pid {pid})" in r.stdout and "endpoint_id  ep" in r.stdout, r.stdout
    # blocks, managers, workers and queue depth
    assert "queue depth" in r.stdout and "BLOCK" in r.stdout and "MANAGER" in r.stdout, r.stdout
    assert re.search(r"^\s+local\s+1\s+1\s+", r.stdout, re.M), r.stdout
    r = cli(home, "list")
    assert "svc" in r.stdout and "running" in r.stdout and str(pid) in r.stdout

    r = cli(home, "stop", "svc")
    assert r.returncode == 0 and "stopped" in r.stdout
    assert _gone(pid)
    assert not (d / "agent.pid").exists()
    assert "stopped" in cli(home, "status", "svc").stdout
    assert "stopped" in cli(home, "list").stdout
    assert "not running" in cli(home, "stop", "svc").stdout

    # start after stop
    r = cli(home, "start", "svc")
    assert r.returncode == 0, r.stderr
    pid2 = int((d / "agent.pid").read_text())
    assert pid2 != pid
    ids = queues.push(fns.square, [(6,)], prefix="again")
    assert deserialize(queues.collect(ids, timeout=20)[ids[0]][0]["result"]) == 36

    # SIGKILL leaves a stale pid file: status says stopped, start replaces it
    os.kill(pid2, signal.SIGKILL)
    assert _gone(pid2)
    assert (d / "agent.pid").exists()
    assert "stopped" in cli(home, "status", "svc").stdout
    r = cli(home, "start", "svc")
    assert r.returncode == 0, r.stderr
    pid3 = int((d / "agent.pid").read_text())
    assert pid3 not in (pid, pid2)
    assert cli(home, "stop", "svc").returncode == 0
    assert _gone(pid3)
    assert "starting endpoint svc" in (d / "agent.log").read_text()
