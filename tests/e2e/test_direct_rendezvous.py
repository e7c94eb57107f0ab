"""A direct session through the embedded runtime's rendezvous server (issue 40), end to end:
an agent with `direct: {reach: rendezvous}` opens no port, gets its LISTEN ticket from the
service and LISTENs; the Executor's session gets a path ticket with its token, reaches the
agent through the rendezvous server (here on one machine: punched) and every task is also
recorded by the service. The NAT lab (tests/comm/test_direct_nat.py) covers real NATs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e import processes

ROOT = Path(__file__).resolve().parents[2]
NAME = "behind-nat"


def square(x):
    return x * x


@pytest.fixture
def nat_agent(local_home, client):
    ep = client._http.post("/endpoints", {"name": NAME, "metadata": {}})["endpoint_id"]
    cfg = local_home / "endpoints" / NAME
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "config.yaml").write_text(yaml.safe_dump({"workers": 2, "heartbeat_period": 1,
                                                     "direct": {"reach": "rendezvous"}}))
    env = dict(os.environ, SKYFN_HOME=str(local_home), PYTHONPATH=str(ROOT))
    log = open(cfg / "test.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "endpoint_agent", "start", NAME, "--foreground"], cwd=str(ROOT),
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    status = cfg / "status.json"
    deadline = time.monotonic() + 60
    while True:  # listening at the rendezvous server (the agent's own stats say so)
        try:
            if json.loads(status.read_text())["direct"]["rendezvous"]["listening"]:
                break
        except (OSError, ValueError, KeyError, TypeError):
            pass
        assert proc.poll() is None and time.monotonic() < deadline, (cfg / "test.log").read_text()[-3000:]
        time.sleep(0.1)
    yield ep
    processes.stop(proc)
    log.close()


def test_a_session_reaches_an_agent_without_a_port_through_the_rendezvous_server(client, nat_agent):
    from skyfn import Executor

    fid = client.register_function(square)
    opened = client.open_session(nat_agent, [fid])
    assert opened["address"] is None and opened["rendezvous"]["name"] == f"direct.{nat_agent}"
    with Executor(endpoint_id=nat_agent, client=client, direct=True) as ex:
        futures = [ex.submit(square, i) for i in range(200)]
        assert [f.result(timeout=120) for f in futures] == [i * i for i in range(200)]
        stats, path = ex.direct_stats, ex.direct_path
    assert path == "punched" and stats["punched"] == 1 and stats["to_service"] == 0, stats
    assert stats["results"] == 200
    ids = [f.task_id for f in futures[:5]]
    deadline = time.monotonic() + 30
    while True:  # the agent reported them: the service recorded each
        st = client.status(ids)["tasks"]
        if all(st.get(t, {}).get("state") == "SUCCEEDED" for t in ids) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [st[t]["state"] for t in ids] == ["SUCCEEDED"] * 5
