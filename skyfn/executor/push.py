"""How the Executor's one background thread gets results pushed (DESIGN.md 2, step 7).

``PushedResults`` belongs to one Executor and is used from its thread only; it reaches the
Executor only through the ``ChannelPort`` the core hands it (skyfn/executor/channel.py).
While its WebSocket channel (skyfn/push.py) is up, the thread waits on that socket and the
Executor's wake-up pipe with one ``select`` instead of long-polling:

- a pushed entry resolves the futures whose status came inside it; the ids without one
  (large results) are fetched with one POST /tasks/status;
- the entry's ``prev`` must be the Executor's cursor: otherwise something was missed (a
  completion not pushed, a message lost) and the thread catches up with POST /tasks/status
  from its cursor (a *gap*);
- after (re)connecting, one status read of every outstanding task covers what finished
  before the subscription;
- with tasks outstanding and nothing pushed for a while (1 s, doubling to 30 s while
  nothing is found), one non-blocking status call checks (from the cursor, then, from the
  third quiet check on, every outstanding id), so a lost last push costs time, never a result.

A dropped connection falls back to the Executor's batched long-poll at once and is
re-established in the background of the same loop (backoff up to 5 s). Futures are popped
from the outstanding map under the Executor's lock before they are resolved, so each
resolves exactly once whichever path delivers its result.
"""
from __future__ import annotations

import itertools
import logging
import os
import select
import time
from typing import Any, Optional

from skyfn.executor.channel import ChannelPort
from skyfn.protocol.limits import MAX_STATUS_IDS
from skyfn.protocol.push import cursor_key

log = logging.getLogger("skyfn.executor")

QUIET_FIRST_S = 1.0
QUIET_MAX_S = 30.0
FULL_CHECK_AFTER_S = 4.0
RECONNECT_MAX_S = 5.0


class PushedResults:
    def __init__(self, port: ChannelPort, url: str, token: str):
        self.port = port
        self.url = url
        self._token = token
        self.channel = None
        self.disabled = False
        self.retry_at = 0.0
        self.failures = 0
        self.quiet = QUIET_FIRST_S
        self.last_heard = time.monotonic()
        self.idle_since: Optional[float] = None
        self.stats = {"connects": 0, "disconnects": 0, "pushes": 0, "pushed_results": 0, "fetched": 0,
                      "gaps": 0, "resyncs": 0, "quiet_checks": 0}

    # -- connection ------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self.channel is not None and not self.channel.closed

    def ensure(self) -> bool:
        """Connected, or connected now if it is time to try; False: use the long-poll."""
        if self.connected:
            return True
        if self.channel is not None:  # it was up and went down
            self._lost()
        if self.disabled or time.monotonic() < self.retry_at:
            return False
        from skyfn.push import PushChannel, PushUnavailable

        channel = PushChannel(self.url, self._token)
        try:
            cursor = channel.connect()
        except PushUnavailable as exc:
            if exc.status in (401, 403, 404):  # no WebSocket API here, or not for this token
                log.info("results push unavailable (%s); long-polling instead", exc)
                self.disabled = True
            else:
                self._backoff(exc)
            return False
        except OSError as exc:
            self._backoff(exc)
            return False
        self.channel = channel
        self.failures = 0
        self.stats["connects"] += 1
        self.last_heard = time.monotonic()
        self.quiet = QUIET_FIRST_S
        if self.port.has_outstanding():
            self.resync(full=True)  # what finished before the subscription
        else:
            self.port.cursor = cursor
        return True

    def _backoff(self, exc: BaseException) -> None:
        self.failures += 1
        delay = min(RECONNECT_MAX_S, 0.05 * 2 ** self.failures)
        self.retry_at = time.monotonic() + delay
        log.debug("results push connection failed (%s); retrying in %.2f s", exc, delay)

    def _lost(self) -> None:
        self.stats["disconnects"] += 1
        log.info("results push connection lost; long-polling until it is back")
        self.channel = None
        self.retry_at = time.monotonic()  # the first reconnect at once

    def kill(self) -> None:
        """Drop the connection as a network fault would (tests and fault drills)."""
        channel = self.channel
        if channel is not None:
            channel.kill()

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    # -- waiting -----------------------------------------------------------------------------
    def wait(self, wake_fd: int) -> None:
        """Wait for pushes (or a wake-up, or the quiet check) and apply what arrived."""
        port = self.port
        now = time.monotonic()
        # submissions and cancels first; after shutdown() it goes on waiting for what is
        # outstanding (returning on shutdown here made the thread spin without reading)
        outstanding = port.begin_select()
        if outstanding is None:
            return
        if outstanding:
            if self.idle_since is not None:  # new work after a pause: the quiet clock starts now
                self.idle_since, self.last_heard = None, now
            timeout = max(0.0, self.last_heard + self.quiet - now)
        else:
            self.idle_since = self.idle_since or now
            timeout = max(0.0, self.idle_since + port.idle_exit - now)
        try:
            ready, _, _ = select.select([self.channel.fileno(), wake_fd], [], [], timeout)
        finally:
            port.end_select()
        if wake_fd in ready:
            try:
                os.read(wake_fd, 4096)
            except BlockingIOError:
                pass
        if self.channel.fileno() in ready:
            msgs = self.channel.read()
            if msgs is None:
                self._lost()
                return
            if msgs:
                self._apply(msgs)
        if outstanding:
            if port.has_outstanding() and time.monotonic() >= self.last_heard + self.quiet:
                self.quiet_check()  # also while others' pushes keep the socket busy
        elif not ready and self.idle_since is not None and time.monotonic() - self.idle_since >= port.idle_exit:
            self.close()  # idle: the Executor's thread may end

    def drain(self) -> None:
        """Apply what was pushed meanwhile, without waiting (between submissions of a large
        batch: the socket must not fill up while the thread is busy sending)."""
        if not self.connected:
            return
        if select.select([self.channel.fileno()], [], [], 0)[0]:
            msgs = self.channel.read()
            if msgs is None:
                self._lost()
            elif msgs:
                self._apply(msgs)

    def quiet_check(self) -> None:
        # from the cursor first; once that keeps finding nothing, every outstanding id (a
        # task whose completion the cursor already passed is found this way, whatever the cause)
        found = self.resync(full=self.quiet >= FULL_CHECK_AFTER_S)
        self.stats["quiet_checks"] += 1  # counted once its answer is applied
        self.last_heard = time.monotonic()
        self.quiet = QUIET_FIRST_S if found else min(QUIET_MAX_S, self.quiet * 2)

    def _apply(self, msgs: list[dict[str, Any]]) -> None:
        from skyfn.push import follow

        port = self.port
        done, fetch, gap = [], [], False
        with port.lock:  # one step: futures are taken before they are resolved, each once
            for msg in msgs:
                if msg.get("type") != "done":
                    continue
                self.stats["pushes"] += 1
                for st in msg.get("tasks") or ():
                    fut = port.take(st.get("task_id"))
                    if fut is not None:
                        done.append((fut, st["task_id"], st))
                fetch.extend(tid for tid in msg.get("ids") or () if port.holds(tid))
                cursor, missed = follow(port.cursor, str(msg.get("prev")), str(msg.get("cursor")))
                if missed and not port.has_outstanding():
                    cursor, missed = str(msg.get("cursor")), False  # nothing to miss
                port.cursor = cursor
                gap = gap or missed
        self.stats["pushed_results"] += len(done)
        if done or fetch:  # progress on our own tasks (others' pushes must not hold off the checks)
            self.last_heard = time.monotonic()
            self.quiet = QUIET_FIRST_S
        port.resolve(done, [])
        if fetch:
            self.stats["fetched"] += len(fetch)
            for window in _windows(list(dict.fromkeys(fetch))):
                port.apply_answer(port.client.status(window, wait=0))
        if gap:
            self.stats["gaps"] += 1
            self.resync(full=False)

    def resync(self, full: bool) -> bool:
        """Catch up with POST /tasks/status: from the cursor when it is usable (only what
        finished since), else every outstanding task. Returns whether any resolved."""
        port = self.port
        self.stats["resyncs"] += 1
        ids = port.outstanding_ids()
        if not ids:
            return False
        use_cursor = not full and port.cursor is not None and len(ids) <= MAX_STATUS_IDS
        found, cursors, later = 0, [], False
        for window in _windows(ids):
            answer = port.client.status(window, wait=0, cursor=port.cursor if use_cursor else None)
            cursors.append(answer.get("cursor"))
            later = later or bool(answer.get("later"))
            found += port.apply_answer(answer)
        cursors = [c for c in cursors if c]
        if later:  # some were left to read from the service's history: the next resync reads every one
            port.cursor = None
        elif cursors:
            # several windows: the earliest position, so nothing between them is skipped
            port.cursor = min(cursors, key=cursor_key)
        return found > 0


def _windows(ids: list[str]):
    it = iter(ids)
    while chunk := list(itertools.islice(it, MAX_STATUS_IDS)):
        yield chunk
