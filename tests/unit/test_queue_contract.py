"""The task-queue contract (skyfn/protocol/queues/base.py), run unchanged against both
adapters: Redis Streams on a real redis-server and SQS on moto in server mode."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from skyfn.protocol.api import QueueDescriptor
from skyfn.protocol.queues import Message, RedisStreamQueue, SqsQueue, TaskQueue, open_queue


@pytest.fixture(params=["redis", "sqs"])
def make_queue(request, unique):
    """make_queue(consumer=..., visibility_timeout=..., max_deliveries=...) -> a handle on
    the test's queue; several handles are several consumers of the same queue."""
    created: list[TaskQueue] = []
    name = f"tasks-{unique}"
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")

        def build(consumer, visibility_timeout, max_deliveries):
            return RedisStreamQueue(name, url=url, consumer=consumer, visibility_timeout=visibility_timeout,
                                    max_deliveries=max_deliveries)
    else:
        request.getfixturevalue("aws_endpoint")

        def build(consumer, visibility_timeout, max_deliveries):
            return SqsQueue(name, visibility_timeout=visibility_timeout, max_deliveries=max_deliveries)

    def make(consumer: str = "agent-1", visibility_timeout: float = 30.0, max_deliveries: int = 5) -> TaskQueue:
        queue = build(consumer, visibility_timeout, max_deliveries)
        queue.ensure()
        created.append(queue)
        return queue

    yield make
    for queue in created:
        queue.close()


def test_round_trip_of_bytes(make_queue):
    q = make_queue()
    bodies = [b"hello", json.dumps({"task": "\u00e9\u4e2d"}).encode(), b"\x00\xff\xfe binary", b"",
              "tab\there".encode()]
    ids = q.send(bodies)
    assert len(ids) == len(bodies) and len(set(ids)) == len(bodies)

    got = q.receive(max_messages=10, wait_seconds=1)

    assert sorted(m.body for m in got) == sorted(bodies)
    assert {m.message_id: m.body for m in got} == dict(zip(ids, bodies))
    assert all(isinstance(m, Message) and m.delivery_count == 1 and m.receipt for m in got)


def test_send_of_nothing_is_a_no_op(make_queue):
    q = make_queue()
    assert q.send([]) == []
    assert q.receive(wait_seconds=0) == []
    assert q.depth() == 0


def test_one_receive_returns_many_messages(make_queue):
    q = make_queue()
    bodies = [f"task-{i}".encode() for i in range(50)]
    q.send(bodies)

    first = q.receive(max_messages=20, wait_seconds=1)
    rest = q.receive(max_messages=50, wait_seconds=1)

    assert len(first) == 20
    assert len(rest) == 30
    assert sorted(m.body for m in first + rest) == sorted(bodies)


def test_long_poll_returns_when_a_message_arrives(make_queue):
    q = make_queue()
    producer = make_queue(consumer="producer")
    timer = threading.Timer(0.5, producer.send, args=([b"late"],))
    started = time.monotonic()
    timer.start()
    try:
        got = q.receive(max_messages=10, wait_seconds=8)
    finally:
        timer.join()
    elapsed = time.monotonic() - started

    assert [m.body for m in got] == [b"late"]
    assert 0.4 <= elapsed < 4


def test_redis_long_poll_longer_than_redis_pys_default_socket_timeout(redis_url, unique):
    """redis-py 8 times a socket out after 5 s by default: a long poll of 7 s on a quiet
    queue must come back empty, not raise a TimeoutError half way."""
    q = RedisStreamQueue(f"quiet-{unique}", url=redis_url)
    q.ensure()
    started = time.monotonic()
    try:
        assert q.receive(max_messages=10, wait_seconds=7) == []
    finally:
        q.close()
    assert time.monotonic() - started >= 6.9


def test_long_poll_returns_nothing_after_the_wait(make_queue):
    q = make_queue()
    started = time.monotonic()
    assert q.receive(max_messages=10, wait_seconds=1) == []
    elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 3


def test_leased_message_is_invisible_to_another_consumer(make_queue):
    a = make_queue(consumer="agent-a")
    b = make_queue(consumer="agent-b")
    a.send([f"m{i}".encode() for i in range(20)])

    got_a = a.receive(max_messages=10, visibility_timeout=5)
    got_b = b.receive(max_messages=20, visibility_timeout=5)

    assert len(got_a) == 10 and len(got_b) == 10
    assert {m.message_id for m in got_a}.isdisjoint({m.message_id for m in got_b})
    assert b.receive(max_messages=10) == []
    assert a.receive(max_messages=10) == []


def test_expired_lease_is_redelivered_with_a_higher_count(make_queue):
    # the queue default (30 s) is overridden per receive
    a = make_queue(consumer="agent-a")
    b = make_queue(consumer="agent-b")
    [mid] = a.send([b"work"])
    [first] = a.receive(visibility_timeout=1)
    assert (first.message_id, first.delivery_count) == (mid, 1)
    assert b.receive() == []

    started = time.monotonic()
    # a long poll that is already waiting gets the message when its lease expires
    got = b.receive(wait_seconds=5, visibility_timeout=5)
    elapsed = time.monotonic() - started

    assert [(m.message_id, m.body, m.delivery_count) for m in got] == [(mid, b"work", 2)]
    assert elapsed < 3


def test_extend_keeps_the_message_invisible(make_queue):
    a = make_queue(consumer="agent-a")
    b = make_queue(consumer="agent-b")
    [mid] = a.send([b"long task"])
    [msg] = a.receive(visibility_timeout=1)

    a.extend([msg.receipt], visibility_timeout=3)
    time.sleep(1.5)
    assert b.receive() == []

    got = b.receive(wait_seconds=4)
    assert [(m.message_id, m.delivery_count) for m in got] == [(mid, 2)]


def test_extend_uses_the_queue_default_timeout(make_queue):
    a = make_queue(consumer="agent-a", visibility_timeout=3)
    b = make_queue(consumer="agent-b", visibility_timeout=3)
    a.send([b"x"])
    [msg] = a.receive(visibility_timeout=1)
    a.extend([msg.receipt])
    time.sleep(1.5)
    assert b.receive() == []


def test_deleted_message_is_never_redelivered(make_queue):
    q = make_queue()
    ids = q.send([b"a", b"b", b"c"])
    got = q.receive(max_messages=3, visibility_timeout=1)
    assert len(got) == 3
    keep = next(m for m in got if m.body == b"b")

    q.delete([m.receipt for m in got if m is not keep])

    assert q.depth() == 1
    again = q.receive(max_messages=10, wait_seconds=4)
    assert [(m.message_id, m.body, m.delivery_count) for m in again] == [(keep.message_id, b"b", 2)]
    q.delete([again[0].receipt])
    assert q.depth() == 0
    assert q.receive(max_messages=10, wait_seconds=1, visibility_timeout=1) == []
    assert set(ids) >= {keep.message_id}


def test_message_goes_to_the_dead_letter_queue_after_max_deliveries(make_queue):
    q = make_queue(visibility_timeout=1, max_deliveries=2)
    [mid] = q.send([b"poison"])
    q.send([b"healthy"])

    counts = []
    for _ in range(2):
        got = {m.body: m for m in q.receive(max_messages=10, wait_seconds=4)}
        counts.append(got[b"poison"].delivery_count)
        q.delete([m.receipt for body, m in got.items() if body == b"healthy"])
    assert counts == [1, 2]

    # its third delivery would exceed max_deliveries: it is dead-lettered instead
    assert q.receive(max_messages=10, wait_seconds=2.5) == []
    assert q.depth() == 0

    dead = q.dead_letters(max_messages=10)
    assert [(m.message_id, m.body, m.delivery_count) for m in dead] == [(mid, b"poison", 2)]
    assert q.dead_letters(max_messages=10) == []


def test_depth_counts_visible_and_in_flight_messages(make_queue):
    q = make_queue()
    assert q.depth() == 0
    q.send([b"1", b"2", b"3", b"4", b"5"])
    assert q.depth() == 5

    got = q.receive(max_messages=2)
    assert len(got) == 2
    assert q.depth() == 5

    q.delete([m.receipt for m in got])
    assert q.depth() == 3


@pytest.mark.parametrize("kind", ["redis", "sqs"])
@pytest.mark.parametrize("as_model", [False, True])
def test_open_queue_from_a_descriptor(request, kind, as_model, unique):
    name = f"opened-{unique}"
    if kind == "redis":
        url, expected = request.getfixturevalue("redis_url"), RedisStreamQueue
    else:
        request.getfixturevalue("aws_endpoint")
        probe = SqsQueue(name)
        probe.ensure()
        url, expected = probe.url, SqsQueue
        probe.close()
    fields = {"kind": kind, "name": name, "url": url}
    descriptor = QueueDescriptor(**fields) if as_model else fields

    q = open_queue(descriptor, consumer="agent-x", visibility_timeout=2, max_deliveries=3)
    try:
        assert isinstance(q, expected)
        assert (q.name, q.visibility_timeout, q.max_deliveries) == (name, 2, 3)
        q.send([b"via descriptor"])
        assert [m.body for m in q.receive(wait_seconds=1)] == [b"via descriptor"]
    finally:
        q.close()


def test_open_queue_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match="unknown queue kind 'kafka'"):
        open_queue({"kind": "kafka", "name": "q", "url": "x"})


def test_importing_the_port_loads_no_sdk():
    code = ("import sys, skyfn.protocol.queues; "
            "print(sorted(m for m in ('boto3', 'botocore', 'redis') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
