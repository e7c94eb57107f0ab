"""The queue poller: long-polls the endpoint's task queue and hands task packs on.

Runs in its own thread with its own queue connection. A receive that fails after `stop()`
ends the thread without a warning. A stop does not wait out a long poll in progress (up to
`receive_wait`, 20 s at most): the agent leaves the thread after STOP_WAIT_S, and whatever
that poll still takes is released at once (its lease set to expire now), so the next
agent, or this one restarted, receives it without waiting for the lease. It takes more only while the
agent holds fewer than `capacity` (workers + prefetch) tasks, and asks for as many
messages as should fill the room, judging by the pack sizes seen so far. Each body is
a JSON TaskPack; a body that does not parse is logged and left unacknowledged, so the
queue dead-letters it after its maximum deliveries.
"""
from __future__ import annotations

import logging
import math
import threading
from typing import Callable

from pydantic import ValidationError

from skyfn.protocol.messages import TaskPack
from skyfn.protocol.queues.base import TaskQueue
from skyfn.protocol.states import now

log = logging.getLogger("skyfn.agent.poller")

Delivery = tuple[str, TaskPack, float]  # (receipt, pack, received at)

STOP_WAIT_S = 2.0  # how long a stopping agent waits for a poller's long poll before leaving it


def _release(queue: TaskQueue, messages: list) -> None:
    """Hand back messages a poll took after its poller was stopped: visible again now."""
    if not messages:
        return
    try:
        queue.extend([m.receipt for m in messages], visibility_timeout=0)
    except Exception as exc:  # noqa: BLE001 - their leases run out by themselves
        log.warning("cannot release %d messages taken while stopping (%s); they return when their lease ends",
                    len(messages), exc)


class ControlPoller(threading.Thread):
    """Long-polls the endpoint's control queue (ControlMessage bodies from the service) and
    hands cancellations to `cancel(task_ids)`; each message is deleted once handed on."""

    def __init__(self, queue: TaskQueue, *, receive_wait: float, cancel: Callable[[list[str]], None]):
        super().__init__(name="skyfn-control", daemon=True)
        self.queue = queue
        self.receive_wait = receive_wait
        self.cancel = cancel
        self._halt = threading.Event()
        self.cancels = 0

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        from skyfn.protocol.messages import ControlMessage

        delay = 0.2
        while not self._halt.is_set():
            try:
                messages = self.queue.receive(max_messages=10, wait_seconds=max(0.05, self.receive_wait),
                                              visibility_timeout=30)
                delay = 0.2
            except Exception as exc:  # noqa: BLE001 - the queue may be down for a while
                if self._halt.is_set():  # stopped meanwhile: no warning, no retry
                    break
                log.warning("receive from control queue %s failed (%s); retrying in %.1f s", self.queue.name, exc,
                            delay)
                self._halt.wait(delay)
                delay = min(10.0, delay * 2)
                continue
            if self._halt.is_set():  # stopped during the poll: the next agent takes them
                _release(self.queue, messages)
                break
            ids: list[str] = []
            for m in messages:
                try:
                    ids.extend(ControlMessage.model_validate_json(m.body).cancel)
                except ValidationError as exc:
                    log.error("control message %s is not a ControlMessage, dropping it: %s", m.message_id,
                              str(exc).replace("\n", "; ")[:300])
            if ids:
                self.cancels += len(ids)
                self.cancel(ids)
            if messages:
                try:
                    self.queue.delete([m.receipt for m in messages])
                except Exception as exc:  # noqa: BLE001 - redelivered later; cancelling twice is harmless
                    log.warning("cannot delete control messages (%s)", exc)
        try:
            self.queue.close()
        except Exception:  # noqa: BLE001
            pass


class Poller(threading.Thread):
    def __init__(self, queue: TaskQueue, *, capacity: "int | Callable[[], int]", receive_batch: int, receive_wait: float,
                 lease_seconds: float, load: Callable[[], int], deliver: Callable[[list[Delivery], int], None]):
        super().__init__(name="skyfn-poller", daemon=True)
        self.queue = queue
        self.capacity = capacity
        self.receive_batch = receive_batch
        self.receive_wait = receive_wait
        self.lease_seconds = lease_seconds
        self.load = load
        self.deliver = deliver
        self.room = threading.Event()
        self._halt = threading.Event()
        self._handing = threading.Lock()  # held while a poll's packs are handed on
        self.avg_pack = 64.0
        self.received_messages = 0
        self.received_tasks = 0
        self.bad_messages = 0

    def stop(self) -> None:
        """No pack is handed on after this returns (one being handed on is finished first);
        a long poll in progress is left to end by itself, and what it takes is released."""
        self._halt.set()
        self.room.set()
        with self._handing:
            pass

    def run(self) -> None:
        delay = 0.2
        while not self._halt.is_set():
            self.room.clear()
            cap = self.capacity
            room = (cap() if callable(cap) else cap) - self.load()
            if room <= 0:
                self.room.wait(0.25)
                continue
            n = max(1, min(self.receive_batch, math.ceil(room / max(1.0, self.avg_pack))))
            try:
                messages = self.queue.receive(max_messages=n, wait_seconds=self.receive_wait,
                                              visibility_timeout=self.lease_seconds)
                delay = 0.2
            except Exception as exc:  # noqa: BLE001 - the queue may be down for a while
                if self._halt.is_set():  # stopped meanwhile: no warning, no retry
                    break
                log.warning("receive from task queue %s failed (%s); retrying in %.1f s", self.queue.name, exc, delay)
                self._halt.wait(delay)
                delay = min(10.0, delay * 2)
                continue
            if not messages:
                continue
            with self._handing:
                halted = self._halt.is_set()
                if not halted:
                    self._hand_on(messages)
            if halted:  # stopped during the poll: the next agent takes them
                _release(self.queue, messages)
                break
        try:
            self.queue.close()
        except Exception:  # noqa: BLE001
            pass

    def _hand_on(self, messages: list) -> None:
        """Parse the packs and hand them on (a body that does not parse is left to dead-letter)."""
        ts = now()
        batch: list[Delivery] = []
        n_tasks = 0
        for m in messages:
            try:
                pack = TaskPack.model_validate_json(m.body)
            except ValidationError as exc:
                self.bad_messages += 1
                log.error("task message %s (delivery %d) is not a valid TaskPack, leaving it to dead-letter: %s",
                          m.message_id, m.delivery_count, str(exc).replace("\n", "; ")[:500])
                continue
            batch.append((m.receipt, pack, ts))
            n_tasks += len(pack.tasks)
            self.avg_pack = 0.7 * self.avg_pack + 0.3 * max(1, len(pack.tasks))
        self.received_messages += len(messages)
        self.received_tasks += n_tasks
        if batch:
            self.deliver(batch, n_tasks)
