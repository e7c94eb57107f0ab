"""A fleet host (endpoint_agent.fleet.FleetHost) of 20 light agents in the test's process,
against the embedded runtime: each registers as its own endpoint with its own credential
and goes online by its heartbeats; tasks sent to several of them resolve; an agent stopped
goes offline, and started again it connects with its kept credential (the same endpoint,
no new registration) and is online and running tasks again. Then the command-line host
(`python -m endpoint_agent.fleet`): started, told on stdin to stop and start an agent,
SIGKILLed, and started again with the same --home: the same endpoints come back."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from endpoint_agent.fleet import FleetHost
from tests.fleet import fns
from tests.fleet.conftest import statuses, wait_for

ROOT = Path(__file__).resolve().parents[2]
FAST = {"heartbeat_period": 2, "receive_wait": 1, "lease_seconds": 10, "grace_period": 5}


@pytest.mark.timeout(120)
def test_fleet_of_20_registers_runs_and_restarts_agents(fleet_home, client, tmp_path):
    host = FleetHost(20, tmp_path / "fleet", prefix="f20", config=FAST, threads=4, concurrency=4)
    try:
        ids = host.start(timeout=90)
        assert not host.errors and len(ids) == 20 and len(set(ids.values())) == 20
        assert sorted(ids) == host.names
        wait_for(lambda: list(statuses(client, ids.values()).values()).count("online") == 20, "20 endpoints online")
        # tasks routed to several endpoints of the fleet resolve there
        fid = client.register_function(fns.add)
        some = [ids[n] for n in host.names[::4]]
        tasks = {client.run(fid, i, 100, endpoint_id=ep): i for i, ep in enumerate(some)}
        assert {client.get_result(t, timeout=60) for t in tasks} == {i + 100 for i in tasks.values()}
        # one agent stopped: offline; started again: the same endpoint with the same credential
        name = host.names[3]
        cred_file = host.paths(name).credential
        cred = cred_file.read_text()
        host.stop_agent(name)
        assert name not in host.running()
        wait_for(lambda: statuses(client, [ids[name]]).get(ids[name]) == "offline", "the stopped agent offline")
        assert host.start_agent(name, timeout=60) == ids[name]
        assert cred_file.read_text() == cred
        wait_for(lambda: statuses(client, [ids[name]]).get(ids[name]) == "online", "the restarted agent online")
        assert client.get_result(client.run(fid, 1, 2, endpoint_id=ids[name]), timeout=60) == 3
        assert len([e for e in client.list_endpoints() if e["name"] == name]) == 1
    finally:
        host.stop(timeout=60)


def _line(proc) -> dict:
    line = proc.stdout.readline()
    assert line, "the fleet host closed its stdout"
    return json.loads(line)


@pytest.mark.timeout(120)
def test_fleet_command_line_stop_start_and_sigkill(fleet_home, client, tmp_path):
    home = tmp_path / "cli-fleet"
    cmd = [sys.executable, "-m", "endpoint_agent.fleet", "--count", "4", "--home", str(home), "--prefix", "fc",
           "--threads", "2", "--heartbeat-period", "2", "--receive-wait", "1"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # service URL and token: SKYFN_HOME's client config
    log = open(tmp_path / "fleet.log", "ab")
    proc = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=log, text=True)
    again = None
    try:
        ready = _line(proc)
        assert ready["event"] == "ready" and not ready["failed"] and len(ready["endpoints"]) == 4
        ids = ready["endpoints"]
        proc.stdin.write("stop fc-0001\n")
        proc.stdin.flush()
        assert _line(proc) == {"event": "stopped", "name": "fc-0001"}
        proc.stdin.write("start fc-0001\n")
        proc.stdin.flush()
        assert _line(proc) == {"event": "started", "name": "fc-0001", "endpoint_id": ids["fc-0001"]}
        proc.kill()  # the churn test's way: no clean-up at all
        proc.wait(10)
        assert json.loads((home / "fleet.json").read_text())["endpoints"] == ids
        again = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=log, text=True)
        assert _line(again)["endpoints"] == ids  # the same endpoints, connected with their credentials
        wait_for(lambda: list(statuses(client, ids.values()).values()).count("online") == 4, "4 endpoints online")
        fid = client.register_function(fns.add)
        assert client.get_result(client.run(fid, 2, 3, endpoint_id=ids["fc-0002"]), timeout=60) == 5
        again.send_signal(signal.SIGTERM)
        assert again.wait(30) == 0
    except AssertionError as exc:
        log.flush()
        raise AssertionError(f"{exc}\n--- the fleet host's log:\n{(tmp_path / 'fleet.log').read_text()[-3000:]}") from None
    finally:
        for p in (proc, again):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
        log.close()
