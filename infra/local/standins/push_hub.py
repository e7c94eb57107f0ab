"""The WebSocket API of the embedded runtime (the local stand-in of API Gateway's
WebSocket API): the local gateway hands it every ``GET /ws`` upgrade request.

- connect: the token of the REST API (``Authorization: Bearer`` header, or ``?token=``
  for browsers) is verified in process by lambdas.auth, as the REST API verifies it;
  a bad or missing token gets HTTP 401 and no connection. Endpoint credentials are refused
  (results are their submitter's alone).
- ``{"action": "subscribe"}``: the connection joins its user's listeners and is answered
  ``{"type": "subscribed", "cursor": C}`` with the user's completion-stream position;
  with ``"peek": true`` it is an observer (the status page, `skyfn task watch`): the same
  pushes, but deliveries to it never count as results retrieved.
- disconnect: the connection leaves.

Pushes come from the results path (lambdas/core/tasks/push.py) as Redis PUBLISH on
``push:<owner>``; one pub/sub thread fans them out to the owner's subscribed connections
and marks results handed over inside a push as retrieved when at least one of them was not
a peek connection. A pub/sub connection lost (Redis restarted) closes every WebSocket
connection: clients reconnect and catch up.

Each connection runs in its gateway thread, framing with the Sans-I/O protocol of the
``websockets`` library; sends from the fan-out thread are serialized per connection and
bounded in time, so a client that stops reading is dropped, never waited for.
"""
from __future__ import annotations

import json
import logging
import select
import socket
import threading
import time
from typing import Callable, Optional

from skyfn.protocol.push import CHANNEL_PREFIX, subscribe_peek

log = logging.getLogger("skyfn.local.push")

SEND_TIMEOUT_S = 5.0
PING_EVERY_S = 30.0
MAX_CLIENT_MESSAGE = 64 << 10
SUBSCRIBE_WAIT_S = 2.0

Authenticate = Callable[[str], Optional[str]]  # token -> user id, None when refused


def default_authenticate(token: str) -> Optional[str]:
    """The REST API's check (lambdas.auth), in process; None for a bad token or an agent."""
    from lambdas.auth import Unauthorized, authenticate

    try:
        identity = authenticate(f"Bearer {token}")
    except Unauthorized:
        return None
    return identity.user or None


class Connection:
    """One accepted WebSocket connection of `owner` over `sock` (server side)."""

    def __init__(self, hub: "PushHub", sock: socket.socket, owner: str, connection_id: int):
        from websockets.protocol import Protocol, Side

        self.hub = hub
        self.sock = sock
        self.owner = owner
        self.id = connection_id
        self.proto = Protocol(Side.SERVER, max_size=MAX_CLIENT_MESSAGE)
        self.lock = threading.Lock()
        self.subscribed = False
        self.peek = False
        self.closed = False
        self.sent = 0

    # -- sending (any thread) ----------------------------------------------------------
    def send(self, text: bytes | str) -> bool:
        with self.lock:
            return self.send_locked(text)

    def send_locked(self, text: bytes | str) -> bool:
        """send() for a caller that holds the connection's lock."""
        if self.closed:
            return False
        try:
            self.proto.send_text(text.encode() if isinstance(text, str) else text)
            self._flush()
            self.sent += 1
            return True
        except Exception as exc:
            log.info("dropping WebSocket connection %d of %s: %s", self.id, self.owner, exc)
            self._abort()
            return False

    def _flush(self) -> None:
        for chunk in self.proto.data_to_send():
            if not chunk:  # end of stream requested by the protocol
                try:
                    self.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                continue
            view = memoryview(chunk)
            deadline = time.monotonic() + SEND_TIMEOUT_S
            while view:
                try:
                    n = self.sock.send(view, socket.MSG_DONTWAIT)
                    view = view[n:]
                except BlockingIOError:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"client read nothing for {SEND_TIMEOUT_S:.0f} s")
                    select.select([], [self.sock], [], left)

    def _abort(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        with self.lock:
            self._abort()

    # -- receiving (the connection's gateway thread) -------------------------------------
    def serve(self) -> None:
        from websockets.frames import Opcode

        sock = self.sock
        sock.settimeout(None)
        idle_since = time.monotonic()
        while not self.closed:
            ready, _, _ = select.select([sock], [], [], PING_EVERY_S)
            if not ready:
                if time.monotonic() - idle_since >= PING_EVERY_S:
                    with self.lock:
                        try:
                            self.proto.send_ping(b"")
                            self._flush()
                        except Exception:
                            self._abort()
                            return
                continue
            try:
                data = sock.recv(1 << 16)
            except OSError:
                return
            idle_since = time.monotonic()
            with self.lock:
                if data:
                    self.proto.receive_data(data)
                else:
                    self.proto.receive_eof()
                frames = self.proto.events_received()
                try:
                    self._flush()  # pongs, the closing handshake
                except Exception:
                    self._abort()
                    return
            for frame in frames:
                if frame.opcode is Opcode.TEXT:
                    self._on_message(frame.data)
            if not data or self.proto.state.name == "CLOSED" or self.proto.close_expected():
                return

    def _on_message(self, data: bytes) -> None:
        try:
            msg = json.loads(data)
            action = msg.get("action") if isinstance(msg, dict) else None
        except ValueError:
            action = None
        if action == "subscribe":
            try:
                peek = subscribe_peek(msg)
            except ValueError as exc:
                self.send(json.dumps({"type": "error", "message": str(exc)}))
                return
            self.hub.subscribe(self, peek)
        elif action == "ping":
            self.send(b'{"type":"pong"}')
        else:
            self.send(json.dumps({"type": "error", "message": "unknown message: send {\"action\": \"subscribe\"}"}))


class PushHub:
    """Connections by owner, and the pub/sub thread that feeds them."""

    def __init__(self, redis_url: str, authenticate: Authenticate | None = None):
        self.redis_url = redis_url
        self.authenticate = authenticate or default_authenticate
        self._lock = threading.Lock()
        self._by_owner: dict[str, set[Connection]] = {}
        self._ids = iter(range(1, 1 << 62))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._redis = None
        self._ready = threading.Event()
        self.stats = {"connections": 0, "pushed": 0, "messages": 0, "handed_over": 0}

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "PushHub":
        from lambdas.adapters.redis_store.push_channel import PushListener

        self._redis = PushListener(self.redis_url)
        self._thread = threading.Thread(target=self._fan_out, name="skyfn-push-hub", daemon=True)
        self._thread.start()  # not waited for: a service must start even while Redis is away
        return self

    def stop(self) -> None:
        self._stop.set()
        self.close_all()
        if self._thread is not None:
            self._thread.join(5.0)

    def close_all(self) -> None:
        with self._lock:
            conns = [c for group in self._by_owner.values() for c in group]
        for c in conns:
            c.close()

    # -- connections ----------------------------------------------------------------------
    def accept(self, sock: socket.socket, owner: str) -> Connection:
        with self._lock:
            conn = Connection(self, sock, owner, next(self._ids))
            self.stats["connections"] += 1
        return conn

    def subscribe(self, conn: Connection, peek: bool = False) -> None:
        # Only with the pub/sub subscription active: what a 'subscribed' answer promises
        # (every entry after its cursor) needs it.
        if not self._ready.wait(SUBSCRIBE_WAIT_S):
            conn.send(json.dumps({"type": "error", "message": "the results push is not ready (Redis unreachable); "
                                                              "retry, or long-poll meanwhile"}))
            return
        # Registered before the cursor is read, under the connection's lock: every entry
        # after the cursor is pushed to it, and none before its 'subscribed' answer.
        with conn.lock:
            with self._lock:
                self._by_owner.setdefault(conn.owner, set()).add(conn)
            conn.subscribed = True
            conn.peek = peek
            cursor = self._redis.cursor(conn.owner)
            conn.send_locked(json.dumps({"type": "subscribed", "cursor": cursor}))  # before any push

    def leave(self, conn: Connection) -> None:
        with self._lock:
            group = self._by_owner.get(conn.owner)
            if group is not None:
                group.discard(conn)
                if not group:
                    del self._by_owner[conn.owner]
        conn.close()

    def connections(self, owner: str | None = None) -> list[Connection]:
        with self._lock:
            if owner is not None:
                return list(self._by_owner.get(owner, ()))
            return [c for group in self._by_owner.values() for c in group]

    # -- fan-out --------------------------------------------------------------------------
    def _fan_out(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            pubsub = None
            try:
                pubsub = self._redis.subscribe()
                pubsub.get_message(timeout=1.0)  # the subscription is active from here on
                self._ready.set()
                backoff = 0.1
                while not self._stop.is_set():
                    msg = pubsub.get_message(timeout=1.0)
                    if msg and msg["type"] == "pmessage":
                        self._deliver(msg["channel"].decode()[len(CHANNEL_PREFIX):], msg["data"])
            except Exception as exc:
                self._ready.clear()
                if self._stop.is_set():
                    break
                # pushes may have been lost: every client must reconnect and catch up
                log.warning("push pub/sub lost (%s); closing WebSocket connections, retrying in %.1f s", exc, backoff)
                self.close_all()
                self._stop.wait(backoff)
                backoff = min(5.0, backoff * 2)
            finally:
                try:
                    if pubsub is not None:
                        pubsub.close()
                except Exception:
                    pass

    def _deliver(self, owner: str, body: bytes) -> None:
        conns = self.connections(owner)
        self.stats["messages"] += 1
        handed_over = False
        for conn in conns:
            if conn.subscribed and conn.send(body):
                handed_over = handed_over or not conn.peek
                self.stats["pushed"] += 1
            elif conn.closed:
                self.leave(conn)
        if handed_over:  # observers alone (peek) consume nothing
            self._mark_handed_over(body)

    def _mark_handed_over(self, body: bytes) -> None:
        """Results inside a delivered push count as retrieved (purged result_ttl later)."""
        import orjson

        try:
            tasks = orjson.loads(body).get("tasks") or []
        except ValueError:
            return
        ids = [t["task_id"] for t in tasks if isinstance(t, dict) and "task_id" in t]
        if ids:
            from lambdas.core import deps

            deps.store().mark_retrieved(ids)
            self.stats["handed_over"] += len(ids)
