"""Globus staging end to end: the embedded runtime (`skyfn local up --detach` in a private
SKYFN_HOME) with an endpoint whose config.yaml has `data: globus:`, its agent driving
globus-sdk's TransferClient against the local Transfer stand-in. A 100 MB numpy array goes
A -> B through Globus (a producer's declared output staged out to collection B, a
consumer's GlobusFile input staged in from B), 200 inputs become 2 Transfer tasks, and a
missing path fails its task with Globus's message."""
from __future__ import annotations

import hashlib
import json
import os
import time

import numpy as np
import pytest
import yaml

from infra.local.standins.globus_transfer.server import TransferStandIn
from skyfn import Client, Executor
from skyfn.data import GlobusFile
from skyfn.data.globus_config import TRANSFER_RS, save_tokens
from skyfn.protocol import TaskFailed

A = "aaaaaaaa-1111-4111-8111-00000000000a"
B = "bbbbbbbb-2222-4222-8222-00000000000b"
E = "eeeeeeee-3333-4333-8333-00000000000e"   # the endpoint's collection
TOKEN = "e2e-transfer-token"
N = 100 * 1024 * 1024 // 8


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from infra.local import runtime

    base = tmp_path_factory.mktemp("globus-e2e")
    dirs = {cid: base / name for cid, name in ((A, "a"), (B, "b"), (E, "endpoint"))}
    standin = TransferStandIn(dirs, tokens={TOKEN}).start()
    home = base / "home"
    cfg = home / "endpoints" / "local"
    cfg.mkdir(parents=True)
    save_tokens(cfg / "globus_tokens.json", {TRANSFER_RS: {"access_token": TOKEN}})
    (cfg / "config.yaml").write_text(yaml.safe_dump({
        "workers": 2, "heartbeat_period": 1, "grace_period": 5,
        "data": {"globus": {"collection": E, "root": str(dirs[E]), "transfer_url": standin.url, "batch_size": 100,
                            "max_concurrent_transfers": 2, "batch_wait": 1.0, "poll_min": 0.05, "poll_max": 0.5}},
    }))
    old = os.environ.get("SKYFN_HOME")
    os.environ["SKYFN_HOME"] = str(home)
    runtime.up(home, detach=True, echo=lambda *_: None)
    try:
        with Client() as client:
            yield {"client": client, "dirs": dirs, "standin": standin, "home": home}
    finally:
        runtime.down(home, echo=lambda *_: None)
        standin.stop()
        if old is None:
            os.environ.pop("SKYFN_HOME", None)
        else:
            os.environ["SKYFN_HOME"] = old


def produce(seed, n, out):
    import numpy as np

    np.save(out, np.random.default_rng(seed).random(n))   # `out` is the local path of the declared output
    return os.fspath(out)


def consume(data):
    import hashlib

    import numpy as np

    x = np.load(data)
    return hashlib.sha256(x.tobytes()).hexdigest(), x.shape, float(x[:1000].sum())


def read_text(f):
    with open(f) as fh:
        return fh.read()


def events(client, tid):
    return [e[0] for e in client.get_task(tid)["events"]]


def order(events, *names):
    last = [max(i for i, e in enumerate(events) if e == n) for n in names]
    return last == sorted(last)


def test_a_100mb_array_goes_a_to_b_through_globus(site):
    client, dirs = site["client"], site["dirs"]
    expected = np.random.default_rng(11).random(N)
    with Executor(endpoint="local", client=client) as ex:
        made = ex.submit(produce, 11, N, GlobusFile(B, "/shared/array.npy", output=True))
        local_out = made.result(timeout=180)
        assert local_out == str(dirs[E] / ".skyfn-staging" / "out" / B / "shared" / "array.npy")
        on_b = np.load(dirs[B] / "shared" / "array.npy")        # staged out to collection B
        assert np.array_equal(on_b, expected)
        used = ex.submit(consume, GlobusFile(B, "/shared/array.npy"))
        digest, shape, head = used.result(timeout=180)
    assert digest == hashlib.sha256(expected.tobytes()).hexdigest()
    assert shape == (N,) and head == float(expected[:1000].sum())
    ev_out, ev_in = events(client, made.task_id), events(client, used.task_id)
    # the agent's events, in order (a RUNNING update may also have been recorded as it happened)
    assert order(ev_out, "DONE", "STAGING_OUT", "STAGED_OUT", "SUCCEEDED")
    assert order(ev_in, "DISPATCHED", "STAGING_IN", "STAGED_IN", "RUNNING", "DONE", "SUCCEEDED")
    copies = site["standin"].log.transfer_tasks(B, E)
    assert copies[-1]["items"] == 1 and copies[-1]["status"] == "SUCCEEDED"


def test_200_inputs_become_two_transfer_tasks_within_the_bound(site):
    client, dirs, standin = site["client"], site["dirs"], site["standin"]
    (dirs[A] / "many").mkdir()
    for i in range(200):
        (dirs[A] / "many" / f"{i}.txt").write_text(f"item {i}")
    standin.log.reset()
    with Executor(endpoint="local", client=client) as ex:
        got = list(ex.map(read_text, [GlobusFile(A, f"/many/{i}.txt") for i in range(200)], timeout=180))
    assert got == [f"item {i}" for i in range(200)]
    tasks = standin.log.transfer_tasks(A, E)
    assert len(tasks) == 2 and sorted(t["items"] for t in tasks) == [100, 100]
    assert standin.log.max_active <= 2
    status = site["home"] / "endpoints" / "local" / "status.json"   # `skyfn-endpoint status local --json`
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        globus = json.loads(status.read_text()).get("globus") or {}
        if globus.get("items_moved", 0) >= 200:
            break
        time.sleep(0.2)
    assert globus["transfers_submitted"] >= 2 and globus["max_active_transfers"] <= 2 and globus["jobs"] == 0


def test_a_missing_path_fails_the_task_with_globus_message(site):
    client = site["client"]
    with Executor(endpoint="local", client=client) as ex:
        fut = ex.submit(consume, GlobusFile(A, "/no/such/run.npy"))
        with pytest.raises(TaskFailed) as info:
            fut.result(timeout=120)
    msg = str(info.value)
    assert "stage-in failed" in msg and "FILE_NOT_FOUND: No such file or directory" in msg
    assert f"globus://{A}/no/such/run.npy" in msg
    ev = events(client, fut.task_id)
    assert "STAGING_IN" in ev and "RUNNING" not in ev and ev[-2:] == ["FAILED", "STORED"]


def test_cancel_while_staging_in_and_the_endpoint_keeps_working(site):
    client, dirs, standin = site["client"], site["dirs"], site["standin"]
    (dirs[A] / "slow.txt").write_text("slow")
    fid = client.register_function(read_text)
    standin.copy_delay = 3.0
    try:
        tid = client.run(fid, GlobusFile(A, "/slow.txt"), endpoint_id=client.endpoint_id("local"))
        time.sleep(1.5)                                        # held in STAGING_IN: the copy takes 3 s
        assert client.get_task(tid)["state"] in ("QUEUED", "DISPATCHED")
        assert client.cancel(tid)
        assert client.get_task(tid)["state"] == "CANCELLED"
    finally:
        standin.copy_delay = 0.0
    assert standin.wait_idle(30)
    again = client.run(fid, GlobusFile(A, "/slow.txt"), endpoint_id=client.endpoint_id("local"))
    assert client.get_result(again, timeout=60) == "slow"
