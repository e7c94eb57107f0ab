"""The hot store's create script on a real redis-server: a keyed submission's retry is told,
in the same round trip, that its tasks exist already (`only_if_new`), and nothing changes."""
from __future__ import annotations

import time
import uuid

from lambdas.adapters.redis_store.store import TaskStore


def test_create_only_if_new_refuses_a_retry_and_changes_nothing(redis_url):
    store = TaskStore.from_url(redis_url)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    rows = [[tid, "fn", "ep1", 0] for tid in ids]
    now = time.time()
    assert store.create("alice", "sub", rows, now, now, only_if_new=True) == 3
    before = {tid: store.r.hgetall(f"t:{tid}") for tid in ids}
    load = store.r.hgetall("load:ep1")
    outbox = store.r.llen("outbox")
    assert store.create("alice", "sub", rows, now + 1, now + 1, submission_record={"x": 1}, only_if_new=True) == -1
    assert {tid: store.r.hgetall(f"t:{tid}") for tid in ids} == before
    assert store.r.hgetall("load:ep1") == load == {b"_": b"3"}
    assert store.r.llen("outbox") == outbox  # no second submission record
    fresh = [[str(uuid.uuid4()), "fn", "ep1", 0]]
    assert store.create("alice", "sub", fresh, now, now, only_if_new=True) == 1
    assert store.create("alice", "sub", rows, now, now) == 3  # unguarded: written again, as before


def test_a_large_submission_is_created_a_slice_per_script_call(redis_url):
    """Each call holds Redis for its whole run: 600 tasks go in ceil(600 / SLICE) calls, each
    all or none; all are created and counted, the submission record is written once (with
    the last slice) and only the first slice is checked for a retry."""
    from lambdas.adapters.redis_store.rows import SLICE

    store = TaskStore.from_url(redis_url)
    rows = [[str(uuid.uuid4()), "fn", "ep1", 0] for _ in range(600)]
    now = time.time()
    calls = lambda: int(store.r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))  # noqa: E731
    before = calls()
    assert store.create("alice", "sub", rows, now, now, submission_record={"x": 1}, only_if_new=True) == 600
    assert SLICE < 600 and calls() - before == -(-600 // SLICE)
    assert all(store.r.hget(f"t:{row[0]}", "s") == b"QUEUED" for row in rows)
    assert store.r.hgetall("load:ep1") == {b"_": b"600"} and store.r.lrange("outbox", 0, -1) == [b'sub:{"x":1}']
    assert store.create("alice", "sub", rows, now, now, submission_record={"x": 1}, only_if_new=True) == -1
    assert store.r.hgetall("load:ep1") == {b"_": b"600"} and store.r.llen("outbox") == 1
