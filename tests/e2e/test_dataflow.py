"""Futures as arguments all the way through the embedded runtime (issue 26): chains, a
diamond, fan-out and fan-in, futures nested in containers, a failing input, a cancel, a
client that exits right after submitting its graph, and an edge between two endpoints that
carries a 100 MiB result."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from skyfn import Executor, TaskRef
from skyfn.protocol.errors import DependencyFailed, TaskCancelled
from skyfn.protocol.states import stage_latencies
from tests.e2e.processes import extra_agent

ROOT = Path(__file__).resolve().parents[2]


def inc(x):
    return x + 1


def inc_once_open(path, x):
    import os as _os
    import time as _t

    while not _os.path.exists(path):  # the test opens it once the chain is submitted
        _t.sleep(0.01)
    return x + 1


def add(*xs):
    return sum(xs)


def shape(tree):
    return {"x": tree["x"], "y": tree["y"], "types": [type(v).__name__ for v in tree["x"]]}


def explode(msg):
    raise KeyError(msg)


def nap(seconds):
    import time as _t

    _t.sleep(seconds)
    return seconds


def produce(n):
    return bytes(range(256)) * (n // 256)


def digest(blob):
    import hashlib

    return len(blob), hashlib.sha256(blob).hexdigest()


def test_a_chain_runs_in_order_and_shows_its_wait(client):
    with Executor(endpoint="local") as ex:
        fut = ex.submit(inc, 0)
        for _ in range(19):
            fut = ex.submit(inc, fut)
        assert fut.result(timeout=120) == 20
    task = client.get_task(fut.task_id)
    names = [e[0] for e in task["events"]]
    assert names[:3] == ["CREATED", "WAITING", "QUEUED"] and names[-2:] == ["SUCCEEDED", "STORED"]
    assert "waiting" in stage_latencies([tuple(e) for e in task["events"]])


def test_a_chain_on_one_endpoint_is_released_by_its_agent(client, tmp_path):
    """Input and dependent on the same endpoint: the agent holds the dependent and runs it as
    soon as the input's result is there; no trip through the service (parked.py)."""
    gate = tmp_path / "go"
    with Executor(endpoint="local") as ex:
        futures = [ex.submit(inc_once_open, str(gate), 0)]
        for _ in range(49):
            futures.append(ex.submit(inc, futures[-1]))
        # the head runs only once the whole chain is submitted and its dependents had time to
        # reach the agent: on a loaded machine the head could otherwise end while later
        # dependents are still on their way, and those edges would go through the service
        deadline = time.monotonic() + 120
        while not all(f.task_id for f in futures) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        gate.touch()
        assert futures[-1].result(timeout=120) == 50
    tasks = client.status([f.task_id for f in futures], include_events=True)["tasks"]
    first = {}
    for tid, t in tasks.items():
        first[tid] = {}
        for name, ts in t["events"]:
            first[tid].setdefault(name, ts)
    by_agent = 0
    for prev, fut in zip(futures, futures[1:]):
        a, b = first[prev.task_id], first[fut.task_id]
        assert b["RUNNING"] >= a["DONE"]  # never before its input
        queued = b.get("QUEUED")  # the service writes QUEUED when it releases a dependent itself
        if queued is None or (queued == b.get("DISPATCHED") and queued < a["STORED"]):
            by_agent += 1  # released where it ran (its agent may report RUNNING first), before the service stored its input
    # only the first edge may go through the service: its input can finish before the
    # dependent reaches the agent, while the agent keeps no results yet
    assert by_agent >= 48


def produce_later(seconds, n):
    import time as _t

    _t.sleep(seconds)  # the dependent reaches the agent first, as in a pipeline that computes
    return bytes(range(256)) * (n // 256)


def test_a_large_result_reaches_its_dependent_on_the_same_endpoint_through_the_agent(client):
    """64 MiB from one task to the next on one endpoint: the agent hands its worker's result
    to the parked dependent; the service stores the input's result (S3) but is not on the edge."""
    import hashlib

    n = 64 << 20
    with Executor(endpoint="local") as ex:
        big = ex.submit(produce_later, 3, n)
        consumer = ex.submit(digest, big)
        got = consumer.result(timeout=300)
    assert tuple(got) == (n, hashlib.sha256(produce(n)).hexdigest())
    events = {e[0]: e[1] for e in reversed(client.get_task(consumer.task_id)["events"])}
    stored = {e[0]: e[1] for e in reversed(client.get_task(big.task_id)["events"])}["STORED"]
    assert events["QUEUED"] == events["DISPATCHED"] < stored  # released by the agent, not the service


def test_a_diamond_and_a_fan_in(client):
    with Executor(endpoint="local") as ex:
        a = ex.submit(inc, 1)                    # 2
        b, c = ex.submit(add, a, a), ex.submit(inc, a)  # 4, 3
        d = ex.submit(add, b, c)                 # 7
        mappers = [ex.submit(inc, i) for i in range(300)]
        reduced = ex.submit(add, *mappers)
        assert d.result(timeout=120) == 7
        assert reduced.result(timeout=120) == sum(range(1, 301))


def test_futures_nested_in_containers(client):
    with Executor(endpoint="local") as ex:
        a, b = ex.submit(inc, 1), ex.submit(inc, 10)
        out = ex.submit(shape, {"x": [a, (b,), {"k": a}], "y": a}).result(timeout=60)
    assert out == {"x": [2, [11], {"k": 2}], "y": 2, "types": ["int", "list", "dict"]} or \
        out == {"x": [2, (11,), {"k": 2}], "y": 2, "types": ["int", "tuple", "dict"]}


def test_a_failed_input_fails_its_dependents_with_its_exception(client):
    with Executor(endpoint="local") as ex:
        bad = ex.submit(explode, "no such key")
        child = ex.submit(inc, bad)
        grandchild = ex.submit(inc, child)
        for fut, failed in ((child, bad), (grandchild, child)):
            with pytest.raises(DependencyFailed) as info:
                fut.result(timeout=60)
            assert info.value.input_task_id == failed.task_id and info.value.input_state == "FAILED"
            assert isinstance(info.value.cause, KeyError) and "no such key" in str(info.value.cause)
    assert client.get_task(child.task_id)["state"] == "FAILED"


def test_cancelling_an_input_cancels_its_dependents(client):
    with Executor(endpoint="local") as ex:
        slow = ex.submit(nap, 30)
        after = ex.submit(inc, slow)
        after2 = ex.submit(inc, after)
        deadline = time.monotonic() + 30
        while after2.task_id is None and time.monotonic() < deadline:  # set once the executor sent it
            time.sleep(0.05)
        client.cancel(slow.task_id)
        for fut in (after, after2):
            with pytest.raises(TaskCancelled):
                fut.result(timeout=60)
        assert client.get_task(after.task_id)["state"] == "CANCELLED"


def test_a_graph_finishes_after_its_client_exited(client, local_home, tmp_path):
    script = tmp_path / "submit_and_leave.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from skyfn import Client, TaskRef
        from tests.e2e.test_dataflow import inc, nap

        with Client() as c:
            ep = c.endpoint_id("local")
            slow = c.run(c.register_function(nap), 5, endpoint_id=ep)
            fid = c.register_function(inc)
            t1 = c.run(fid, TaskRef(slow), endpoint_id=ep)
            t2 = c.run(fid, TaskRef(t1), endpoint_id=ep)
            print(t2, flush=True)
        os._exit(0)  # gone before the graph even started: nothing of it runs in this process
    """))
    env = dict(os.environ, SKYFN_HOME=str(local_home), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    gone = time.time()
    assert out.returncode == 0, out.stderr
    last = out.stdout.split()[-1]
    assert client.get_result(last, timeout=90) == 7  # read later by another client of the same user
    finished = next(ts for state, ts in client.get_task(last)["events"] if state == "SUCCEEDED")
    assert finished > gone  # the graph went on after its client was gone
    cli = [sys.executable, "-m", "skyfn.cli", "task", "result"]
    done = subprocess.run([*cli, last], env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "7"), done.stderr


def test_taskrefs_of_client_run(client, endpoint_id):
    fid = client.register_function(inc)
    a = client.run(fid, 41, endpoint_id=endpoint_id)
    b = client.run(fid, TaskRef(a), endpoint_id=endpoint_id)
    assert client.get_result(b, timeout=60) == 43


@pytest.fixture
def second_endpoint(local_home, client):
    """A second endpoint of the same user, its own agent process."""
    with extra_agent(local_home, client, "dataflow-b", {"workers": 1, "heartbeat_period": 1}) as ep:
        yield ep["name"]


def test_an_edge_across_endpoints_carries_a_100_mib_result(client, second_endpoint):
    n = 100 << 20
    with Executor(endpoint="local") as here, Executor(endpoint=second_endpoint) as there:
        big = here.submit(produce, n)
        consumer = there.submit(digest, big)
        got = consumer.result(timeout=300)
    import hashlib

    assert tuple(got) == (n, hashlib.sha256(produce(n)).hexdigest())
    assert client.get_task(big.task_id)["endpoint_id"] == client.endpoint_id("local")
    assert client.get_task(consumer.task_id)["endpoint_id"] == client.endpoint_id(second_endpoint)
