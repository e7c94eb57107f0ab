"""The results event-source mapping on the real Redis stream adapter: successes are
deleted, batchItemFailures stay for redelivery, exceptions keep everything, and a Redis
restart is survived."""
from __future__ import annotations

import threading
import time

import pytest

from infra.local.standins.event_source import EventSourceMapping, failed_ids, redis_results_queue
from infra.local.processes import free_port, start_redis


class Recorder:
    def __init__(self, decide=lambda record: True):
        self.decide = decide
        self.events = []
        self.lock = threading.Lock()

    def __call__(self, event, context):
        with self.lock:
            self.events.append(event)
        failures = [{"itemIdentifier": r["messageId"]} for r in event["Records"] if not self.decide(r)]
        return {"batchItemFailures": failures}

    def records(self):
        with self.lock:
            return [r for e in self.events for r in e["Records"]]


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_sqs_shaped_event_and_partial_failures(redis_url, unique):
    name = f"results-{unique}"
    producer = redis_results_queue(redis_url, name)
    producer.ensure()
    handler = Recorder(decide=lambda r: r["body"] != "bad" or r["attributes"]["ApproximateReceiveCount"] == "2")
    esm = EventSourceMapping(lambda: redis_results_queue(redis_url, name, visibility_timeout=1.0), handler,
                             wait_seconds=0.2).start()
    try:
        producer.send([b"good-1", b"bad", b"good-2"])
        assert wait_until(lambda: len(handler.records()) >= 3)
        first = handler.records()[:3]
        record = first[0]
        assert set(record) >= {"messageId", "receiptHandle", "body", "attributes", "messageAttributes",
                               "eventSource", "eventSourceARN", "awsRegion", "md5OfBody"}
        assert record["eventSource"] == "aws:sqs" and record["eventSourceARN"].endswith(f":{name}")
        assert record["attributes"]["ApproximateReceiveCount"] == "1"
        assert sorted(r["body"] for r in first) == ["bad", "good-1", "good-2"]
        # the failed record comes back after its visibility timeout, and only it
        assert wait_until(lambda: len(handler.records()) >= 4)
        again = handler.records()[3:]
        assert [r["body"] for r in again] == ["bad"]
        assert again[0]["attributes"]["ApproximateReceiveCount"] == "2"
        assert wait_until(lambda: producer.depth() == 0)
        time.sleep(1.5)
        assert len(handler.records()) == 4  # successes were deleted: never redelivered
    finally:
        esm.stop()
        producer.close()


def test_handler_exception_keeps_the_whole_batch(redis_url, unique):
    name = f"results-{unique}"
    producer = redis_results_queue(redis_url, name)
    producer.ensure()
    calls = []

    def flaky(event, context):
        calls.append([r["body"] for r in event["Records"]])
        if len(calls) == 1:
            raise RuntimeError("handler crashed")
        return {"batchItemFailures": []}

    esm = EventSourceMapping(lambda: redis_results_queue(redis_url, name, visibility_timeout=1.0), flaky,
                             wait_seconds=0.2).start()
    try:
        producer.send([b"a", b"b"])
        assert wait_until(lambda: sum(len(c) for c in calls) >= 4)
        assert sorted(calls[0]) == ["a", "b"] and sorted(b for c in calls[1:] for b in c) == ["a", "b"]
        assert wait_until(lambda: producer.depth() == 0)
        assert esm.alive()
    finally:
        esm.stop()
        producer.close()


def test_failures_naming_unknown_records_fail_the_batch():
    assert failed_ids(None, {"a"}) == set()
    assert failed_ids({"batchItemFailures": []}, {"a"}) == set()
    assert failed_ids({"batchItemFailures": [{"itemIdentifier": "a"}]}, {"a", "b"}) == {"a"}
    with pytest.raises(ValueError):
        failed_ids({"batchItemFailures": [{"itemIdentifier": "zzz"}]}, {"a"})
    with pytest.raises(TypeError):
        failed_ids("ok", {"a"})


def test_survives_a_redis_restart(tmp_path):
    port = free_port()
    server = start_redis(tmp_path / "redis", port)
    url = server.url
    producer = redis_results_queue(url, "results")
    producer.ensure()
    handler = Recorder()
    esm = EventSourceMapping(lambda: redis_results_queue(url, "results"), handler, wait_seconds=0.2,
                             max_backoff=0.5).start()
    try:
        producer.send([b"before"])
        assert wait_until(lambda: len(handler.records()) == 1)
        server.stop()
        time.sleep(1.0)  # the mapping sees connection errors and backs off
        server = start_redis(tmp_path / "redis", port)  # same directory: the AOF brings the stream back
        producer.send([b"after"])
        assert wait_until(lambda: [r["body"] for r in handler.records()] == ["before", "after"], timeout=15)
        assert esm.alive() and esm.stats["errors"] >= 1
    finally:
        esm.stop()
        producer.close()
        server.stop()
