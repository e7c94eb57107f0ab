"""Every final-state write of the hot store returns the Notices of the completion-stream
entries it added (issue 13: every final state is pushed, not only results), on a real
redis-server: exactly one notice per task that became final, none for a task already
final (each write is idempotent), and the notices chained in cursor order, so a client
that follows them misses no entry and sees no false gap."""
from __future__ import annotations

import time
import uuid

import pytest

from lambdas.adapters.redis_store.rows import CANCEL_REASON
from lambdas.adapters.redis_store.store import TaskStore
from skyfn.protocol.push import cursor_key


@pytest.fixture
def store(redis_url):
    return TaskStore.from_url(redis_url)


def _create(store: TaskStore, owner: str, n: int, max_retries: int = 0, endpoint: str = "ep1") -> list[str]:
    ids = [str(uuid.uuid4()) for _ in range(n)]
    now = time.time()
    store.create(owner, "sub", [[tid, "fn", endpoint, max_retries] for tid in ids], now, now)
    return ids


def _lease_expired(store: TaskStore, ids: list[str]) -> None:
    store.progress([[tid, "RUNNING", time.time(), -10] for tid in ids])


def _entries(store: TaskStore, owner: str) -> list[tuple[str, list[str]]]:
    return [(eid.decode(), fields[b"ids"].decode().split(",")) for eid, fields in store.r.xrange(f"done:{owner}")]


def test_cancel_returns_one_notice_and_none_when_retried_or_final(store):
    a, b = _create(store, "alice", 2)
    before = store.done_cursor("alice")
    state, endpoint, notices = store.cancel("alice", a)
    assert (state, endpoint) == ("OK", "ep1")
    (n,) = notices
    assert (n.owner, n.prev, n.cursor, n.ids) == ("alice", before, store.done_cursor("alice"), [a])
    assert n.statuses == {a: ("CANCELLED", None, None, CANCEL_REASON)}
    assert store.cancel("alice", a) == ("OK", "ep1", [])  # a retried cancel succeeds, unannounced
    assert store.cancel("mallory", b) is None  # not hers: no write, no notice
    store.finish([[b, "SUCCEEDED", "r", None, None, ""]])
    assert store.cancel("alice", b) == ("SUCCEEDED", None, [])
    assert [ids for _, ids in _entries(store, "alice")] == [[a], [b]]


def test_expired_leases_past_their_budget_give_one_notice_per_owner(store):
    a_fail = _create(store, "alice", 3, max_retries=0)
    a_retry = _create(store, "alice", 2, max_retries=1)
    b_fail = _create(store, "bob", 1, max_retries=0)
    _lease_expired(store, a_fail + a_retry + b_fail)
    requeued, failed, notices = store.expire_leases()
    assert (requeued, failed) == (2, 4)
    by_owner = {n.owner: n for n in notices}
    assert sorted(by_owner) == ["alice", "bob"] and len(notices) == 2
    assert sorted(by_owner["alice"].ids) == sorted(a_fail) and by_owner["bob"].ids == b_fail
    for n in notices:
        assert n.prev == "0-0" and n.cursor == store.done_cursor(n.owner)
        for tid in n.ids:
            state, result, error, reason = n.statuses[tid]
            assert (state, result, error) == ("FAILED", None, None)
            assert reason == store.record(tid)["why"] and "retry budget max_retries=0 exhausted" in reason
    assert store.expire_leases() == (0, 0, [])  # nothing left to expire: nothing announced
    # a final task left in the lease set (a lease renewed after its result) is not failed again
    store.r.zadd("leases", {a_fail[0]: time.time() - 10})
    assert store.expire_leases() == (0, 0, [])
    # the requeued ones fail when their next lease expires past the budget: one more notice
    _lease_expired(store, a_retry)
    _, failed, (n,) = store.expire_leases()
    assert failed == 2 and sorted(n.ids) == sorted(a_retry) and n.prev == by_owner["alice"].cursor
    assert all("lease expired 2 times" in st[3] for st in n.statuses.values())


def test_finish_and_fail_unqueued_skip_tasks_already_final(store):
    ids = _create(store, "alice", 4)
    store.cancel("alice", ids[0])
    stored, dup, unknown, (n,) = store.finish([[ids[0], "FAILED", None, None, "late", ""],
                                               [ids[1], "FAILED", None, None, "dead-lettered", ""],
                                               ["no-such-task", "FAILED", None, None, "x", ""]])
    assert (stored, dup, unknown) == (1, 1, 1)
    assert n.ids == [ids[1]] and n.statuses == {ids[1]: ("FAILED", None, None, "dead-lettered")}
    notices = store.fail_unqueued(ids, "could not be queued: refused")
    assert [sorted(x.ids) for x in notices] == [sorted(ids[2:])]
    assert set(notices[0].statuses.values()) == {("FAILED", None, None, "could not be queued: refused")}
    assert store.fail_unqueued(ids, "again") == []
    assert store.finish([[ids[3], "SUCCEEDED", "r", None, None, ""]]) == (0, 1, 0, [])


def test_memo_hits_announce_only_the_tasks_they_create(store):
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    row = lambda tid: [tid, "fn", "ep1", "cached", "mk", None]  # noqa: E731
    created, (n,) = store.create_memo_hits_notify("alice", "sub", [row(first)], time.time())
    assert created == 1 and n.ids == [first] and n.statuses == {first: ("SUCCEEDED", "cached", None, None)}
    # a retried submission: the existing task is left alone and not announced again
    created, (m,) = store.create_memo_hits_notify("alice", "sub", [row(first), row(second)], time.time())
    assert created == 1 and m.ids == [second] and list(m.statuses) == [second] and m.prev == n.cursor
    assert store.create_memo_hits_notify("alice", "sub", [row(first), row(second)], time.time()) == (0, [])


def test_every_path_chains_its_notices_in_cursor_order(store):
    """Mixed final-state writes for one owner: the notices, in the order they were
    returned, are exactly the entries of the owner's completion stream, each naming the
    one before it; every task appears in exactly one."""
    start = store.done_cursor("alice")
    notices = []
    ids = _create(store, "alice", 12, max_retries=0)
    notices += store.finish_notify([[ids[0], "SUCCEEDED", "r", None, None, ""],
                                    [ids[1], "FAILED", None, "err", None, ""]], "ep1")[3]
    notices += store.cancel("alice", ids[2])[2]
    _lease_expired(store, ids[3:5])
    notices += store.expire_leases()[2]
    notices += store.cancel("alice", ids[5])[2]
    notices += store.finish([[ids[6], "TIMED_OUT", None, None, "walltime", ""]])[3]
    notices += store.fail_unqueued(ids[7:9], "not routed")
    notices += store.create_memo_hits_notify("alice", "sub", [[str(uuid.uuid4()), "fn", "ep1", "c", "k", None]],
                                             time.time())[1]
    _lease_expired(store, [ids[9]])
    notices += store.expire_leases()[2]
    notices += store.cancel("alice", ids[10])[2]
    # and the repeats, which announce nothing
    notices += store.cancel("alice", ids[2])[2] + store.fail_unqueued(ids[:11], "again")
    notices += store.finish_notify([[ids[0], "SUCCEEDED", "r", None, None, ""]], "ep1")[3]

    assert [(n.cursor, n.ids) for n in notices] == _entries(store, "alice")
    assert [n.prev for n in notices] == [start] + [n.cursor for n in notices[:-1]]
    keys = [cursor_key(n.cursor) for n in notices]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    announced = [tid for n in notices for tid in n.ids]
    assert len(announced) == len(set(announced)) == 11 + 1  # ids[0..10] and the memo hit
    assert ids[11] not in announced  # still queued
