"""Idempotent submission when the first attempt fails half way: a retry with the same
idempotency key creates nothing twice, sends what the failed attempt did not, and an
attempt that died holding the key delays a retry for a few seconds only (503, which
clients retry), never for good. Real redis-server and moto behind the API handler."""
from __future__ import annotations

import time

import orjson
import pytest

from skyfn.protocol import pack_args, serialize_function
from lambdas.adapters.redis_store.connection import redis_client


def triple(x):
    return 3 * x


@pytest.fixture
def fn_id(api):
    status, body = api.call("POST", "/functions", {"function": serialize_function(triple), "name": "triple"})
    assert status == 201
    return body["function_id"]


@pytest.fixture
def ep_id(api):
    status, body = api.call("POST", "/endpoints", {"name": "cluster"})
    assert status == 201
    return body["endpoint_id"]


def _request(ep_id, fn_id, key, n=6):
    return {"endpoint_id": ep_id, "idempotency_key": key,
            "tasks": [{"function_id": fn_id, "payload": pack_args((i,), {})} for i in range(n)]}


def _states(ids):
    from lambdas.core import deps

    return [deps.store().record(t).get("s") for t in ids]


def test_retry_after_the_queue_failed_sends_the_stored_tasks_once(api, fn_id, ep_id):
    from lambdas.core import deps

    r = redis_client()
    stream = f"tasks:{ep_id}"
    r.delete(stream)
    r.set(stream, "not a stream")  # XADD now fails: the attempt stores its tasks, then cannot queue them
    status, body = api.call("POST", "/tasks", _request(ep_id, fn_id, "k-queue"))
    assert status == 503 and "retry" in body["message"]
    stored = sorted(k.decode()[2:] for k in r.scan_iter("t:*"))
    assert len(stored) == 6 and set(_states(stored)) == {"QUEUED"}  # kept for the retry, not failed

    r.delete(stream)
    r.xgroup_create(stream, "agents", id="0", mkstream=True)
    status, body = api.call("POST", "/tasks", _request(ep_id, fn_id, "k-queue"))
    assert status == 202 and sorted(body["task_ids"]) == stored  # the same tasks, none created twice
    assert len(list(r.scan_iter("t:*"))) == 6
    sent = [t["task_id"] for _, fields in r.xrange(stream) for t in orjson.loads(fields[b"b"])["tasks"]]
    assert sorted(sent) == stored  # each sent once
    status, again = api.call("POST", "/tasks", _request(ep_id, fn_id, "k-queue"))
    assert status == 200 and again["replayed"] and again["task_ids"] == body["task_ids"]
    assert r.xlen(stream) == 1


def test_retry_of_an_attempt_that_died_before_answering_resends_only_queued_tasks(api, fn_id, ep_id):
    from lambdas.core import deps
    from lambdas.results import apply_pack
    from skyfn.protocol.messages import ResultPack, TaskResult

    status, body = api.call("POST", "/tasks", _request(ep_id, fn_id, "k-died"))
    assert status == 202
    ids = body["task_ids"]
    apply_pack(ResultPack(endpoint_id=ep_id, results=[TaskResult(task_id=ids[0], state="SUCCEEDED", result="json 3.11\n0")]))
    r = redis_client()
    # as if the service died after queueing, before storing its answer
    r.delete("idem:alice:k-died")
    r.delete(f"tasks:{ep_id}")
    r.xgroup_create(f"tasks:{ep_id}", "agents", id="0", mkstream=True)
    status, body2 = api.call("POST", "/tasks", _request(ep_id, fn_id, "k-died"))
    assert status == 202 and body2["task_ids"] == ids and body2["submission_id"] == body["submission_id"]
    assert _states(ids) == ["SUCCEEDED"] + ["QUEUED"] * 5  # the finished one is not reset
    resent = [t["task_id"] for _, f in r.xrange(f"tasks:{ep_id}") for t in orjson.loads(f[b"b"])["tasks"]]
    assert sorted(resent) == sorted(ids[1:])


def test_retry_of_an_attempt_that_died_between_the_slices_of_its_create(api, fn_id, ep_id):
    """The store creates a large submission a slice at a time (rows.SLICE): an attempt that
    stopped after its first slice leaves the rest to the retry, which creates them, sends the
    submission's queued tasks and writes its history record once."""
    from lambdas.adapters.redis_store.rows import SLICE
    from lambdas.core import deps

    r = redis_client()
    status, body = api.call("POST", "/tasks", _request(ep_id, fn_id, "k-sliced", n=SLICE + 40))
    assert status == 202
    ids = body["task_ids"]
    # as if the service died after the first slice: no later slice, nothing queued, no answer
    r.delete("idem:alice:k-sliced", "outbox", f"load:{ep_id}", *[f"t:{t}" for t in ids[SLICE:]])
    r.delete(f"tasks:{ep_id}")
    r.xgroup_create(f"tasks:{ep_id}", "agents", id="0", mkstream=True)
    status, body2 = api.call("POST", "/tasks", _request(ep_id, fn_id, "k-sliced", n=SLICE + 40))
    assert status == 202 and body2["task_ids"] == ids
    assert _states(ids) == ["QUEUED"] * (SLICE + 40)
    sent = [t["task_id"] for _, f in r.xrange(f"tasks:{ep_id}") for t in orjson.loads(f[b"b"])["tasks"]]
    assert sorted(sent) == sorted(ids)
    assert [e for e in r.lrange("outbox", 0, -1) if e.startswith(b"sub:")] and r.llen("outbox") == 1


def test_a_key_held_by_a_dead_attempt_is_free_again_after_its_claim(api, fn_id, ep_id):
    from lambdas.core import deps

    assert deps.store().idempotent_claim("alice", "k-held", seconds=1)  # an attempt that then died
    status, body = api.call("POST", "/tasks", _request(ep_id, fn_id, "k-held"))
    assert status == 503 and "still being processed" in body["message"]
    time.sleep(1.2)
    status, body = api.call("POST", "/tasks", _request(ep_id, fn_id, "k-held"))
    assert status == 202 and len(body["task_ids"]) == 6


def test_a_key_reused_for_a_different_request_is_a_conflict(api, fn_id, ep_id):
    assert api.call("POST", "/tasks", _request(ep_id, fn_id, "k-reuse"))[0] == 202
    status, body = api.call("POST", "/tasks", _request(ep_id, fn_id, "k-reuse", n=2))
    assert status == 409 and "new key" in body["message"]


def test_keys_of_different_users_never_share_tasks(api, other_api, fn_id, ep_id):
    status, body = api.call("POST", "/tasks", _request(ep_id, fn_id, "same-key"))
    assert status == 202
    status, other = other_api.call("POST", "/tasks", _request(ep_id, fn_id, "same-key"))
    assert status == 404  # mallory cannot use alice's endpoint or function, whatever the key


@pytest.mark.parametrize("key", ["0192e1a1f00d7abc8def0123456789ab", "user-chosen-key"])
def test_a_keyed_answer_is_kept_as_its_task_count_and_replays_the_same_ids(api, fn_id, ep_id, key):
    """The answer kept for replays is b'k:<n>' (its ids derive from the key), not the ids."""
    from lambdas.core import deps

    status, first = api.call("POST", "/tasks", _request(ep_id, fn_id, key, n=50))
    assert status == 202 and len(first["task_ids"]) == 50
    assert redis_client().get(f"idem:alice:{key}") == b"k:50"
    status, again = api.call("POST", "/tasks", _request(ep_id, fn_id, key, n=50))
    assert status == 200 and again["replayed"] is True
    assert (again["submission_id"], again["task_ids"]) == (first["submission_id"], first["task_ids"])
