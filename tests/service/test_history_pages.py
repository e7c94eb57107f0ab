"""The durable history as pages (lambdas/adapters/history_pages.py) on moto's DynamoDB, and
the drain that fills it (lambdas/history.py) from a real redis-server: tasks found again by
id (time-ordered ids and others), an owner's listing since a time, newest first and exact at
its cut, pages split by count and size, a batch written twice read once, and a drain that
keeps going while the outbox holds work, marking and expiring what it archived."""
from __future__ import annotations

import os
import time
import uuid

import pytest

from skyfn.protocol.ids import uuid7s
from lambdas.adapters.redis_store.connection import redis_client

T0 = 1_790_000_000.0  # a fixed time, minutes apart below


def task(tid: str, owner: str, created: float, state: str = "SUCCEEDED", error: str | None = None) -> dict:
    return {"task_id": tid, "owner": owner, "function_id": "f", "endpoint_id": "e", "submission_id": "s",
            "state": state, "retries": 0, "created": created, "events": f"CREATED@{created};{state}@{created + 1};",
            "reason": None, "error": error}


@pytest.fixture
def history(service_env):
    from lambdas.core import deps

    return deps.dynamo()


def test_tasks_are_found_by_id_and_only_by_their_owner(history):
    timed = uuid7s(3, ms=int(T0 * 1000))
    other = [str(uuid.uuid4()) for _ in range(3)]  # not time-ordered: filed by their first two hex
    history.write_bulk([], [task(t, "alice", T0 + i) for i, t in enumerate(timed + other)]
                       + [task(uuid7s(1, ms=int(T0 * 1000))[0], "bob", T0)])
    assert history.get_task("alice", timed[1])["created"] == T0 + 1
    assert history.get_task("alice", other[2])["created"] == T0 + 5
    got = history.get_tasks("alice", timed + other + [str(uuid.uuid4())])
    assert sorted(got) == sorted(timed + other) and {g["owner"] for g in got.values()} == {"alice"}
    assert history.get_task("bob", timed[0]) is None and history.get_tasks("mallory", other) == {}


def test_an_owners_listing_is_newest_first_and_exact_at_since(history):
    ids = uuid7s(300, ms=int(T0 * 1000))
    tasks = [task(t, "alice", T0 + 20 * i) for i, t in enumerate(ids)]  # 100 minutes of tasks
    history.write_bulk([], tasks[:150])
    history.write_bulk([], tasks[150:] + [task(str(uuid.uuid4()), "alice", T0 + 20 * 299 + 5)])
    since = T0 + 20 * 250 + 1
    got = history.tasks_since("alice", since, 10_000)
    expected = sorted([t["created"] for t in tasks[251:]] + [T0 + 20 * 299 + 5], reverse=True)
    assert [g["created"] for g in got] == expected and len(expected) == 50
    assert len(history.tasks_since("alice", T0, 30)) == 30
    assert history.tasks_since("bob", T0, 100) == []


def test_pages_split_by_count_and_by_size(history):
    from lambdas.adapters import history_pages

    ids = uuid7s(2_500, ms=int(T0 * 1000))  # one second of one owner: one bucket, one minute
    assert history.write_bulk([], [task(t, "alice", T0) for t in ids]) == 3
    big = uuid7s(16, ms=int(T0 * 1000) + 2000)
    noise = [os.urandom(30_000).hex() for _ in big]  # 60 KB of text each, about 30 KB compressed
    assert 16 * 30_000 > history_pages.PAGE_MAX_BYTES  # more than one page can hold
    pages = history.write_bulk([], [task(t, "alice", T0, "FAILED", n) for t, n in zip(big, noise)])
    assert pages >= 2
    got = history.get_tasks("alice", ids + big)
    assert len(got) == 2_516 and got[big[15]]["error"] == noise[15]


def test_a_batch_written_twice_is_read_once(history):
    ids = uuid7s(10, ms=int(T0 * 1000))
    tasks = [task(t, "alice", T0) for t in ids]
    history.write_bulk([], tasks)
    history.write_bulk([], tasks)  # the same batch again: same pages
    history.write_bulk([], tasks[:4])  # part of it in another batch: another page, read once
    assert len(history.history_table.scan()["Items"]) == 3  # two pages and one marker
    assert sorted(g["task_id"] for g in history.tasks_since("alice", T0 - 1, 100)) == sorted(ids)


def test_the_drain_keeps_going_while_the_outbox_holds_work(service_env, api, monkeypatch):
    """5,000 finished tasks in batches of 2,000: one invocation archives them all, marks them
    and gives each record its expiry; the outbox is left empty."""
    from lambdas import history
    from lambdas.core import deps
    from tests.service.conftest import Context

    store = deps.store()
    now = time.time()
    ids = uuid7s(5_000)
    store.create("alice", "sub-1", [[t, "fn", "ep1", 0] for t in ids], now, now)
    store.finish([[t, "SUCCEEDED", "json 3.11\n1", None, None, ""] for t in ids])
    store.status("alice", ids[:10])  # ten of them read
    monkeypatch.setenv("SKYFN_HISTORY_BATCH", "2000")
    deps.reset()
    out = history.handler({}, Context())
    assert (out["batches"], out["tasks"], store.outbox_length(), store.archived_count()) == (3, 5_000, 0, 5_000)
    r = redis_client()
    assert 0 < r.ttl(f"t:{ids[0]}") <= 600 and r.ttl(f"t:{ids[-1]}") > 6 * 86400  # read / never read
    assert len(deps.dynamo().get_tasks("alice", ids[::50])) == 100


def test_a_drain_takes_at_most_max_batches_when_bounded(service_env, monkeypatch):
    """SKYFN_HISTORY_MAX_BATCHES bounds one invocation (what a slower archive looks like:
    the soak benchmark's backpressure run); the rest waits in the outbox."""
    from lambdas import history
    from lambdas.core import deps
    from tests.service.conftest import Context

    store = deps.store()
    now = time.time()
    ids = uuid7s(3_000)
    store.create("alice", "sub-1", [[t, "fn", "ep1", 0] for t in ids], now, now)
    store.finish([[t, "SUCCEEDED", "json 3.11\n1", None, None, ""] for t in ids])
    monkeypatch.setenv("SKYFN_HISTORY_BATCH", "1000")
    monkeypatch.setenv("SKYFN_HISTORY_MAX_BATCHES", "2")
    deps.reset()
    out = history.handler({}, Context())
    assert (out["batches"], out["tasks"], store.outbox_length()) == (2, 2_000, 1_000)


def test_a_drain_batch_holds_redis_a_slice_at_a_time(service_env):
    """A batch of 1,000 records is read and marked in slices of rows.SLICE, one script call
    each (a call holds Redis for its whole run), and every record is read and marked."""
    from lambdas.adapters.redis_store.rows import SLICE
    from lambdas.core import deps

    store = deps.store()
    r = redis_client()
    now = time.time()
    ids = uuid7s(1_000)
    store.create("alice", "sub-1", [[t, "fn", "ep1", 0] for t in ids], now, now)
    store.finish([[t, "SUCCEEDED", "json 3.11\n1", None, None, ""] for t in ids])

    def script_calls() -> int:
        return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

    before = script_calls()
    records = store.records(ids + ["gone"])
    after_read = script_calls()
    marked = store.mark_archived(ids)
    after_mark = script_calls()
    slices = -(-1_000 // SLICE)
    assert SLICE < 1_000 and after_read - before == -(-1_001 // SLICE) and after_mark - after_read == slices
    assert [rec["task_id"] for rec in records] == ids and {rec["s"] for rec in records} == {"SUCCEEDED"}
    assert marked == 1_000 == store.archived_count()
    assert all(r.hget(f"t:{t}", "h") == b"1" and r.ttl(f"t:{t}") > 6 * 86400 for t in ids[::97] + ids[-1:])
