"""Memoization through the embedded runtime: a map run twice with memoize=True dispatches
nothing the second time (every task's events say MEMO_HIT, none was DISPATCHED) and gives
the same values; a function whose code changed runs again."""
from __future__ import annotations

from skyfn import Executor


def cube(x):
    return x ** 3


def events_of(client, task_ids):
    out = {}
    for i in range(0, len(task_ids), 5000):
        answer = client.status(task_ids[i:i + 5000], include_events=True)
        out.update({tid: [e[0] for e in st["events"]] for tid, st in answer["tasks"].items()})
    return out


def run_map(fn, values, **kw):
    with Executor(endpoint="local", **kw) as ex:
        futures = [ex.submit(fn, v) for v in values]
        results = [f.result(timeout=120) for f in futures]
    return results, [f.task_id for f in futures]


def test_second_run_dispatches_nothing(client):
    values = list(range(300))
    first, first_ids = run_map(cube, values, memoize=True)
    second, second_ids = run_map(cube, values, memoize=True)
    assert first == second == [v ** 3 for v in values]
    assert not set(first_ids) & set(second_ids)
    first_events, second_events = events_of(client, first_ids), events_of(client, second_ids)
    assert all("DISPATCHED" in ev for ev in first_events.values())
    assert len(second_events) == 300
    assert all(ev == ["CREATED", "MEMO_HIT", "SUCCEEDED", "STORED"] for ev in second_events.values())


def test_changed_code_runs_again_and_memoize_off_always_runs(client):
    def make(offset):
        scope: dict = {}
        exec(f"def shifted(x):\n    return x + {offset}\n", scope)
        return scope["shifted"]

    v1, v2 = make(1), make(2)
    assert run_map(v1, [10, 20], memoize=True)[0] == [11, 21]
    results, ids = run_map(v2, [10, 20], memoize=True)  # same name and arguments, new code
    assert results == [12, 22]
    assert all("DISPATCHED" in ev for ev in events_of(client, ids).values())
    results, ids = run_map(v1, [10, 20])  # not memoized: runs although a cached answer exists
    assert results == [11, 21]
    assert all("MEMO_HIT" not in ev for ev in events_of(client, ids).values())
