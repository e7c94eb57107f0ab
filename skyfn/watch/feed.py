"""Updates for `skyfn task watch`: what the service says about the watched tasks, applied
to a Tally, without hammering the API.

- Results push (skyfn.push) when the service has a WebSocket API: completions arrive as
  they happen; a gap in the pushed cursors, or a completion pushed without its status
  (a large result), is caught up with one POST /tasks/status.
- Otherwise the batched long-poll: POST /tasks/status with the cursor of the previous
  answer, so each call costs the service what finished since (not what is outstanding),
  and returns as soon as one of ours finishes; calls are at least ``interval`` apart.
- Either way, a full read of the tasks not final yet every few seconds (more for large
  batches): QUEUED -> DISPATCHED -> RUNNING is not pushed, and the cursor tells only of
  completions.
- The events of a task seen leaving WAITING by a read without them (a full read, a pushed
  completion) are read once, to know how long it waited for its inputs (``settle`` at the end).

Watching consumes nothing: every status read peeks without results and the push
subscription is a peek one, so the results stay for whoever collects them (the service
starts their SKYFN_RESULT_TTL clock only when they are read for real).
"""
from __future__ import annotations

import logging
import os
import select
import time
from typing import Any, Optional

from skyfn.protocol.limits import MAX_STATUS_IDS, MAX_WAIT_SECONDS
from skyfn.protocol.states import wait_span
from skyfn.watch.tally import FINAL, Tally

log = logging.getLogger("skyfn.watch")

LONG_POLL_S = 5.0        # one idle long-poll at most this long: the caller gets control back
FULL_READ_MIN_S = 5.0    # full read of the unfinished tasks at most this often ...
FULL_READ_PER_ID_S = 0.001  # ... and, for large batches, 1 s per 1,000 of them
REASON_CHARS = 200


def failure_reason(status: dict[str, Any]) -> Optional[str]:
    """Why a task did not succeed: the service's reason and/or the exception the function
    raised ("ValueError: bad input"). Only the JSON wrapper of the error buffer is decoded
    (skyfn.protocol.remote_exception); the exception object itself is never unpickled."""
    from skyfn.protocol.serialize import deserialize, strategy_of

    reason = status.get("reason")
    error = status.get("error")
    raised = None
    if error:
        try:
            data = deserialize(error) if strategy_of(error) == "json" else None
        except Exception:  # noqa: BLE001 - an undecodable buffer: show the reason alone
            data = None
        if isinstance(data, dict) and data.get("type"):
            kind = str(data["type"]).removeprefix("builtins.").removeprefix("__main__.")
            message = str(data.get("message") or "").strip().splitlines()
            raised = f"{kind}: {message[0]}" if message else kind
    text = ": ".join(t for t in (reason, raised) if t) or None
    return text[:REASON_CHARS] + "…" if text and len(text) > REASON_CHARS else text


def finished_at(status: dict[str, Any]) -> Optional[float]:
    """When the task reached its final state, from its events (None without events)."""
    for state, ts in reversed(status.get("events") or ()):
        if state in FINAL:
            return float(ts)
    return None


def apply(tally: Tally, statuses: dict[str, dict[str, Any]], observed: Optional[float]) -> int:
    """Apply status dicts; a final state without events counts as reached at `observed`.
    Events also tell how long a task with inputs waited for them (WAITING -> QUEUED)."""
    changed = 0
    for tid, st in statuses.items():
        state = st.get("state")
        if not state:
            continue
        at = finished_at(st) if state in FINAL else None
        changed += tally.update(tid, state, failure_reason(st) if state in FINAL else None,
                                at if at is not None else observed)
        span = wait_span(st.get("events"))
        if span is not None:
            tally.note_wait(tid, *span)
    return changed


class Feed:
    """Keeps a Tally current. ``wait(timeout)`` blocks at most ``timeout`` seconds."""

    def __init__(self, client, tally: Tally, cursor: Optional[str], interval: float = 1.0, push: bool = True):
        self.client = client
        self.tally = tally
        self.cursor = cursor
        self.interval = interval
        self.channel = None
        self.mode = "poll"
        self._next_call = 0.0
        self._next_full = time.monotonic() + self._full_period()
        self._catch_up = False
        self._fetch: set[str] = set()
        if push:
            self._connect()

    # -- connection -------------------------------------------------------------------------
    def _connect(self) -> None:
        try:
            from skyfn.push import PushChannel, PushUnavailable, ws_url
        except ImportError:  # no websockets library: poll
            return
        url = os.environ.get("SKYFN_WS_URL") or ws_url(self.client.service_url)
        channel = PushChannel(url, self.client.config.token, peek=True)
        try:
            pushed_from = channel.connect()
        except (PushUnavailable, OSError) as exc:
            log.info("results push unavailable (%s); polling", exc)
            return
        self.channel, self.mode = channel, "push"
        # what finished between the first read and the subscription; the pushes chain on
        # from the subscription's position (a completion seen twice is applied once)
        if self.cursor is not None:
            self._status(self.tally.outstanding(), cursor=self.cursor, every=False)
        self.cursor = pushed_from

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    # -- waiting ----------------------------------------------------------------------------
    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + max(0.0, timeout)
        self._fetch.update(self.tally.take_unreleased())
        if not self.tally.outstanding():
            return
        if time.monotonic() >= self._next_full:
            self._full_read()
            return
        if self.channel is not None:
            self._wait_push(deadline)
        else:
            self._wait_poll(deadline)

    def _wait_push(self, deadline: float) -> None:
        if (self._catch_up or self._fetch) and time.monotonic() >= self._next_call:
            fetch, self._fetch = list(self._fetch), set()
            if fetch:
                self._status(fetch, every=False)
            if self._catch_up:
                self._catch_up = False
                self._status(self.tally.outstanding(), cursor=self.cursor)
            return
        until = min(deadline, self._next_full)
        if self._catch_up or self._fetch:
            until = min(until, self._next_call)
        ready = select.select([self.channel], [], [], max(0.0, until - time.monotonic()))[0]
        if not ready:
            return
        msgs = self.channel.read()
        if msgs is None:  # the connection is gone: long-poll from where the pushes got to
            log.info("results push lost; polling")
            self.close()
            self.mode = "poll"
            return
        self._on_pushes(msgs)

    def _on_pushes(self, msgs: list[dict[str, Any]]) -> None:
        from skyfn.push import follow

        now = time.time()
        for msg in msgs:
            if msg.get("type") != "done":
                continue
            inline = {st["task_id"]: st for st in msg.get("tasks") or () if st.get("task_id")}
            apply(self.tally, inline, now)
            watched = self.tally.state
            self._fetch.update(t for t in msg.get("ids") or () if t in watched and t not in inline)
            self.cursor, missed = follow(self.cursor, str(msg.get("prev")), str(msg.get("cursor")))
            self._catch_up = self._catch_up or missed

    def settle(self) -> None:
        """Read what is still to be read once every task is final (the events that tell when a
        task's wait for inputs ended)."""
        self._fetch.update(self.tally.take_unreleased())
        if self._fetch:
            fetch, self._fetch = list(self._fetch), set()
            self._status(fetch, every=False)

    def _wait_poll(self, deadline: float) -> None:
        if self._fetch and time.monotonic() >= self._next_call:
            fetch, self._fetch = list(self._fetch), set()
            self._status(fetch, every=False)
            return
        pause = min(self._next_call, deadline) - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        now = time.monotonic()
        if now >= deadline and now < self._next_call:
            return
        ids = self.tally.outstanding()
        if len(ids) > MAX_STATUS_IDS:  # several windows: none may hold the others up
            self._status(ids, cursor=self.cursor)
            return
        wait = min(max(0.0, deadline - now), self._next_full - now, LONG_POLL_S, MAX_WAIT_SECONDS)
        self._status(ids, cursor=self.cursor, wait=max(0.0, wait))

    def _full_read(self) -> None:
        self._status(self.tally.outstanding(), events=False)
        self._next_full = time.monotonic() + self._full_period()

    def _full_period(self) -> float:
        return max(FULL_READ_MIN_S, FULL_READ_PER_ID_S * len(self.tally.outstanding()))

    # -- the status call ------------------------------------------------------------------
    def _status(self, ids: list[str], cursor: Optional[str] = None, wait: float = 0.0, events: bool = True,
                every: bool = True) -> None:
        """POST /tasks/status for `ids` (windows of MAX_STATUS_IDS). When `ids` are ``every``
        task outstanding, the answer's cursor becomes ours: all that finished before it is
        in the answer (with a cursor, the service answers what finished since)."""
        from skyfn.protocol.push import cursor_key

        cursors = []
        for i in range(0, len(ids), MAX_STATUS_IDS):
            answer = self.client.status(ids[i:i + MAX_STATUS_IDS], wait=wait if i == 0 else 0.0,
                                        include_events=events, cursor=cursor, peek=True, results=False)
            apply(self.tally, answer.get("tasks") or {}, time.time())
            cursors.append(answer.get("cursor"))
        self._next_call = time.monotonic() + self.interval
        cursors = [c for c in cursors if c]
        if cursors and every:
            self.cursor = min(cursors, key=cursor_key)
