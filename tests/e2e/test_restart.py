"""A full `skyfn local down` / `up` keeps what was accepted and what the API needs:
tasks queued while no agent ran are executed after the restart (Redis's append-only
file), and the task history, whose records had left Redis, is still served (moto's
DynamoDB saved by `down`, loaded by `up`: infra/local/snapshot.py)."""
from __future__ import annotations

import os
import time

import pytest
import redis
import yaml

from infra.local import agent, runtime
from infra.local.state import StateDir
from skyfn.protocol import pack_args


def cube(x):
    return x ** 3


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    cfg = home / "endpoints" / "local"
    cfg.mkdir(parents=True)
    (cfg / "config.yaml").write_text(yaml.safe_dump({"workers": 2, "heartbeat_period": 1, "lease_seconds": 5}))
    old = os.environ.get("SKYFN_HOME")
    os.environ["SKYFN_HOME"] = str(home)
    yield home
    runtime.down(home, echo=lambda *_: None)
    if old is None:
        os.environ.pop("SKYFN_HOME", None)
    else:
        os.environ["SKYFN_HOME"] = old


def _wait(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


@pytest.mark.timeout(300)
def test_down_and_up_keep_queued_tasks_and_the_history(home):
    from skyfn import Client, Executor

    runtime.up(home, detach=True, echo=lambda *_: None)
    with Executor(endpoint="local") as ex:
        done = ex.submit(cube, 3)
        assert done.result(timeout=60) == 27
    done_id = done.task_id
    r = redis.Redis.from_url(StateDir.at(home).read_runtime()["redis_url"])
    _wait(lambda: r.hget(f"t:{done_id}", "h") == b"1")  # written to the durable history

    agent.stop("local", home)
    with Client() as c:
        fid = c.register_function(cube)
        eid = c.endpoint_id("local")
        queued = c.submit_tasks([{"function_id": fid, "payload": pack_args((i,), {})} for i in range(20)], eid)
    r.close()

    runtime.down(home, echo=lambda *_: None)
    runtime.up(home, detach=True, echo=lambda *_: None)  # a new moto, loaded from the snapshot

    r = redis.Redis.from_url(StateDir.at(home).read_runtime()["redis_url"])
    r.delete(f"t:{done_id}")  # what the purge does once a retrieved result's time is up
    r.close()
    with Client() as c:
        assert [c.get_result(t, timeout=60) for t in queued] == [i ** 3 for i in range(20)]
        hist = c.get_task(done_id)  # from DynamoDB only now
        assert hist["state"] == "SUCCEEDED" and hist["function_id"] and hist["endpoint_id"] == eid
        assert c.get_function(fid)["name"].endswith("cube")
