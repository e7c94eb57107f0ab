"""Client: register, run, results, remote exceptions, batches, cancel, endpoints."""
from __future__ import annotations

import time

import pytest

from skyfn import Client, EndpointNotFound, RemoteExecutionError, TaskCancelled, TaskFailed, TaskNotFound, TaskTimedOut
from skyfn.client import split_requests

from . import funcs


def test_register_run_get_result(client, service):
    fid = client.register_function(funcs.add, tag="cpu", name="adder")
    assert service.functions[fid]["tag"] == "cpu" and service.functions[fid]["name"] == "adder"
    info = client.get_function(fid)
    assert info["function_id"] == fid and info["function"].startswith("source ")
    eid = client.endpoint_id("local")
    assert eid == service.local_endpoint
    tid = client.run(fid, 40, b=2, endpoint_id=eid)
    assert client.get_result(tid, timeout=5) == 42
    t = client.get_task(tid)
    assert t["state"] == "SUCCEEDED" and t["function_id"] == fid
    assert [s for s, _ in t["events"]][:2] == ["CREATED", "QUEUED"]


def test_values_of_many_types(client, service):
    eid = service.local_endpoint
    values = [None, 1.5, "text", [1, [2]], {"k": [1, 2]}, {1: "int key"}, (1, 2), {1, 2}, b"bytes", float("inf")]
    ids = [client.run(funcs.add, v, endpoint_id=eid) if v is None else client.run(funcs.slow, 0, value=v, endpoint_id=eid)
           for v in values]
    results = [client.get_result(t, timeout=5) for t in ids[1:]]
    assert results == values[1:]
    assert [type(r) for r in results] == [type(v) for v in values[1:]]
    with pytest.raises(TypeError):  # None + 0 fails remotely, re-raised with its own type
        client.get_result(ids[0], timeout=5)
    assert client.get_result(client.run(funcs.add, (1, 2), (3,), endpoint_id=eid), timeout=5) == (1, 2, 3)


def test_callable_registered_once(client, service):
    eid = service.local_endpoint
    ids = [client.run(funcs.square, i, endpoint_id=eid) for i in range(3)]
    assert [client.get_result(t, timeout=5) for t in ids] == [0, 1, 4]
    assert service.count("POST", "/functions") == 1


def test_remote_exception_reraised_with_type_and_traceback(client, service):
    tid = client.run(funcs.explode, "bad sample", endpoint_id=service.local_endpoint)
    with pytest.raises(funcs.ScienceError, match="bad sample") as info:
        client.get_result(tid, timeout=5)
    tb = info.value.remote_traceback
    assert "in explode" in tb and "ScienceError: bad sample" in tb
    assert any("Remote traceback" in n for n in info.value.__notes__)


def local_exception_class():
    exc = KeyError("cannot travel by value")
    exc.state = (i for i in range(3))  # generators serialize with no strategy
    raise exc


def test_unrebuildable_exception_becomes_remote_execution_error(client, service):
    tid = client.run(local_exception_class, endpoint_id=service.local_endpoint)
    with pytest.raises(RemoteExecutionError) as info:
        client.get_result(tid, timeout=5)
    assert info.value.type_name == "builtins.KeyError" and "in local_exception_class" in info.value.remote_traceback and "cannot travel by value" in str(info.value)


def test_timeout_and_final_failure_states(client, service):
    eid = service.local_endpoint
    service.gate.clear()
    a, b, c = (client.run(funcs.noop, endpoint_id=eid) for _ in range(3))
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="QUEUED"):
        client.get_result(a, timeout=0.3)
    assert 0.25 < time.monotonic() - t0 < 2
    with pytest.raises(TimeoutError):
        client.get_result(a, timeout=0)
    service.finish(a, "TIMED_OUT", "walltime of 1 s exceeded")
    service.finish(b, "FAILED", "lease expired 4 times")
    assert client.cancel(c) is True
    with pytest.raises(TaskTimedOut, match="walltime of 1 s exceeded"):
        client.get_result(a)
    with pytest.raises(TaskFailed, match="lease expired 4 times") as info:
        client.get_result(b)
    assert info.value.state == "FAILED" and not isinstance(info.value, (TaskTimedOut, TaskCancelled))
    with pytest.raises(TaskCancelled):
        client.get_result(c)
    assert client.cancel(c) is False  # already final: 409
    service.gate.set()


def test_long_poll_returns_when_final(client, service):
    tid = client.run(funcs.slow, 0.3, "done", endpoint_id=service.local_endpoint)
    t0 = time.monotonic()
    assert client.get_result(tid) == "done"
    assert time.monotonic() - t0 < 1.0
    assert service.count("POST", "/tasks/status") <= 2  # long poll, no busy polling


def test_get_batch_result(client, service):
    eid = service.local_endpoint
    service.gate.clear()
    batch = client.create_batch(endpoint_id=eid)
    batch.add(funcs.add, 1, 2)
    batch.add(funcs.explode, "boom")
    batch.add(funcs.square, 5)
    ids = client.batch_run(batch)
    res = client.get_batch_result(ids)
    assert all(r["pending"] and r["state"] == "QUEUED" for r in res.values())
    service.gate.set()
    deadline = time.monotonic() + 5
    while any(r["pending"] for r in res.values()) and time.monotonic() < deadline:
        res = client.get_batch_result(ids, wait=1)
    assert res[ids[0]] == {"pending": False, "state": "SUCCEEDED", "status": "SUCCEEDED", "result": 3}
    assert isinstance(res[ids[1]]["exception"], funcs.ScienceError) and res[ids[1]]["state"] == "FAILED"
    assert res[ids[2]]["result"] == 25
    res = client.get_batch_result([ids[0], "nope"])
    assert isinstance(res["nope"]["exception"], TaskNotFound) and res["nope"]["pending"] is False


def test_unknown_task(client):
    with pytest.raises(TaskNotFound):
        client.get_task("nope")
    with pytest.raises(TaskNotFound):
        client.get_result("nope", timeout=1)
    with pytest.raises(TaskNotFound):
        client.cancel("nope")


def test_large_batch_is_split_each_with_own_key(client, service, monkeypatch):
    import skyfn.submission as client_mod

    monkeypatch.setattr(client_mod, "REQUEST_MAX_TASKS", 1000)
    fid = client.register_function(funcs.square)
    batch = client.create_batch(endpoint_id=service.local_endpoint)
    for i in range(2500):
        batch.add(fid, i)
    ids = client.batch_run(batch)
    assert len(ids) == 2500 == len(set(ids))
    assert service.count("POST", "/tasks") == 3 and len(service.submissions) == 3
    res = client.get_batch_result(ids, wait=1)
    deadline = time.monotonic() + 10
    while any(r["pending"] for r in res.values()) and time.monotonic() < deadline:
        res = client.get_batch_result([t for t, r in res.items() if r["pending"]], wait=1) | {
            t: r for t, r in res.items() if not r["pending"]}
    assert [res[t]["result"] for t in ids] == [i * i for i in range(2500)]


def test_split_requests_limits():
    tasks = [{"function_id": "f", "payload": "x" * 1000} for _ in range(100)]
    chunks = split_requests(tasks, max_tasks=30, max_bytes=10 << 20)
    assert [len(c) for c in chunks] == [30, 30, 30, 10]
    chunks = split_requests(tasks, max_tasks=5000, max_bytes=20_000)
    assert all(sum(len(t["payload"]) for t in c) <= 20_000 for c in chunks) and sum(map(len, chunks)) == 100
    default = split_requests([{"function_id": "f", "payload": "y"}] * 12_000)
    assert [len(c) for c in default] == [5000, 5000, 2000]


def test_batch_needs_an_endpoint(client):
    with pytest.raises(ValueError, match="endpoint"):
        client.create_batch().add("fid", 1)
    with pytest.raises(ValueError, match="endpoint_id"):
        client.run("fid", 1)


def test_endpoints(client, service):
    other = service.add_endpoint("hpc", status="offline")
    eps = client.list_endpoints()
    assert {e["name"] for e in eps} == {"local", "hpc"}
    assert client.get_endpoint(other)["name"] == "hpc"
    assert client.endpoint_id("hpc") == other
    with pytest.raises(EndpointNotFound, match="no endpoint named 'missing'.*hpc, local"):
        client.endpoint_id("missing")


def test_client_arguments_override(service):
    c = Client(service_url=service.url + "/", token=service.token)
    assert c.endpoint_id("local") == service.local_endpoint


def test_task_options_validate_and_shape():
    from skyfn.client import task_options

    assert task_options({"gpus": 1}, 30) == {"resources": {"gpus": 1}, "walltime": 30.0}
    assert task_options() == {}
    with pytest.raises(ValueError, match="unknown resource_specification keys \\['memory'\\]"):
        task_options({"memory": 4})
