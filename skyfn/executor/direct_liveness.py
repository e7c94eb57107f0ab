"""The direct channel's liveness (a part of DirectChannel, skyfn/executor/direct.py): is the
agent still there, and what became of the tasks whose result never came.

* The socket's monitor (`_watch`): a connection attempt refused or a handshake the agent
  refuses while no connection is up means the agent stopped, moved or restarted; through
  the rendezvous server a failed handshake is first a broken path (MAX_HANDSHAKE_FAILURES).
* The path through the rendezvous server (`_check_path`): refused by the agent, or none
  for PATH_GIVE_UP_S.
* Silence (`_check_alive`): pings every PING_EVERY_S while tasks are out, asking about the
  oldest; no answer for `timeout` seconds loses the session.
* Settling (`_settle`): tasks the agent no longer holds nor replays are looked up at the
  service, and resubmitted through it when it has no record of them.
"""
from __future__ import annotations

import itertools
import logging
import time

import orjson

from skyfn.outcomes import FINAL
from skyfn.protocol import direct as proto
from skyfn.protocol.limits import MAX_STATUS_IDS

log = logging.getLogger("skyfn.executor.direct")

PING_EVERY_S = 1.0
SETTLE_AFTER_S = 1.0   # a task the agent no longer holds is looked up at the service after this
RESUBMIT_AFTER_S = 5.0  # ... and resubmitted if the service still has no record of it after this
PATH_GIVE_UP_S = 30.0  # no path through the rendezvous for this long (and `timeout`): the session is lost
MAX_HANDSHAKE_FAILURES = 3  # through the rendezvous: failed CurveZMQ handshakes in a row before the session is lost


def watched_events(zmq) -> int:
    """The monitor events the channel acts on (_watch)."""
    return (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


class Liveness:
    """DirectChannel's liveness methods; they use its state (socket, pending map, session)."""

    # -- liveness ---------------------------------------------------------------------
    def _watch(self, zmq) -> None:
        """Read the socket's monitor: a connection attempt that fails (nothing listens at the
        address any more: the agent stopped or moved) or a handshake the agent refuses (a
        restarted agent, another key) while no connection is up means the agent is gone.
        A dropped connection alone is not: ZeroMQ reconnects, and a reply lost meanwhile is
        settled from the service (PING/PONG)."""
        from zmq.utils.monitor import recv_monitor_message

        while self._monitor is not None:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)["event"]
            except zmq.Again:
                return
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._up = True
                self._handshake_failures = 0
                if self._bridge is not None:
                    self._paths_judged = self._bridge.counts["paths"]
            elif event == zmq.EVENT_DISCONNECTED:
                self._up = False
            elif self._bridge is not None and event != zmq.EVENT_CLOSED:
                # through the rendezvous a failed handshake is first a broken path (a byte
                # altered on the way): the next path tries again; a few in a row, another key.
                # A path that could not be made closes the connection mid-handshake too: not counted
                paths = self._bridge.counts["paths"]
                if paths == self._paths_judged:
                    continue
                self._paths_judged = paths
                self._handshake_failures += 1
                if self._handshake_failures >= MAX_HANDSHAKE_FAILURES:
                    self._lost(f"the agent refused the session's handshake {self._handshake_failures} times "
                               "through the rendezvous server (it restarted, or a relay alters the traffic)")
                    return
            elif not self._up and self._session is not None and self._bridge is None:
                address = self._session["address"]
                self._lost(f"nothing accepts connections at {address} any more (the agent stopped or moved)"
                           if event == zmq.EVENT_CLOSED else
                           f"the agent at {address} refused the session's handshake (it restarted)")
                return

    def _check_path(self) -> None:
        """Through the rendezvous server: the agent refused the path (its key is not the
        session's: it restarted), or there has been no path for too long."""
        b = self._bridge
        if b.refused is not None:
            self._lost(f"the agent refused the path through the rendezvous server: {b.refused[1]}")
        elif b.failing_since is not None and time.monotonic() - b.failing_since > max(self.timeout, PATH_GIVE_UP_S):
            self._lost(f"no path to the agent through the rendezvous server for "
                       f"{time.monotonic() - b.failing_since:.0f} s ({b.last_error})")

    def _check_alive(self, zmq) -> None:
        if self._sock is None:
            return
        now = time.monotonic()
        if self._bridge is not None and self._bridge.mode is None:
            self._last_heard = now  # a path is being made: _check_path bounds that, silence does not count
        if now - self._last_heard > self.timeout:
            self._lost(f"the agent did not answer for {self.timeout:g} s")
        elif now - self._last_heard > PING_EVERY_S and now - self._last_ping > PING_EVERY_S:
            self._last_ping = now
            with self._lock:  # the oldest tasks still waited for: the agent says which it no longer holds
                asked = list(itertools.islice(self._pending, proto.MAX_ASKED))
            try:
                self._sock.send_multipart([proto.PING, orjson.dumps(asked)], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        if self._suspects:
            self._settle(now)

    def _settle(self, now: float) -> None:
        """Tasks the agent no longer holds but whose result never came (its reply was lost):
        resolved from the service's record, or, when the service has none past a grace
        period (they never reached the agent), submitted through the service."""
        due = [tid for tid, since in self._suspects.items() if now - since >= SETTLE_AFTER_S]
        if not due:
            return
        for tid in list(self._suspects):
            if tid not in self._pending:
                del self._suspects[tid]
        due = [tid for tid in due if tid in self._pending]
        try:
            answer = self.port.client.status(due[:MAX_STATUS_IDS], wait=0)
        except Exception as exc:  # noqa: BLE001 - tried again at the next check
            log.warning("could not settle %d direct task(s) through the service: %s", len(due), exc)
            return
        found = {tid: st for tid, st in (answer.get("tasks") or {}).items() if st.get("state") in FINAL}
        later = set(answer.get("later") or ())  # in the service's history, not read this time: asked again
        done, gone = [], []
        with self._lock:
            for tid in due[:MAX_STATUS_IDS]:
                if tid in later:
                    continue
                if tid in found:
                    done.append((self._pending.pop(tid)[0], tid, found[tid]))
                    del self._suspects[tid]
                elif now - self._suspects[tid] >= RESUBMIT_AFTER_S:
                    fut, fid, payload, _ = self._pending.pop(tid)
                    gone.append((fut, fid, payload))
                    del self._suspects[tid]
        self.stats["settled"] += len(done)
        self.stats["results"] += len(done)
        self.port.resolve(done, [])
        if gone:
            log.warning("%d direct task(s) never reached the agent; they go through the service", len(gone))
            self._to_service(gone, "never reached the agent")
