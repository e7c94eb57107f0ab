"""Endpoint allowlists through the embedded runtime: a second endpoint whose agent (a real
`skyfn-endpoint start` process) lists one function in `allowed_functions`. Its agent
reports the list when it registers; from then on the service refuses any other function
with 403; tasks that were queued before (the service check bypassed) reach the agent and
end FAILED with "function not allowed on this endpoint", their arguments never unpickled;
the listed function runs."""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import yaml

from skyfn import Client, Executor, TaskFailed
from skyfn.http import SkyfnAPIError
from tests.e2e import processes

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAME = "locked"


def allowed(x):
    return x + 1


def unlisted(x):
    return x


class Touch:
    """An argument whose unpickling creates a file: shows whether it was deserialized."""

    def __init__(self, path: pathlib.Path):
        self.path = path

    def __reduce__(self):
        return pathlib.Path.touch, (self.path,)


@pytest.fixture
def locked_agent(local_home, client):
    fid_ok, fid_no = client.register_function(allowed), client.register_function(unlisted)
    # the endpoint exists, with no list yet, before its agent ever runs
    ep = client._http.post("/endpoints", {"name": NAME, "metadata": {}})["endpoint_id"]
    cfg = local_home / "endpoints" / NAME
    cfg.mkdir(parents=True, exist_ok=True)
    # by id, and by owner and name (the Executor registers its own copy of a function)
    entries = [fid_ok, {"owner": client.whoami(), "name": "allowed"}]
    (cfg / "config.yaml").write_text(yaml.safe_dump({"workers": 1, "heartbeat_period": 1,
                                                     "allowed_functions": entries}))
    state = {"fid_ok": fid_ok, "fid_no": fid_no, "endpoint_id": ep, "proc": None, "log": cfg / "test.log",
             "config": cfg / "config.yaml"}

    def start():
        env = dict(os.environ, SKYFN_HOME=str(local_home), PYTHONPATH=str(ROOT))
        state["logf"] = open(state["log"], "ab")
        state["proc"] = subprocess.Popen([sys.executable, "-m", "endpoint_agent", "start", NAME, "--foreground"],
                                         cwd=str(ROOT), env=env, stdout=state["logf"], stderr=subprocess.STDOUT)

    def stop():
        state["proc"].send_signal(signal.SIGTERM)
        assert state["proc"].wait(30) == 0
        state["logf"].close()

    state["start"], state["stop"] = start, stop
    yield state
    if state["proc"] is not None:
        processes.stop(state["proc"])
    if "logf" in state and not state["logf"].closed:
        state["logf"].close()


def test_allowlist_end_to_end(client, locked_agent, tmp_path):
    ep, fid_ok, fid_no = locked_agent["endpoint_id"], locked_agent["fid_ok"], locked_agent["fid_no"]
    marker = tmp_path / "unlisted-argument-was-unpickled"
    # queued while the service knew no list: these get past the service's check
    early_no = client.run(fid_no, Touch(marker), endpoint_id=ep)
    early_ok = client.run(fid_ok, 1, endpoint_id=ep)

    locked_agent["start"]()
    assert client.get_result(early_ok, timeout=60) == 2
    with pytest.raises(TaskFailed) as info:
        client.get_result(early_no, timeout=60)
    assert "function not allowed on this endpoint" in str(info.value)
    assert not marker.exists()
    task = client.get_task(early_no)
    assert task["state"] == "FAILED" and "RUNNING" not in [e[0] for e in task["events"]]

    # the agent reported its list when it registered: the service now refuses at submission
    with pytest.raises(SkyfnAPIError) as refused:
        client.run(fid_no, 1, endpoint_id=ep)
    err = refused.value
    assert err.status == 403 and ep in err.message and f"({NAME})" in err.message and fid_no in err.message
    assert err.message.startswith("function not allowed on this endpoint")

    # listed by owner and name: the Executor's own registration of it runs; an unlisted one does not
    with Executor(endpoint=NAME) as ex:
        assert list(ex.map(allowed, [10, 20])) == [11, 21]
        with pytest.raises(SkyfnAPIError) as refused:
            ex.submit(unlisted, 1).result(timeout=60)
    assert refused.value.status == 403

    # the owner lists the function and restarts the agent: it connects with its kept credential
    # (no registration) and reports the new list before taking tasks; the service follows it
    assert (local_home_of(locked_agent) / "credential").exists()
    locked_agent["stop"]()
    cfg = yaml.safe_load(locked_agent["config"].read_text())
    cfg["allowed_functions"].append(fid_no)
    locked_agent["config"].write_text(yaml.safe_dump(cfg))
    locked_agent["start"]()
    deadline = time.monotonic() + 30
    while True:
        try:
            tid = client.run(fid_no, 5, endpoint_id=ep)
            break
        except SkyfnAPIError as exc:  # 403 until the restarted agent has reported
            assert exc.status == 403 and time.monotonic() < deadline, exc
            time.sleep(0.2)
    assert client.get_result(tid, timeout=60) == 5
    log = locked_agent["log"].read_text()
    assert "connected as endpoint" in log  # the second start used the kept credential, no registration
    assert "registering endpoint" not in log.split("connected as endpoint")[-1]


def local_home_of(state) -> pathlib.Path:
    return state["config"].parent
