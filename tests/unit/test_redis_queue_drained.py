"""A Redis stream queue's long poll (issue 37): the wait (XREAD, which takes nothing) and the
receive call after it go to Redis in one pipeline, so the call runs as soon as the wait
ends; after a receive that emptied the stream the long poll starts with that wait instead
of a receive call that could only find nothing new. Nothing sent meanwhile, nothing sent
during the wait and no expired lease is missed. Real redis-server; the client is redis-py's
own, recording what it sends (tests/recording_redis.py)."""
from __future__ import annotations

import threading
import time

import redis

from skyfn.protocol.queues import RedisStreamQueue
from tests.recording_redis import RecordingRedis


def _queue(redis_url: str, name: str, consumer: str = "agent-1", visibility_timeout: float = 30.0):
    client = RecordingRedis.from_url(redis_url, socket_timeout=30)
    q = RedisStreamQueue(name, client=client, consumer=consumer, visibility_timeout=visibility_timeout)
    q.ensure()
    return q, client


def test_after_a_receive_that_emptied_the_stream_the_long_poll_waits_first(redis_url, unique):
    q, client = _queue(redis_url, f"tasks-{unique}")
    producer = RedisStreamQueue(f"tasks-{unique}", url=redis_url)
    try:
        producer.send([b"one"])
        assert [m.body for m in q.receive(max_messages=10, wait_seconds=2)] == [b"one"]

        client.sent.clear()
        timer = threading.Timer(0.3, producer.send, args=([b"two"],))
        timer.start()
        try:
            got = q.receive(max_messages=10, wait_seconds=5)
        finally:
            timer.join()
        assert [m.body for m in got] == [b"two"]
        # no receive call before the wait; the wait and the call that leased "two": one round trip
        assert client.sent == [("XREAD", "FCALL")]
    finally:
        producer.close()
        q.close()


def test_a_message_sent_between_two_receives_is_taken_at_once(redis_url, unique):
    q, client = _queue(redis_url, f"tasks-{unique}")
    producer = RedisStreamQueue(f"tasks-{unique}", url=redis_url)
    try:
        producer.send([b"one"])
        assert [m.body for m in q.receive(max_messages=10, wait_seconds=2)] == [b"one"]
        producer.send([b"two", b"three"])  # before the next receive: the wait must not hide them
        got = q.receive(max_messages=10, wait_seconds=20)
        assert [m.body for m in got] == [b"two", b"three"]
    finally:
        producer.close()
        q.close()


def test_a_long_poll_on_a_quiet_queue_waits_and_receives_in_one_round_trip(redis_url, unique):
    q, client = _queue(redis_url, f"tasks-{unique}")
    producer = RedisStreamQueue(f"tasks-{unique}", url=redis_url)
    try:
        timer = threading.Timer(0.3, producer.send, args=([b"late"],))
        timer.start()
        try:
            got = q.receive(max_messages=10, wait_seconds=5)
        finally:
            timer.join()
        assert [m.body for m in got] == [b"late"]
        assert client.sent[-1] == ("XREAD", "FCALL")
    finally:
        producer.close()
        q.close()


def test_a_full_receive_calls_the_function_first_more_may_be_waiting(redis_url, unique):
    q, client = _queue(redis_url, f"tasks-{unique}")
    producer = RedisStreamQueue(f"tasks-{unique}", url=redis_url)
    try:
        producer.send([b"a", b"b", b"c"])
        assert [m.body for m in q.receive(max_messages=2, wait_seconds=2)] == [b"a", b"b"]
        client.sent.clear()
        assert [m.body for m in q.receive(max_messages=2, wait_seconds=2)] == [b"c"]
        assert client.sent[0] == "FCALL"
    finally:
        producer.close()
        q.close()


def test_an_expired_lease_is_still_redelivered_to_the_long_poll(redis_url, unique):
    """The wait after an emptying receive does not know other leases' deadlines: the
    expired message comes when that wait ends, with its delivery counted."""
    q, _ = _queue(redis_url, f"tasks-{unique}", visibility_timeout=0.2)
    producer = RedisStreamQueue(f"tasks-{unique}", url=redis_url)
    try:
        producer.send([b"lost"])
        first = q.receive(max_messages=10, wait_seconds=2)
        assert [(m.body, m.delivery_count) for m in first] == [(b"lost", 1)]
        # never deleted: its lease expires, and the next long poll hands it out again
        again = []
        for _ in range(10):
            again = q.receive(max_messages=10, wait_seconds=1)
            if again:
                break
        assert [(m.body, m.delivery_count) for m in again] == [(b"lost", 2)]
    finally:
        producer.close()
        q.close()


def test_the_long_poll_mends_a_stream_removed_or_a_library_flushed_behind_its_back(redis_url, unique):
    """The pipelined receive call fails when the group or the functions are gone; the plain
    call then recreates the group, or loads the library, as it always did."""
    q, _ = _queue(redis_url, f"tasks-{unique}")
    producer = RedisStreamQueue(f"tasks-{unique}", url=redis_url)
    admin = redis.Redis.from_url(redis_url)
    try:
        producer.send([b"one"])
        assert [m.body for m in q.receive(max_messages=10, wait_seconds=2)] == [b"one"]
        admin.delete(f"tasks-{unique}")  # stream and group gone
        admin.function_flush()
        assert q.receive(max_messages=10, wait_seconds=0.5) == []
        producer.send([b"two"])
        assert [m.body for m in q.receive(max_messages=10, wait_seconds=2)] == [b"two"]
    finally:
        admin.close()
        producer.close()
        q.close()


def test_an_empty_long_poll_leaves_the_next_one_to_wait_first(redis_url, unique):
    """An idle endpoint's poll: after a wait that found nothing, the next long poll is one
    round trip (the wait and the receive call), not a receive call first; a message sent
    between them, or during the wait, is still taken."""
    q, client = _queue(redis_url, f"tasks-{unique}")
    producer = RedisStreamQueue(f"tasks-{unique}", url=redis_url)
    try:
        assert q.receive(max_messages=10, wait_seconds=0.2) == []
        client.sent.clear()
        assert q.receive(max_messages=10, wait_seconds=0.2) == []
        assert q.receive(max_messages=10, wait_seconds=0.2) == []
        assert client.sent == [("XREAD", "FCALL"), ("XREAD", "FCALL")]

        producer.send([b"between"])  # sent while no poll waits: the next wait sees it at once
        assert [m.body for m in q.receive(max_messages=10, wait_seconds=5)] == [b"between"]
        assert q.receive(max_messages=10, wait_seconds=0.2) == []
        timer = threading.Timer(0.3, producer.send, args=([b"during"],))
        timer.start()
        try:
            got = q.receive(max_messages=10, wait_seconds=5)
        finally:
            timer.join()
        assert [m.body for m in got] == [b"during"]
    finally:
        producer.close()
        q.close()


def test_an_empty_long_poll_remembers_when_a_lease_falls_due(redis_url, unique):
    """A lease held elsewhere expires during the next long poll: that poll's first wait
    ends when it falls due (not at the end of the poll), and the message is redelivered
    by the same poll."""
    name = f"tasks-{unique}"
    q, client = _queue(redis_url, name, consumer="agent-1")
    other, _ = _queue(redis_url, name, consumer="agent-2", visibility_timeout=1.0)
    producer = RedisStreamQueue(name, url=redis_url)
    try:
        producer.send([b"held"])
        assert [m.body for m in other.receive(max_messages=10, wait_seconds=2)] == [b"held"]
        assert q.receive(max_messages=10, wait_seconds=0.1) == []  # sees the lease, due in ~1 s
        client.sent.clear()
        started = time.monotonic()
        got = q.receive(max_messages=10, wait_seconds=30)
        assert [(m.body, m.delivery_count) for m in got] == [(b"held", 2)]
        assert time.monotonic() - started < 20  # due in ~1 s: a poll that waited its 30 s missed it
        assert client.sent[0] == ("XREAD", "FCALL")
    finally:
        producer.close()
        other.close()
        q.close()
