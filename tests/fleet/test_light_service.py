"""The light agent (engine: inline) through the embedded runtime, started as any agent is
(`skyfn-endpoint start NAME --foreground`): it registers, keeps its credential, goes online
by its heartbeats, and its tasks -- run in its own process, no manager or worker -- come
back through the service: results, the function's exception, captured output. The service
takes a result pack only sealed with the endpoint's results key (the results stream is
shared; skyfn.protocol.result_seal), so every result seen here came sealed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from skyfn import Executor
from tests.fleet import fns
from tests.fleet.conftest import statuses, wait_for

ROOT = Path(__file__).resolve().parents[2]
NAME = "light"


@pytest.fixture
def light_agent(fleet_home, client):
    cfg = fleet_home / "endpoints" / NAME
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "config.yaml").write_text(yaml.safe_dump({"engine": {"type": "inline", "threads": 2},
                                                     "heartbeat_period": 1, "lease_seconds": 10}))
    log = open(cfg / "test.log", "ab")
    env = dict(os.environ, SKYFN_HOME=str(fleet_home), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "endpoint_agent", "start", NAME, "--foreground"],
                            cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        ep = wait_for(lambda: [e["endpoint_id"] for e in client.list_endpoints()
                               if e["name"] == NAME and e["status"] == "online"]
                      or (proc.poll() is not None and pytest.fail((cfg / "test.log").read_text()[-2000:])),
                      "the light agent online")[0]
        yield {"proc": proc, "endpoint_id": ep, "dir": cfg}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        log.close()


@pytest.mark.timeout(120)
def test_light_agent_runs_tasks_through_the_service(client, light_agent):
    ep, proc = light_agent["endpoint_id"], light_agent["proc"]
    assert (light_agent["dir"] / "credential").exists()  # it speaks as its endpoint
    status = yaml.safe_load((light_agent["dir"] / "status.json").read_text())
    assert status["engine"] == "inline" and status["pid"] == proc.pid and "worker_pids" not in status
    with Executor(endpoint=NAME) as ex:
        assert list(ex.map(fns.add, range(40), range(40))) == [2 * i for i in range(40)]
        with pytest.raises(ValueError, match="bad value 3"):
            ex.submit(fns.fail, 3).result(timeout=60)
    fid = client.register_function(fns.shout)
    tid = client.run(fid, 21, endpoint_id=ep)
    assert client.get_result(tid, timeout=60) == 42
    task = client.status([tid])["tasks"][tid]
    assert task["state"] == "SUCCEEDED" and "value 21" in (task.get("stdout") or "")
    # a graceful stop: exit 0, and the service sees the endpoint go offline
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    wait_for(lambda: statuses(client, [ep]).get(ep) == "offline", "the stopped light agent offline")
