"""Executor: a real concurrent.futures.Executor over the service double."""
from __future__ import annotations

import concurrent.futures as cf
import io
import threading
import time

import pytest

from skyfn import Executor, SkyfnAPIError, SkyfnConnectionError, TaskCancelled

from . import funcs


def test_submit_values_and_registration_once(executor, service):
    futs = [executor.submit(funcs.add, i, b=10) for i in range(20)]
    assert [f.result(timeout=5) for f in futs] == [i + 10 for i in range(20)]
    assert all(f.task_id in service.tasks for f in futs)
    assert service.count("POST", "/functions") == 1
    assert executor.outstanding == 0


def test_is_a_concurrent_futures_executor(executor):
    assert isinstance(executor, cf.Executor)
    fut = executor.submit(funcs.square, 3)
    assert isinstance(fut, cf.Future)
    assert fut.result(timeout=5) == 9


def test_map_in_order_and_batched(executor, service):
    n = 3000
    assert list(executor.map(funcs.square, range(n), timeout=30)) == [i * i for i in range(n)]
    assert list(executor.map(funcs.add, [1, 2], [10, 20])) == [11, 22]
    # all of it went in a handful of requests (batch_size 1000), not one per task
    assert service.count("POST", "/tasks") <= 6
    assert service.count("POST", "/functions") == 2


def test_as_completed_and_wait(executor, service):
    futs = {executor.submit(funcs.slow, 0.01 * (5 - i), i): i for i in range(5)}
    got = {futs[f]: f.result() for f in cf.as_completed(futs, timeout=10)}
    assert got == {i: i for i in range(5)}
    more = [executor.submit(funcs.square, i) for i in range(10)]
    done, not_done = cf.wait(more, timeout=10, return_when=cf.ALL_COMPLETED)
    assert len(done) == 10 and not not_done
    first = [executor.submit(funcs.slow, 1.0, "late"), executor.submit(funcs.noop)]
    # the service double runs tasks in order: the fast one finishes after the slow one
    done, _ = cf.wait(first, timeout=10, return_when=cf.FIRST_COMPLETED)
    assert done


def test_futures_get_remote_exceptions(executor):
    ok = executor.submit(funcs.add, 1, 1)
    bad = executor.submit(funcs.explode, "sample 7 is corrupt")
    with pytest.raises(funcs.ScienceError, match="sample 7 is corrupt") as info:
        bad.result(timeout=5)
    assert "in explode" in info.value.remote_traceback
    assert isinstance(bad.exception(), funcs.ScienceError)
    assert ok.result(timeout=5) == 2
    results = list(cf.as_completed([executor.submit(funcs.explode, str(i)) for i in range(3)]))
    assert all(isinstance(f.exception(), funcs.ScienceError) for f in results)


def test_map_raises_first_exception_in_order(executor):
    it = executor.map(funcs.explode, ["a", "b"])
    with pytest.raises(funcs.ScienceError, match="a"):
        next(it)


def test_cancel_submitted_future_cancels_remote_task(executor, service):
    service.gate.clear()  # tasks stay QUEUED
    futs = [executor.submit(funcs.square, i) for i in range(3)]
    deadline = time.monotonic() + 5
    while not all(f.task_id for f in futs) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert all(f.task_id for f in futs)
    assert futs[1].cancel() is True
    assert futs[1].cancelled()
    deadline = time.monotonic() + 5
    while service.tasks[futs[1].task_id]["state"] != "CANCELLED" and time.monotonic() < deadline:
        time.sleep(0.005)
    assert service.tasks[futs[1].task_id]["state"] == "CANCELLED"
    assert service.count("DELETE", f"/tasks/{futs[1].task_id}") == 1
    service.gate.set()
    assert futs[0].result(timeout=5) == 0 and futs[2].result(timeout=5) == 4
    with pytest.raises(cf.CancelledError):
        futs[1].result()
    assert futs[0].cancel() is False  # finished futures cannot be cancelled


def test_cancel_before_submission_sends_nothing(client, service):
    ex = Executor(client=client)
    with ex._cv:  # hold the background thread off so the future is still queued
        fut = ex.submit(funcs.square, 2)
        keep = ex.submit(funcs.square, 3)
        assert fut.task_id is None and fut.cancel() is True
    assert keep.result(timeout=5) == 9
    ex.shutdown()
    assert fut.cancelled() and fut.task_id is None
    assert len(service.tasks) == 1


def test_remote_cancel_by_someone_else_resolves_future(executor, service, client):
    service.gate.clear()
    fut = executor.submit(funcs.noop)
    deadline = time.monotonic() + 5
    while not fut.task_id and time.monotonic() < deadline:
        time.sleep(0.005)
    assert client.cancel(fut.task_id)
    with pytest.raises(TaskCancelled):
        fut.result(timeout=5)
    service.gate.set()


def test_shutdown_cancel_futures(client, service):
    service.gate.clear()
    ex = Executor(client=client)
    futs = [ex.submit(funcs.square, i) for i in range(5)]
    ex.shutdown(wait=True, cancel_futures=True)
    assert all(f.cancelled() for f in futs)
    assert all(t["state"] == "CANCELLED" for t in service.tasks.values())
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(funcs.noop)
    service.gate.set()


def test_shutdown_cancel_futures_while_submission_in_flight(client, service):
    service.gate.clear()
    service.inject("POST", "/tasks", "slow_after")
    ex = Executor(client=client)
    futs = [ex.submit(funcs.square, i) for i in range(5)]
    deadline = time.monotonic() + 5
    while not service.count("POST", "/tasks") and time.monotonic() < deadline:
        time.sleep(0.005)
    ex.shutdown(wait=True, cancel_futures=True)  # must not wait for tasks that never run
    assert all(f.cancelled() for f in futs)
    # what reached the service is cancelled there; what was still queued never left
    assert 1 <= len(service.tasks) <= 5 and all(t["state"] == "CANCELLED" for t in service.tasks.values())
    service.gate.set()


def test_shutdown_waits_for_results(client):
    with Executor(client=client) as ex:
        futs = [ex.submit(funcs.slow, 0.05, i) for i in range(4)]
    assert all(f.done() for f in futs)
    assert [f.result() for f in futs] == [0, 1, 2, 3]


def test_progress_bar(client, service):
    out = io.StringIO()
    with Executor(client=client, progress=out) as ex:
        assert list(ex.map(funcs.square, range(50))) == [i * i for i in range(50)]
        ex.submit(funcs.noop).result(timeout=5)
    text = out.getvalue()
    assert "skyfn" in text and "51/51" in text and "task" in text


def test_submission_failure_sets_exception(client, service):
    ex = Executor(client=client)
    fut = ex.submit("not-a-function-id", 1)
    with pytest.raises(SkyfnAPIError, match="unknown function"):
        fut.result(timeout=5)
    ex.shutdown()


def test_submission_retried_idempotently(client, service):
    service.inject("POST", "/tasks", "drop_after")
    service.inject("POST", "/tasks", "503_after")
    with Executor(client=client) as ex:
        assert list(ex.map(funcs.square, range(10))) == [i * i for i in range(10)]
    assert len(service.tasks) == 10 and len(service.submissions) == 1


def test_status_failures_do_not_hang_futures(service):
    from skyfn import Client

    # a bounded retry count: by default the client rides out 60 s of 503s (a restart)
    client = Client(service_url=service.url, token=service.token, retries=2, backoff=0.01)
    ex = Executor(client=client, max_poll_failures=1)
    service.gate.clear()
    service.inject("POST", "/tasks/status", "503_before", times=100)
    fut = ex.submit(funcs.noop)
    with pytest.raises(SkyfnAPIError) as info:
        fut.result(timeout=30)
    assert info.value.status == 503
    service.faults.clear()
    service.gate.set()
    ex.shutdown()


def test_service_down_does_not_hang_futures(service):
    from skyfn import Client

    client = Client(service_url=service.url, token=service.token, retries=1, backoff=0.01)
    ex = Executor(client=client, max_poll_failures=1)
    service.gate.clear()
    fut = ex.submit(funcs.noop)
    deadline = time.monotonic() + 5
    while not fut.task_id and time.monotonic() < deadline:
        time.sleep(0.005)
    service.stop()
    with pytest.raises((SkyfnConnectionError, SkyfnAPIError)):
        fut.result(timeout=30)
    late = ex.submit(funcs.noop)
    with pytest.raises((SkyfnConnectionError, SkyfnAPIError)):
        late.result(timeout=30)
    ex.shutdown()


def test_submit_from_many_threads(executor):
    results = []

    def worker(k):
        results.extend(f.result(timeout=10) for f in [executor.submit(funcs.add, k, i) for i in range(50)])

    threads = [threading.Thread(target=worker, args=(k * 1000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted(k * 1000 + i for k in range(4) for i in range(50))


def test_endpoint_by_name(client, service):
    hpc = service.add_endpoint("hpc")
    with Executor(endpoint="hpc", client=client) as ex:
        fut = ex.submit(funcs.square, 4)
        assert fut.result(timeout=5) == 16
    assert service.tasks[fut.task_id]["endpoint_id"] == hpc


def test_done_callback_may_submit(executor):
    second = []
    done = threading.Event()

    def chain(f):
        nxt = executor.submit(funcs.add, f.result(), 1)
        nxt.add_done_callback(lambda g: (second.append(g.result()), done.set()))

    executor.submit(funcs.square, 3).add_done_callback(chain)
    assert done.wait(5) and second == [10]


def test_10k_tasks_and_big_status_answers(client, service):
    t0 = time.monotonic()
    with Executor(client=client) as ex:
        out = list(ex.map(funcs.square, range(10_000)))
    elapsed = time.monotonic() - t0
    assert out == [i * i for i in range(10_000)]
    print(f"10k tasks through the service double in {elapsed:.2f} s; "
          f"{service.count('POST', '/tasks')} submissions, {service.count('POST', '/tasks/status')} polls")
    assert elapsed < 30


def test_idle_thread_ends_and_restarts(client, monkeypatch):
    import skyfn.executor.service_path as executor_mod

    monkeypatch.setattr(executor_mod, "_IDLE_EXIT", 0.1)
    ex = Executor(client=client)
    assert ex.submit(funcs.square, 5).result(timeout=5) == 25
    first = ex._thread
    first.join(timeout=5)
    assert not first.is_alive() and ex._thread is None
    assert ex.submit(funcs.square, 6).result(timeout=5) == 36
    ex.shutdown()
    assert ex._thread is None or not ex._thread.is_alive()


def test_polls_use_the_status_cursor(executor, service):
    futs = [executor.submit(funcs.slow, 0.02, i) for i in range(20)]
    futs += [executor.submit(funcs.square, i) for i in range(5)]
    assert [f.result(timeout=10) for f in futs] == list(range(20)) + [i * i for i in range(5)]
    # after the first full answer, polls only ask for what finished since the last one
    assert service.cursor_polls >= 1
