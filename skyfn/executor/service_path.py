"""The Executor's one background thread (``skyfn-executor``): everything it says to the service.

1. sends queued submissions as POST /tasks batches by group commit: what is queued leaves
   at once when no request is in flight, what is submitted while one is leaves together in
   the next (at most ``batch_size`` a request), so a lone call never waits and a tight
   submit loop still batches; each request has its own idempotency key so a retried
   request creates nothing twice. ``batch_interval`` > 0 (opt-in) lingers up to that long
   for company instead;
2. sends DELETE /tasks/{id} for futures cancelled by the user;
3. gets results: pushed over the service's WebSocket API when it has one (skyfn/executor/push.py:
   the thread waits on the socket and the executor's wake-up pipe with one ``select``),
   else, and whenever the connection is down, by long-polling POST /tasks/status for all
   outstanding task ids with ``wait`` (the service answers as soon as any is final).

It never sleeps between polls (the server's long poll paces it); it backs off only after
errors. A submission that fails after the transport's retries, or a status poll that keeps
failing for ``max_poll_failures`` rounds, sets the error on the futures concerned; an
unexpected error in the thread fails every pending future. The thread ends after
``_IDLE_EXIT`` seconds with nothing to do; the executor starts another on the next submit.
It shares the executor's State (skyfn/executor/state.py) under its lock.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any, Callable, Optional

from skyfn.submission import split_requests
from skyfn.dataflow import announce
from skyfn.executor.future import SkyfnFuture
from skyfn.executor.inputs import name_inputs
from skyfn.executor.progress import ProgressBar
from skyfn.executor.state import State, set_exception
from skyfn.http import SkyfnAPIError
from skyfn.protocol.limits import MAX_STATUS_IDS

log = logging.getLogger("skyfn.executor")

# A submission stream is considered paused when no new submission arrived for this long.
_QUIET = 0.0003
# The background thread ends after this long with nothing to do (a later submit restarts it),
# so executors that are never shut down do not keep threads forever.
_IDLE_EXIT = 10.0
# Long-poll wait while the user is still submitting, so new work is not held up long.
_BUSY_WAIT = 0.05


class ServicePath:
    def __init__(self, state: State, client: Any, *, endpoint_id: Optional[str], group_id: Optional[str],
                 memoize: Optional[bool], user_config: Optional[dict], task_options: Callable[[], dict],
                 batch_size: int, batch_interval: float, poll_wait: float, max_poll_failures: int,
                 bar: ProgressBar, pushed: Any, wake_r: int, direct: bool):
        self.state = state
        self.cv = state.cv
        self.client = client
        self.endpoint_id = endpoint_id
        self.group_id = group_id
        self.memoize = memoize
        self.user_config = user_config
        self.task_options = task_options  # read per batch: the executor's options as they are then
        self.batch_size = batch_size
        self.batch_interval = batch_interval
        self.poll_wait = poll_wait
        self.max_poll_failures = max_poll_failures
        self.bar = bar
        self.pushed = pushed  # skyfn.executor.push.PushedResults, or None: long-poll only
        self.wake_r = wake_r  # the read end of the executor's wake-up pipe (with pushed)
        self.direct = direct  # the executor has a direct channel: it drives the progress bar
        self.thread: Optional[threading.Thread] = None
        self._poll_offset = 0
        self._poll_failures = 0

    def start(self) -> None:
        """Start the thread (call with the state's lock held, when `thread` is None)."""
        self.thread = threading.Thread(target=self.run, name="skyfn-executor", daemon=True)
        self.thread.start()

    def run(self) -> None:
        """The thread's loop: batches, cancels, results; never leaves a future hanging."""
        st = self.state
        try:
            self.bar.open("executor")
            while True:
                batch: list = []
                cancels: list[str] = []
                with self.cv:
                    while True:
                        if st.to_cancel:
                            cancels = list(st.to_cancel)
                            st.to_cancel.clear()
                            break
                        if st.queue:
                            now = time.monotonic()
                            if self.batch_interval:  # opt-in linger: until submissions pause, at most batch_interval
                                due = min(st.last_enqueued + _QUIET, st.first_enqueued + self.batch_interval)
                                lone = len(st.queue) == 1 and not st.outstanding and not st.inflight
                            else:  # group commit: this thread has no request in flight here
                                due, lone = now, True
                            if (st.flush_now or st.shutdown or lone or len(st.queue) >= self.batch_size
                                    or now >= due):
                                batch = st.queue[: self.batch_size]
                                del st.queue[: len(batch)]
                                st.inflight = [item[0] for item in batch]
                                if not st.queue:
                                    st.flush_now = False
                                else:
                                    st.first_enqueued = now
                                break
                            self.cv.wait(due - now)
                            continue
                        if st.outstanding:
                            break
                        if self.pushed is not None and self.pushed.connected and not st.shutdown:
                            break  # wait on the push socket (it closes itself when idle)
                        if not self.direct:
                            self.bar.update(idle=True)
                        if st.shutdown and not st.deferring():
                            return
                        if not self.cv.wait(_IDLE_EXIT) and not (st.queue or st.outstanding or st.to_cancel):
                            self.thread = None  # idle: end; the next submit starts a new thread
                            return
                if cancels:
                    self._send_cancels(cancels)
                elif batch:
                    self._send_batch(batch)
                    if self.pushed is not None:
                        self.pushed.drain()
                elif self.pushed is not None and self.pushed.ensure():
                    self.pushed.wait(self.wake_r)
                elif st.outstanding:
                    self._poll()
                if not self.direct:
                    self.bar.update()
        except BaseException as exc:  # never leave futures hanging
            log.exception("skyfn executor thread failed")
            self.fail_everything(exc)
        finally:
            if self.pushed is not None:
                self.pushed.close()
            if not self.direct:
                self.bar.close()

    def _send_batch(self, batch: list[tuple[SkyfnFuture, str, str]]) -> None:
        st = self.state
        if self.pushed is not None and not self.pushed.connected:
            self.pushed.ensure()  # subscribed before the tasks exist: no catching up needed
        live = [item for item in batch if not item[0].cancelled()]
        dropped = len(batch) - len(live)
        with self.cv:
            st.inflight = [item[0] for item in live]
            st.n_submitted -= dropped
        if not live:
            return
        opts = self.task_options()
        tasks = [{"function_id": fid, "payload": payload, **opts} for _, fid, payload in live]
        flow = False
        for task, (fut, _, _) in zip(tasks, live):
            if fut.data_locations:
                task["data_locations"] = fut.data_locations
            if fut.inputs:  # named per request below; here for the request's size
                task["inputs"] = fut.inputs
                flow = True
        start = 0
        for chunk in split_requests(tasks, max_tasks=self.batch_size):
            items = live[start : start + len(chunk)]
            start += len(chunk)
            if flow:  # after the earlier requests' answers: their tasks have ids now
                name_inputs(items, chunk, self._send_request)
            else:
                self._send_request(items, chunk, len(items))

    def _send_request(self, items: list[tuple], tasks: list[dict], taken: int) -> None:
        """POST /tasks for `tasks` (of `items`); `taken`: how many in-flight items this
        accounts for, those left out because an input could not be named included."""
        st = self.state
        try:
            ids = self.client.submit_tasks(tasks, self.endpoint_id, group_id=self.group_id, memoize=self.memoize,
                                           user_config=self.user_config) if tasks else []
        except Exception as exc:  # already retried with the same idempotency key
            with self.cv:
                st.inflight = st.inflight[taken:]
                st.n_submitted -= taken
            for fut, _, _ in items:
                set_exception(fut, exc)
            announce()  # calls of other executors may wait for these
            return
        cancelled = []
        with self.cv:
            st.inflight = st.inflight[taken:]
            st.n_submitted -= taken - len(items)
            outstanding = st.outstanding
            for (fut, _, _), tid in zip(items, ids):
                fut.task_id = tid
                if fut.cancelled():
                    cancelled.append(tid)
                outstanding[tid] = fut
            if cancelled:
                st.to_cancel.update(cancelled)
        announce()  # calls of other executors may wait for these ids

    def _send_cancels(self, task_ids: list[str]) -> None:
        for tid in task_ids:
            try:
                self.client.cancel(tid)
            except Exception as exc:  # the local future is cancelled either way
                log.warning("could not cancel task %s: %s", tid, exc)
        with self.cv:
            for tid in task_ids:
                self.state.outstanding.pop(tid, None)

    def _poll(self) -> None:
        st = self.state
        with self.cv:
            n = len(st.outstanding)
            if n == 0:
                return
            # With every outstanding id in the request, the previous answer's cursor makes
            # the service return only tasks finished since then (O(finished), not
            # O(outstanding)). Tasks submitted later finish later, so none is missed.
            # A partial window must not use it: finishes outside the window would be skipped.
            whole = n <= MAX_STATUS_IDS
            if whole:
                ids = list(st.outstanding)
            else:  # more than one request holds: rotate through windows, oldest first
                start = self._poll_offset if self._poll_offset < n else 0
                ids = list(itertools.islice(st.outstanding, start, start + MAX_STATUS_IDS))
                self._poll_offset = start + len(ids)
                st.cursor = None
            busy = bool(st.queue) or time.monotonic() - st.last_enqueued < self.poll_wait
        wait = min(self.poll_wait, _BUSY_WAIT) if busy else self.poll_wait
        t0 = time.monotonic()
        try:
            answer = self.client.status(ids, wait=wait, cursor=st.cursor)
        except Exception as exc:
            self._poll_failed(ids, exc)
            return
        self._poll_failures = 0
        # ids answered `later` (read from the history in parts) are asked again without a cursor
        st.cursor = answer.get("cursor") if whole and not answer.get("later") else None
        if not st.apply_answer(answer) and wait > 0.05 and time.monotonic() - t0 < wait / 2:
            time.sleep(0.01)  # the service did not honour wait: do not spin on it

    def _poll_failed(self, ids: list[str], exc: Exception) -> None:
        st = self.state
        permanent = isinstance(exc, SkyfnAPIError) and 400 <= exc.status < 500 and exc.status != 429
        self._poll_failures += 1
        if permanent or self._poll_failures > self.max_poll_failures:
            log.error("giving up on %d tasks after %d failed status polls: %s", len(ids), self._poll_failures, exc)
            with self.cv:
                futs = [st.outstanding.pop(tid) for tid in ids if tid in st.outstanding]
            for fut in futs:
                set_exception(fut, exc)
            self._poll_failures = 0
            return
        log.warning("status poll failed (%d/%d): %s", self._poll_failures, self.max_poll_failures, exc)
        with self.cv:  # back off, but wake for shutdown/cancel
            self.cv.wait(min(0.2 * 2 ** self._poll_failures, 5.0))

    def fail_everything(self, exc: BaseException) -> None:
        st = self.state
        with self.cv:
            futs = [item[0] for item in st.queue] + st.inflight + list(st.outstanding.values()) + list(st.deferred)
            st.queue.clear()
            st.inflight = []
            st.outstanding.clear()
            st.deferred.clear()
            st.broken = exc
        err = exc if isinstance(exc, Exception) else RuntimeError(f"skyfn executor stopped: {exc!r}")
        for fut in futs:
            set_exception(fut, err)
