"""One task, a batch, an exception, a cancel, and the Executor, all the way through the
embedded runtime: SDK -> gateway -> API Lambda -> Redis stream -> agent -> manager ->
worker -> results queue -> results Lambda -> SDK."""
from __future__ import annotations

import time
from concurrent.futures import as_completed, wait

import pytest

from skyfn import Executor
from skyfn.protocol import TaskCancelled
from skyfn.protocol.states import stage_latencies


def square(x):
    return x * x


def explode(msg):
    raise KeyError(msg)


def nap(seconds):
    import time as _t

    _t.sleep(seconds)
    return seconds


def test_single_task_round_trip_with_events(client, endpoint_id):
    fid = client.register_function(square)
    tid = client.run(fid, 12, endpoint_id=endpoint_id)
    assert client.get_result(tid, timeout=30) == 144
    task = client.get_task(tid)
    assert task["state"] == "SUCCEEDED"
    names = [e[0] for e in task["events"]]
    assert names == ["CREATED", "QUEUED", "DISPATCHED", "RUNNING", "DONE", "SUCCEEDED", "STORED"]
    stages = stage_latencies([tuple(e) for e in task["events"]])
    assert set(stages) == {"service", "queue_wait", "dispatch", "run", "return"}


def test_batch_of_5000(client, endpoint_id):
    fid = client.register_function(square)
    batch = client.create_batch(endpoint_id=endpoint_id)
    for i in range(5000):
        batch.add(fid, i)
    ids = client.batch_run(batch)
    assert len(set(ids)) == 5000
    results: dict[str, object] = {}
    deadline = time.monotonic() + 120
    while len(results) < 5000 and time.monotonic() < deadline:
        got = client.get_batch_result([t for t in ids if t not in results], wait=2)
        results.update({t: r.get("result", r.get("exception")) for t, r in got.items() if not r["pending"]})
    wrong = [(i, results.get(t)) for i, t in enumerate(ids) if results.get(t) != i * i]
    assert not wrong, wrong[:5]


def test_remote_exception_propagates_with_traceback(client, endpoint_id):
    fid = client.register_function(explode)
    tid = client.run(fid, "missing-key", endpoint_id=endpoint_id)
    with pytest.raises(KeyError) as info:
        client.get_result(tid, timeout=30)
    assert "missing-key" in str(info.value)
    assert "in explode" in info.value.remote_traceback


def test_cancel_a_queued_task(client, endpoint_id):
    fid = client.register_function(nap)
    blockers = [client.run(fid, 1.5, endpoint_id=endpoint_id) for _ in range(2)]  # occupy both workers
    victim = client.run(fid, 0.01, endpoint_id=endpoint_id)
    assert client.cancel(victim) is True
    with pytest.raises(TaskCancelled):
        client.get_result(victim, timeout=10)
    for b in blockers:
        assert client.get_result(b, timeout=30) == 1.5
    time.sleep(0.5)  # the victim may have run meanwhile: its result must not replace the cancel
    assert client.get_task(victim)["state"] == "CANCELLED"


def test_executor_map_as_completed_and_wait(local_home):
    with Executor(endpoint="local") as ex:
        assert list(ex.map(square, range(200))) == [i * i for i in range(200)]
        futures = [ex.submit(square, i) for i in range(50)]
        assert sorted(f.result() for f in as_completed(futures, timeout=30)) == sorted(i * i for i in range(50))
        bad = ex.submit(explode, "k")
        done, not_done = wait([bad], timeout=30)
        assert bad in done and not not_done
        assert isinstance(bad.exception(), KeyError)
