"""The outbox: sends result messages, then acknowledges task messages, off the hot loop.

One thread with its own queue connections executes, in order, what the interchange hands
it: lease extensions, ResultPack bodies for the results queue, and receipts of task
messages whose every task has a result. Operations waiting together are merged into one
round of calls (extend, then send, then delete), which keeps the invariant: a task
message is deleted only after the results of all its tasks were sent. A failing call is
retried with backoff from the step that failed; nothing is dropped while the agent runs.
"""
from __future__ import annotations

import collections
import logging
import threading
import time

from skyfn.protocol.queues.base import TaskQueue

log = logging.getLogger("skyfn.agent.outbox")


class Outbox(threading.Thread):
    def __init__(self, task_queue: TaskQueue, results_queue: TaskQueue, lease_seconds: float):
        super().__init__(name="skyfn-outbox", daemon=True)
        self.task_queue = task_queue
        self.results_queue = results_queue
        self.lease_seconds = lease_seconds
        self._ops: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._busy = False
        self._closed = False
        self.on_idle = None  # called (from this thread) when the outbox runs dry
        self.sent_messages = 0
        self.acked = 0
        self.errors = 0

    # called from the interchange thread ------------------------------------------
    def put(self, bodies: list[bytes] = (), acks: list[str] = (), extend: list[str] = ()) -> None:
        if not (bodies or acks or extend):
            return
        with self._cv:
            self._ops.append((list(bodies), list(acks), list(extend)))
            self._cv.notify()

    def idle(self) -> bool:
        """Nothing queued and nothing being sent (read without the lock: a hint)."""
        return not self._busy and not self._ops

    def pending(self) -> int:
        with self._cv:
            return len(self._ops) + (1 if self._busy else 0)

    def drain(self, timeout: float) -> bool:
        """Wait until everything handed over so far is done; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._ops or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.1))
        return True

    def close(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self.join(timeout)
        for q in (self.task_queue, self.results_queue):
            try:
                q.close()
            except Exception:  # noqa: BLE001
                pass

    # the thread ------------------------------------------------------------------
    def run(self) -> None:
        while True:
            with self._cv:
                while not self._ops and not self._closed:
                    self._cv.wait()
                if not self._ops and self._closed:
                    return
                ops = list(self._ops)
                self._ops.clear()
                self._busy = True
            bodies = [b for op in ops for b in op[0]]
            acks = [r for op in ops for r in op[1]]
            extend = [r for op in ops for r in op[2]]
            try:
                self._execute(bodies, acks, extend)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
                    idle = not self._ops
                if idle and self.on_idle is not None:
                    self.on_idle()

    def _execute(self, bodies: list[bytes], acks: list[str], extend: list[str]) -> None:
        # (what, call, attempts): a lease extension is best effort (the worst outcome of
        # missing one is a redelivery), results and acks are retried until they succeed.
        steps = []
        if extend:
            steps.append(("extend leases", lambda: self.task_queue.extend(extend, self.lease_seconds), 3))
        if bodies:
            steps.append(("send results", lambda: self.results_queue.send(bodies), None))
        if acks:
            steps.append(("ack tasks", lambda: self.task_queue.delete(acks), None))
        for what, call, attempts in steps:
            delay = 0.1
            tried = 0
            while True:
                try:
                    call()
                    break
                except Exception as exc:  # noqa: BLE001 - queue down: retry, never drop
                    self.errors += 1
                    tried += 1
                    if attempts is not None and tried >= attempts:
                        log.warning("%s failed %d times (%s); skipping it", what, tried, exc)
                        break
                    if self._closed and delay > 2.0:
                        log.error("%s failed during shutdown (%s); giving up, leases will expire", what, exc)
                        return
                    log.warning("%s failed (%s); retrying in %.1f s", what, exc, delay)
                    time.sleep(delay)
                    delay = min(10.0, delay * 2)
        self.sent_messages += len(bodies)
        self.acked += len(acks)
