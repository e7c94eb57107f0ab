"""Dataflow through the SDK (issue 26): futures and TaskRefs as arguments of Executor.submit/map,
Client.run and Batch.add, against the service double with dataflow (tests/sdk/dataflow_service.py),
whose tasks run through the worker's own run_task."""
from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections import OrderedDict

import pytest

import skyfn.submission as client_mod
from skyfn import Client, DependencyFailed, Executor, TaskCancelled, TaskRef
from skyfn.config import write_config
from skyfn.executor.future import SkyfnFuture
from skyfn.executor.state import set_exception, set_result
from skyfn.protocol.dataflow import Input
from skyfn.protocol.serialize import unpack_args

from . import flow_funcs as ff
from .dataflow_service import DataflowService


@pytest.fixture
def flow(skyfn_home):
    svc = DataflowService()
    write_config(svc.url, svc.token, home=skyfn_home)
    yield svc
    svc.stop()


@pytest.fixture
def fclient(flow):
    c = Client(backoff=0.01)
    yield c
    c.close()


@pytest.fixture
def ex(fclient):
    e = Executor(client=fclient, push=False)
    yield e
    e.shutdown(wait=True, cancel_futures=True)


def sent_tasks(flow) -> list[dict]:
    return [t for body in flow.bodies for t in body["tasks"]]


def test_a_chain_goes_in_one_request_with_local_inputs(fclient, flow, monkeypatch):
    import skyfn.executor.service_path as core

    monkeypatch.setattr(core, "_QUIET", 0.5)  # the calls below gather into one batch
    ex = Executor(client=fclient, push=False, batch_interval=0.5)
    try:
        ex.submit(ff.add, 0).result(timeout=10)  # a lone call goes at once: this one
        a = ex.submit(ff.add, 1, 2)
        b = ex.submit(ff.add, a, 10)
        c = ex.submit(ff.add, b, b)
        assert c.result(timeout=10) == 26 and b.result() == 13
    finally:
        ex.shutdown(cancel_futures=True)
    assert len(flow.bodies) == 2
    tasks = flow.bodies[1]["tasks"]
    assert [t.get("inputs") for t in tasks] == [None, ["#0"], ["#1"]]
    assert [t.get("memoize") for t in tasks] == [None, False, False]
    assert unpack_args(tasks[2]["payload"]) == ((Input(0), Input(0)), {})  # the same future twice: one input
    assert [s for s, _ in flow.tasks[c.task_id]["events"]][:3] == ["CREATED", "WAITING", "QUEUED"]


def test_inputs_of_an_earlier_request_are_named_by_id(ex, flow):
    a = ex.submit(ff.slow, 1.0, 2)
    deadline = time.monotonic() + 10
    while a.task_id is None and time.monotonic() < deadline:  # sent, not done
        time.sleep(0.01)
    b = ex.submit(ff.add, a, 1)
    assert not a.done() and b.result(timeout=10) == 3
    assert sent_tasks(flow)[-1]["inputs"] == [a.task_id]


def test_a_future_already_done_here_is_passed_by_value(ex, flow):
    """Its result is known: nothing to wait for, and no record at the service it must outlive."""
    a = ex.submit(ff.add, 1, 1)
    assert a.result(timeout=10) == 2
    b = ex.submit(ff.total, [a, a])
    assert b.result(timeout=10) == 4
    last = sent_tasks(flow)[-1]
    assert "inputs" not in last and unpack_args(last["payload"]) == (([2, 2],), {})


def test_nested_containers_of_futures(ex):
    a, b = ex.submit(ff.add, 1), ex.submit(ff.add, 2)
    pair = ff.Pair(a, [b, 3])
    od = OrderedDict([("z", a), ("y", 1)])
    got = ex.submit(ff.echo, [a, (b, {"k": a})], pair, {b, 4}, frozenset({a}), od=od, deep={"x": [[(b,)]]})
    args, kwargs = got.result(timeout=10)
    assert args == [[1, (2, {"k": 1})], ff.Pair(1, [2, 3]), {2, 4}, frozenset({1})]
    assert type(args[1]) is ff.Pair
    assert type(kwargs["od"]) is OrderedDict and list(kwargs["od"].items()) == [("z", 1), ("y", 1)]
    assert kwargs["deep"] == {"x": [[(2,)]]}


def test_fan_in_and_map_over_futures(ex):
    parts = [ex.submit(ff.add, i) for i in range(50)]
    assert ex.submit(ff.total, parts).result(timeout=20) == sum(range(50))
    assert list(ex.map(ff.add, parts, range(50), timeout=20)) == [2 * i for i in range(50)]
    assert ex.submit(ff.same, parts[0], parts[0]).result(timeout=10) is True  # one input, deserialized once


def test_a_failed_input_fails_its_dependents_with_dependency_failed(ex):
    bad = ex.submit(ff.explode, "sample 7 is corrupt")
    mid = ex.submit(ff.add, bad, 1)
    end = ex.submit(ff.add, mid, 1)
    with pytest.raises(DependencyFailed) as info:
        mid.result(timeout=10)
    e = info.value
    assert (e.task_id, e.input_task_id, e.input_state) == (mid.task_id, bad.task_id, "FAILED")
    assert isinstance(e.cause, ff.ScienceError) and "sample 7 is corrupt" in str(e.cause)
    with pytest.raises(DependencyFailed) as info:  # transitive: names its own input, carries the first error
        end.result(timeout=10)
    assert info.value.input_task_id == mid.task_id and isinstance(info.value.cause, ff.ScienceError)


def test_cancelling_an_input_cancels_its_dependent(ex, flow):
    flow.gate.clear()
    a = ex.submit(ff.slow, 0, 1)
    b = ex.submit(ff.add, a, 1)
    deadline = time.monotonic() + 5
    while b.task_id is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert a.cancel()
    with pytest.raises(TaskCancelled, match="was cancelled"):
        b.result(timeout=10)
    flow.gate.set()
    assert flow.runs.get(b.task_id) is None


def test_task_refs_and_client_run(fclient, flow, ex):
    eid = flow.local_endpoint
    first = fclient.run(ff.add, 1, 2, endpoint_id=eid)
    second = fclient.run(ff.add, TaskRef(first), 5, endpoint_id=eid, memoize=True)
    assert fclient.get_result(second, timeout=10) == 8
    assert flow.tasks[second]["inputs"] == [first] and flow.tasks[second]["memoize"] is False
    # an Executor takes a TaskRef, and Client.run an Executor's future
    fut = ex.submit(ff.slow, 1.0, TaskRef(second))  # still running when third is submitted: an input
    third = fclient.run(ff.echo, fut, TaskRef(first), fut, endpoint_id=eid)
    assert fclient.get_result(third, timeout=10) == ([8, 3, 8], {})
    assert flow.tasks[third]["inputs"] == [fut.task_id, first]


def test_batch_add_takes_inputs_and_submit_tasks_rebases_local_ones(fclient, flow, monkeypatch):
    eid = flow.local_endpoint
    first = fclient.run(ff.add, 40, endpoint_id=eid)
    batch = fclient.create_batch(eid)
    batch.add(ff.add, TaskRef(first), 2)
    [tid] = fclient.batch_run(batch)
    assert fclient.get_result(tid, timeout=10) == 42
    # a chain of five as "#k", split into requests of two tasks: later requests name earlier ids
    monkeypatch.setattr(client_mod, "REQUEST_MAX_TASKS", 2)
    fid = fclient.register_function(ff.add)
    from skyfn.protocol.serialize import pack_args

    tasks = [{"function_id": fid, "payload": pack_args((1,), {})}]
    tasks += [{"function_id": fid, "payload": pack_args((Input(0), 1), {}), "inputs": [f"#{k}"]} for k in range(4)]
    flow.bodies.clear()
    ids = fclient.submit_tasks(tasks, eid)
    assert fclient.get_result(ids[-1], timeout=10) == 5
    sent = [[t.get("inputs") for t in body["tasks"]] for body in flow.bodies]
    assert sent == [[None, ["#0"]], [[ids[1]], ["#0"]], [[ids[3]]]]


def test_requests_split_by_size_keep_local_inputs_right(ex, flow, monkeypatch):
    monkeypatch.setattr(client_mod, "REQUEST_MAX_BYTES", 2_500)
    flow.gate.clear()
    pad = "x" * 1000
    futs = [ex.submit(ff.slow, 0, 0)]
    for _ in range(6):
        futs.append(ex.submit(ff.echo, futs[-1], pad))
    flow.gate.set()
    assert futs[-1].result(timeout=10)[0][1] == pad
    assert len(flow.bodies) > 2
    ids = {f.task_id: i for i, f in enumerate(futs)}
    for body in flow.bodies:
        for pos, t in enumerate(body["tasks"]):
            for name in t.get("inputs") or ():
                assert name in ids or int(name[1:]) < pos  # an id of an earlier request, or "#k" before it


def test_a_future_of_another_executor_is_waited_for(fclient, flow):
    other = Executor(client=fclient, push=False, batch_interval=0.3, batch_size=1000)
    mine = Executor(client=fclient, push=False)
    try:
        flow.gate.clear()
        a = other.submit(ff.add, 20)
        other.submit(ff.add, 0)  # company: the other executor waits for its batch_interval
        b = mine.submit(ff.add, a, 22)
        flow.gate.set()
        assert b.result(timeout=10) == 42
        assert flow.tasks[b.task_id]["inputs"] == [a.task_id]
    finally:
        other.shutdown(cancel_futures=True)
        mine.shutdown(cancel_futures=True)


def test_an_input_that_failed_to_submit_fails_its_dependent(ex, flow):
    other = Executor(client=Client(backoff=0.01, retries=0), push=False)
    try:
        flow.inject("POST", "/tasks", "503_before", times=5)
        a = other.submit(ff.add, 1)
        with pytest.raises(Exception) as first:
            a.result(timeout=10)
        b = ex.submit(ff.add, a, 1)
        with pytest.raises(type(first.value)):
            b.result(timeout=10)
        assert b.task_id is None
    finally:
        other.shutdown(cancel_futures=True)


def test_a_foreign_future_is_refused(ex):
    with pytest.raises(TypeError, match="not a skyfn future"):
        ex.submit(ff.add, cf.Future(), 1)


# -- by value: futures of a direct session's tasks -------------------------------------------

def direct_future(task_id: str = "0190a5e1-0000-7000-8000-000000000001") -> SkyfnFuture:
    """A future as the direct channel leaves it: an id the service does not know."""
    fut = SkyfnFuture()
    fut.task_id, fut.by_value = task_id, True
    return fut


def test_a_direct_tasks_value_is_passed_inline_when_it_is_known(ex, flow):
    d = direct_future()
    a = ex.submit(ff.slow, 1.0, 1)  # still running when b goes: an input, not a value known here
    b = ex.submit(ff.echo, d, a, d)
    assert ex.outstanding >= 1 and b.task_id is None  # waits for d's value, off the caller's thread
    c = ex.submit(ff.echo, b)  # b is by value while it waits: c waits for it too
    threading.Timer(0.1, set_result, (d, 7)).start()
    assert b.result(timeout=10) == ([7, 1, 7], {})
    assert c.result(timeout=10) == ([([7, 1, 7], {})], {})
    task = flow.tasks[b.task_id]
    assert task["inputs"] == [a.task_id]  # renumbered: d's value is in the payload
    assert [t.get("inputs") for t in sent_tasks(flow) if t.get("inputs")][0] == [a.task_id]


def test_a_failed_or_cancelled_direct_input_ends_its_dependent(ex, flow):
    d1, d2 = direct_future(), direct_future("0190a5e1-0000-7000-8000-000000000002")
    b1, b2 = ex.submit(ff.add, d1, 1), ex.submit(ff.add, d2, 1)
    set_exception(d1, ff.ScienceError("bad sample"))
    d2.cancel()
    with pytest.raises(DependencyFailed) as info:
        b1.result(timeout=5)
    assert info.value.input_task_id == d1.task_id and isinstance(info.value.cause, ff.ScienceError)
    with pytest.raises(cf.CancelledError):
        b2.result(timeout=5)
    assert ex.outstanding == 0 and not flow.bodies


def test_shutdown_waits_for_calls_waiting_for_direct_values(fclient, flow):
    e = Executor(client=fclient, push=False)
    d = direct_future()
    b = e.submit(ff.add, d, 1)
    threading.Timer(0.2, set_result, (d, 41)).start()
    e.shutdown(wait=True)
    assert b.result(timeout=0) == 42


def test_two_executors_waiting_for_each_others_futures_both_move_on(fclient, flow, monkeypatch):
    import skyfn.executor.service_path as core

    monkeypatch.setattr(core, "_QUIET", 0.3)  # each executor gathers its two calls into one batch
    a_ex = Executor(client=fclient, push=False, batch_interval=0.3)
    b_ex = Executor(client=fclient, push=False, batch_interval=0.3)
    try:
        flow.gate.clear()
        a_ex.submit(ff.add, 0), b_ex.submit(ff.add, 0)  # outstanding: the calls below are not lone
        time.sleep(0.4)
        a0, b0 = a_ex.submit(ff.add, 1), b_ex.submit(ff.add, 2)
        x, y = a_ex.submit(ff.add, b0, 10), b_ex.submit(ff.add, a0, 20)  # [a0, x] and [b0, y]: a cycle of waits
        flow.gate.set()
        t0 = time.monotonic()
        assert (x.result(timeout=20), y.result(timeout=20)) == (12, 21)
        assert time.monotonic() - t0 < 10
    finally:
        a_ex.shutdown(cancel_futures=True)
        b_ex.shutdown(cancel_futures=True)
