"""A stopping agent does not wait out its pollers' long polls (endpoint_agent/service/poller.py):
`stop()` returns while the poll is still blocked, nothing is handed on after it, and what the
abandoned poll takes is released at once, not after its lease: the next consumer receives it
(a real redis-server and RedisStreamQueue; the lease is long, so only a release explains a
prompt redelivery)."""
from __future__ import annotations

import threading

from endpoint_agent.service.poller import STOP_WAIT_S, ControlPoller, Poller
from skyfn.protocol.messages import ControlMessage, TaskPack, TaskSpec
from skyfn.protocol.queues import RedisStreamQueue

LEASE_S = 600.0  # a message not released stays invisible for this long


def _pack(i: int) -> bytes:
    return TaskPack(pack_id=f"p{i}", endpoint_id="ep", tasks=[TaskSpec(task_id=f"t{i}", function_id="f", payload="")]
                    ).model_dump_json().encode()


def _successor(redis_url: str, name: str) -> RedisStreamQueue:
    q = RedisStreamQueue(name, url=redis_url, consumer="next-agent", visibility_timeout=LEASE_S)
    q.ensure()
    return q


def test_a_stop_leaves_the_long_poll_and_releases_what_it_takes(redis_url, unique):
    name = f"tasks-{unique}"
    delivered: list = []
    polled = RedisStreamQueue(name, url=redis_url, consumer="agent", visibility_timeout=LEASE_S)
    polled.ensure()
    poller = Poller(polled, capacity=8, receive_batch=10, receive_wait=20, lease_seconds=LEASE_S,
                    load=lambda: 0, deliver=lambda batch, n: delivered.extend(batch))
    producer = RedisStreamQueue(name, url=redis_url)
    nxt = _successor(redis_url, name)
    try:
        poller.start()
        producer.send([_pack(1)])
        for _ in range(200):
            if delivered:
                break
            threading.Event().wait(0.05)
        assert [d[1].pack_id for d in delivered] == ["p1"]  # while running: handed on

        poller.stop()
        assert poller.is_alive()  # its 20 s poll is still blocked: the stop did not wait for it
        producer.send([_pack(2)])  # the abandoned poll takes it...
        poller.join(30)
        assert not poller.is_alive()
        assert [d[1].pack_id for d in delivered] == ["p1"]  # ...and hands nothing on after the stop
        got = nxt.receive(max_messages=10, wait_seconds=10)  # released: not hidden for its 600 s lease
        assert [(TaskPack.model_validate_json(m.body).pack_id, m.delivery_count) for m in got] == [("p2", 2)]
    finally:
        poller.stop()
        producer.close()
        nxt.close()


def test_a_stopped_control_poller_releases_cancellations_for_the_next_agent(redis_url, unique):
    name = f"control-{unique}"
    cancelled: list = []
    polled = RedisStreamQueue(name, url=redis_url, consumer="agent", visibility_timeout=LEASE_S)
    polled.ensure()
    poller = ControlPoller(polled, receive_wait=20, cancel=cancelled.extend)
    producer = RedisStreamQueue(name, url=redis_url)
    nxt = _successor(redis_url, name)
    try:
        poller.start()
        threading.Event().wait(0.5)  # its poll under way
        poller.stop()
        poller.join(STOP_WAIT_S)
        producer.send([ControlMessage(cancel=["t9"]).model_dump_json().encode()])
        poller.join(30)
        assert not poller.is_alive() and cancelled == []
        got = nxt.receive(max_messages=10, wait_seconds=10)
        assert [ControlMessage.model_validate_json(m.body).cancel for m in got] == [["t9"]]
    finally:
        poller.stop()
        producer.close()
        nxt.close()
