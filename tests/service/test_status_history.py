"""POST /tasks/status for tasks purged from the hot store, through the real API handler on a
real redis-server and moto: they are answered from the durable history, a bounded part a
call (HISTORY_PAGES seconds of task ids); the ids beyond are answered `later`, never
`unknown`, which names only ids the service has no task for. Asked again, they are
answered."""
from __future__ import annotations

import time

import pytest

from lambdas import history
from lambdas.adapters.redis_store.connection import redis_client
from lambdas.core.tasks import tasks as tasks_core
from lambdas.results import apply_pack
from skyfn.protocol import pack_args, serialize_function
from skyfn.protocol.ids import uuid7s
from skyfn.protocol.messages import ResultPack, TaskResult


def inc(x):
    return x + 1


@pytest.fixture
def purged(api):
    """Three tasks of alice's, one per second, finished, archived and purged from Redis."""
    _, fn = api.call("POST", "/functions", {"function": serialize_function(inc)})
    _, ep = api.call("POST", "/endpoints", {"name": "cluster"})
    ids = []
    for i in range(3):
        if i:
            time.sleep(1.05)  # a task id of another second: another page group of the history
        status, sub = api.call("POST", "/tasks", {"endpoint_id": ep["endpoint_id"], "tasks": [
            {"function_id": fn["function_id"], "payload": pack_args((i,), {})}]})
        assert status == 202, sub
        ids += sub["task_ids"]
    apply_pack(ResultPack(endpoint_id=ep["endpoint_id"],
                          results=[TaskResult(task_id=t, state="FAILED", reason=f"boom {t}") for t in ids]))
    while history.flush()["taken"]:
        pass
    r = redis_client()
    for tid in ids:
        assert r.hget(f"t:{tid}", "h") is not None, "not archived"
        r.delete(f"t:{tid}")
    return ids


def test_purged_tasks_beyond_one_calls_share_of_the_history_are_later_not_unknown(purged, api, monkeypatch):
    monkeypatch.setattr(tasks_core, "HISTORY_PAGES", 1)
    never = uuid7s(1)[0]  # an id of this second no task has
    asked = purged + [never]
    status, answer = api.call("POST", "/tasks/status", {"task_ids": asked})
    assert status == 200
    assert list(answer["tasks"]) == purged[:1] and answer["tasks"][purged[0]]["state"] == "FAILED"
    assert answer["later"] == purged[1:] + [never] and answer["unknown"] == []
    seen = dict(answer["tasks"])
    for _ in range(3):  # asked again for what was left: one more second of the history each time
        status, answer = api.call("POST", "/tasks/status", {"task_ids": answer["later"]})
        seen.update(answer["tasks"])
        if not answer["later"]:
            break
    assert sorted(seen) == sorted(purged) and answer["unknown"] == [never]
    assert {t: s["reason"] for t, s in seen.items()} == {t: f"boom {t}" for t in purged}


def test_within_one_calls_share_every_purged_task_is_answered_at_once(purged, api):
    status, answer = api.call("POST", "/tasks/status", {"task_ids": purged})
    assert status == 200 and sorted(answer["tasks"]) == sorted(purged)
    assert answer["later"] == [] and answer["unknown"] == []
