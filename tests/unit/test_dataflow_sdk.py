"""The SDK's half of dataflow (issue 26), without a service: finding futures and TaskRefs among
arguments (skyfn.dataflow), naming a request's inputs (skyfn.executor.inputs.name_inputs), keeping
"#k" right across requests, and turning a dependent's FAILED status into DependencyFailed."""
from __future__ import annotations

import concurrent.futures as cf
import threading
from collections import OrderedDict, defaultdict, namedtuple

import pytest

from skyfn import DependencyFailed, TaskRef, TaskFailed
from skyfn.client import split_requests, task_outcome
from skyfn.dataflow import announce, bind_inputs, check_inputs, find_inputs, rebase_local_inputs, settle, wait_for_id
from skyfn.executor.future import SkyfnFuture
from skyfn.executor.inputs import name_inputs
from skyfn.executor.state import set_exception
from skyfn.protocol.dataflow import DEPENDENCY_FAILED, Input
from skyfn.protocol.remote_exception import wrap_exception

Point = namedtuple("Point", "x y")
A_ID = "0190a5e1-0000-7000-8000-00000000000a"
B_ID = "0190a5e1-0000-7000-8000-00000000000b"


# -- finding inputs -----------------------------------------------------------------------------

def test_arguments_without_inputs_come_back_as_they_are():
    args, kwargs = (1, [2, 3], {"a": (4,)}), {"k": {5}}
    got = find_inputs(args, kwargs)
    assert got[0] is args and got[1] is kwargs and got[2] == []


def test_futures_in_nested_containers_become_placeholders_in_order():
    a, b = SkyfnFuture(), SkyfnFuture()
    args, kwargs, found = find_inputs((a, [1, (b, {"k": a})]), {"s": {b, 2}, "p": Point(a, [b])})
    assert found == [a, b]  # the same future twice is one input
    assert args == (Input(0), [1, (Input(1), {"k": Input(0)})])
    assert kwargs == {"s": {Input(1), 2}, "p": Point(Input(0), [Input(1)])}
    assert type(kwargs["p"]) is Point


def test_task_refs_and_futures_with_the_same_id_are_one_input():
    a = SkyfnFuture()
    a.task_id = A_ID
    _, _, found = find_inputs((TaskRef(A_ID), a, TaskRef(A_ID), TaskRef(B_ID)), {})
    assert found == [TaskRef(A_ID), TaskRef(B_ID)]


def test_mapping_subclasses_keep_their_type_and_order():
    a = SkyfnFuture()
    od = OrderedDict([("z", a), ("y", 1)])
    dd = defaultdict(list, {"k": [a]})
    (got_od, got_dd), _, found = find_inputs((od, dd), {})
    assert type(got_od) is OrderedDict and list(got_od.items()) == [("z", Input(0)), ("y", 1)]
    assert type(got_dd) is defaultdict and got_dd.default_factory is list and got_dd["k"] == [Input(0)]
    assert od["z"] is a  # the caller's containers are not changed


def test_other_objects_are_not_searched():
    a = SkyfnFuture()

    class Box:
        def __init__(self, v):
            self.v = v

    box = Box(a)
    args, _, found = find_inputs((box,), {})
    assert found == [] and args[0] is box


def test_proxies_among_the_arguments_are_not_resolved():
    """A skyfn.data Ref is a lazy proxy: isinstance() would fetch (and use up) its object here."""
    import lazy_object_proxy

    calls = []
    proxy = lazy_object_proxy.Proxy(lambda: calls.append(1) or [1, 2])
    a = SkyfnFuture()
    args, _, found = find_inputs(([proxy, a], proxy), {"p": {"k": proxy}})
    assert found == [a] and args[0][0] is proxy and args[1] is proxy
    args, kwargs, left = settle(args, {"p": {"k": proxy}}, found, {0: "value"})  # a by-value input put in
    assert left == [] and args[0] == [proxy, "value"] and kwargs["p"]["k"] is proxy
    assert calls == []


def test_a_foreign_future_is_refused():
    _, _, found = find_inputs((cf.Future(),), {})
    with pytest.raises(TypeError, match="not a skyfn future"):
        check_inputs(found)


def test_settle_puts_values_in_and_renumbers_the_rest():
    a, d, b = SkyfnFuture(), SkyfnFuture(), SkyfnFuture()
    args, kwargs, found = find_inputs(([a, d], b), {"k": d})
    args, kwargs, left = settle(args, kwargs, found, {1: "D"})
    assert left == [a, b]
    assert args == ([Input(0), "D"], Input(1)) and kwargs == {"k": "D"}


def test_bind_inputs_names_task_refs_and_waits_for_a_future_s_id():
    fut = SkyfnFuture()

    def submitted():
        fut.task_id = B_ID
        announce()

    threading.Timer(0.05, submitted).start()
    args, kwargs, names = bind_inputs((TaskRef(A_ID), fut), {"x": [fut]})
    assert names == [A_ID, B_ID] and args == (Input(0), Input(1)) and kwargs == {"x": [Input(1)]}


def test_wait_for_id_raises_what_the_submission_failed_with_or_times_out():
    failed, cancelled, stuck = SkyfnFuture(), SkyfnFuture(), SkyfnFuture()
    set_exception(failed, ConnectionError("service down"))
    cancelled.cancel()
    with pytest.raises(ConnectionError):
        wait_for_id(failed)
    with pytest.raises(cf.CancelledError):
        wait_for_id(cancelled)
    with pytest.raises(TimeoutError):
        wait_for_id(stuck, timeout=0.05)


# -- naming the inputs of one request -----------------------------------------------------------

def _items(futs):
    return [(f, "fid", "payload") for f in futs], [{"function_id": "fid", "payload": "payload"} for _ in futs]


def _requests(futs, wait=5.0):
    """The requests name_inputs sends for `futs`: ([futures], [inputs of each task], taken)."""
    sent = []
    name_inputs(*_items(futs), lambda items, tasks, taken: sent.append(
        ([it[0] for it in items], [t.get("inputs") for t in tasks], taken)), wait=wait)
    return sent


def test_inputs_are_ids_or_local_indexes_of_the_same_request():
    earlier = SkyfnFuture()
    earlier.task_id = A_ID
    a, b, c = SkyfnFuture(), SkyfnFuture(), SkyfnFuture()
    b.inputs = [a, earlier]
    c.inputs = [b, TaskRef(B_ID), a]
    assert _requests([a, b, c]) == [([a, b, c], [None, ["#0", A_ID], ["#1", B_ID, "#0"]], 3)]


def test_a_task_whose_input_cannot_be_named_is_left_out_and_ended():
    failed, cancelled = SkyfnFuture(), SkyfnFuture()
    set_exception(failed, ConnectionError("refused"))
    cancelled.cancel()
    a, b, c, d = SkyfnFuture(), SkyfnFuture(), SkyfnFuture(), SkyfnFuture()
    a.inputs = [failed]
    b.inputs = [a]  # a is left out of the request: b ends with a's error
    c.inputs = [cancelled]
    assert _requests([a, b, c, d]) == [([d], [None], 4)]  # all four accounted for
    assert isinstance(a.exception(0), ConnectionError) and isinstance(b.exception(0), ConnectionError)
    assert c.cancelled()


def test_local_indexes_count_only_the_tasks_kept():
    bad = SkyfnFuture()
    set_exception(bad, ConnectionError("refused"))
    a, b, c = SkyfnFuture(), SkyfnFuture(), SkyfnFuture()
    a.inputs = [bad]
    c.inputs = [b]
    assert _requests([a, b, c]) == [([b, c], [None, ["#0"]], 3)]


def test_what_was_named_is_sent_before_waiting_for_another_executors_future():
    mine, other, dep, after = SkyfnFuture(), SkyfnFuture(), SkyfnFuture(), SkyfnFuture()
    dep.inputs = [mine, other]
    after.inputs = [dep, mine]
    seen = []

    def sent():
        seen.append(mine.task_id)  # set by the first request: the other executor may need it
        other.task_id = B_ID
        announce()

    requests = []

    def send(items, tasks, taken):
        requests.append(([t.get("inputs") for t in tasks], taken))
        for i, (fut, _, _) in enumerate(items):
            fut.task_id = f"id-{len(requests)}-{i}"
        if len(requests) == 1:
            threading.Timer(0.05, sent).start()

    name_inputs(*_items([mine, dep, after]), send)
    assert seen == ["id-1-0"]
    assert requests == [([None], 1), ([["id-1-0", B_ID], ["#0", "id-1-0"]], 2)]


def test_an_input_that_gets_no_id_in_time_fails_its_dependent():
    stuck, dep = SkyfnFuture(), SkyfnFuture()
    dep.inputs = [stuck]
    assert _requests([dep], wait=0.05) == [([], [], 1)]
    assert isinstance(dep.exception(0), TimeoutError)


def test_submit_tasks_requests_rebase_local_inputs():
    chunk = [{"payload": "p", "inputs": ["#0", A_ID]}, {"payload": "p", "inputs": ["#3", "#1"]}, {"payload": "p"}]
    assert rebase_local_inputs(chunk, 0, []) is chunk
    got = rebase_local_inputs(chunk, 2, ["id0", "id1"])
    assert [t.get("inputs") for t in got] == [["id0", A_ID], ["#1", "id1"], None]
    assert chunk[0]["inputs"] == ["#0", A_ID]  # the caller's tasks are not changed


def test_request_size_counts_inputs():
    many = [{"payload": "x", "inputs": ["#0"] * 1000} for _ in range(10)]
    assert len(split_requests(many, max_bytes=100_000)) > 1
    assert len(split_requests([{"payload": "x"} for _ in range(10)], max_bytes=100_000)) == 1


# -- a dependent's status ----------------------------------------------------------------------

def test_dependency_failed_is_decoded_with_the_inputs_exception():
    reason = DEPENDENCY_FAILED.format(input=A_ID, state="FAILED")
    ok, exc = task_outcome(B_ID, {"state": "FAILED", "reason": reason, "error": wrap_exception(KeyError("sample 7"))})
    assert not ok and isinstance(exc, DependencyFailed) and isinstance(exc, TaskFailed)
    assert (exc.task_id, exc.input_task_id, exc.input_state, exc.reason) == (B_ID, A_ID, "FAILED", reason)
    assert isinstance(exc.cause, KeyError) and exc.__cause__ is exc.cause


def test_dependency_failed_without_an_error_and_after_a_timeout():
    reason = DEPENDENCY_FAILED.format(input=A_ID, state="TIMED_OUT") + " after 60 s"
    ok, exc = task_outcome(B_ID, {"state": "FAILED", "reason": reason})
    assert isinstance(exc, DependencyFailed) and exc.input_state == "TIMED_OUT" and exc.cause is None


def test_other_failures_are_not_dependency_failures():
    ok, exc = task_outcome(B_ID, {"state": "FAILED", "reason": "lease expired 3 times"})
    assert type(exc) is TaskFailed
    ok, exc = task_outcome(B_ID, {"state": "FAILED", "error": wrap_exception(ValueError("x")),
                                  "reason": "DependencyFailed: something else"})
    assert type(exc) is ValueError
