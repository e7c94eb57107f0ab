"""The SDK's end of the results push (skyfn.protocol.push): a WebSocket client the
Executor's one background thread drives itself (no thread of its own: the framing is the
Sans-I/O protocol of the ``websockets`` library over a plain socket, so the Executor waits
on this socket and its wake-up pipe with one ``select``).

``PushChannel.connect()`` opens the connection with the REST API's token, subscribes (with
``peek``, as an observer whose deliveries do not count as results retrieved) and returns
the subscription cursor; ``read()`` returns the messages that arrived (None once
the connection is gone). ``follow(cursor, message)`` is the cursor bookkeeping that tells
a contiguous push from a gap.

Imported only when an Executor first waits for results: ``import skyfn`` stays light.
"""
from __future__ import annotations

import select
import socket
import ssl
import time
from typing import Any, Optional

import orjson

from skyfn.protocol.errors import SkyfnError
from skyfn.protocol.push import PATH, cursor_key

MAX_MESSAGE = 16 << 20
RECV_BYTES = 1 << 20  # one read takes up to this much (into the channel's own buffer)


class PushUnavailable(SkyfnError, ConnectionError):
    """The service has no WebSocket API here, or refused the token (``status``)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


def ws_url(service_url: str) -> str:
    """The WebSocket API of a service: the same host and port, path /ws (embedded runtime)."""
    if service_url.startswith("https://"):
        return "wss://" + service_url[len("https://"):].rstrip("/") + PATH
    if service_url.startswith("http://"):
        return "ws://" + service_url[len("http://"):].rstrip("/") + PATH
    return service_url


def follow(cursor: Optional[str], prev: str, new: str) -> tuple[Optional[str], bool]:
    """(cursor after a pushed completion entry (prev -> new), whether a gap was seen).
    An entry at or before the cursor is old news (already read by a status call)."""
    if cursor is not None and cursor_key(new) <= cursor_key(cursor):
        return cursor, False
    if cursor is not None and prev == cursor:
        return new, False
    return cursor, True


class PushChannel:
    """One subscribed WebSocket connection to the service's results push."""

    def __init__(self, url: str, token: str, timeout: float = 5.0, peek: bool = False):
        self.url = url
        self._token = token
        self.timeout = timeout
        self.peek = peek  # an observer: pushes delivered here do not count as results retrieved
        self.sock: Optional[socket.socket] = None
        self._proto = None
        self._partial: list[bytes] = []
        # reads go into this buffer: sock.recv(1 MiB) allocated (and gave back) a MiB per read,
        # 16 us against 2 us for the few hundred bytes of a lone push
        self._buf = memoryview(bytearray(RECV_BYTES))
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    def connect(self) -> str:
        """Connect, authenticate, subscribe; returns the subscription cursor."""
        from websockets.client import ClientProtocol
        from websockets.exceptions import InvalidStatus
        from websockets.http11 import Response
        from websockets.uri import parse_uri

        uri = parse_uri(self.url)
        sock = socket.create_connection((uri.host, uri.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if uri.secure:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=uri.host)
        self.sock = sock
        self._proto = proto = ClientProtocol(uri, max_size=MAX_MESSAGE)
        request = proto.connect()
        request.headers["Authorization"] = f"Bearer {self._token}"
        proto.send_request(request)
        self._flush()
        deadline = time.monotonic() + self.timeout
        while True:
            events = self._receive(deadline)
            if proto.handshake_exc is not None:
                exc = proto.handshake_exc
                status = exc.response.status_code if isinstance(exc, InvalidStatus) else 0
                self.close()
                raise PushUnavailable(f"the WebSocket API at {self.url} refused the connection "
                                      f"({status or type(exc).__name__})", status)
            if any(isinstance(e, Response) for e in events):
                break
        self.send({"action": "subscribe", "peek": True} if self.peek else {"action": "subscribe"})
        while True:
            for msg in self._messages(self._receive(deadline)):
                if msg.get("type") == "subscribed":
                    return str(msg.get("cursor") or "0-0")
                if msg.get("type") == "error":
                    self.close()
                    raise PushUnavailable(f"subscribing refused: {msg.get('message')}")

    def send(self, message: dict[str, Any]) -> None:
        self._proto.send_text(orjson.dumps(message))
        self._flush()

    def read(self) -> Optional[list[dict[str, Any]]]:
        """The messages that arrived (call when the socket is readable); None: connection gone."""
        if self.closed or self.sock is None:
            return None
        try:
            data = self._recv()
        except (BlockingIOError, socket.timeout, ssl.SSLWantReadError):
            return []
        except OSError:
            self.close()
            return None
        if not data:
            self.close()
            return None
        self._proto.receive_data(data)
        if isinstance(self.sock, ssl.SSLSocket):
            while self.sock.pending():
                self._proto.receive_data(self._recv())
        msgs = self._messages(self._proto.events_received())
        try:
            self._flush()  # pongs
        except OSError:
            self.close()
            return None
        if self._proto.close_expected() or self._proto.state.name == "CLOSED":
            self.close()
            return msgs or None
        return msgs

    def kill(self) -> None:
        """Drop the connection abruptly (what a network fault does)."""
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.closed = True
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass

    # -- internals -------------------------------------------------------------------------
    def _recv(self) -> bytes:
        """What the socket holds, up to RECV_BYTES (b'' at end of stream)."""
        n = self.sock.recv_into(self._buf)
        return bytes(self._buf[:n])

    def _flush(self) -> None:
        for chunk in self._proto.data_to_send():
            if chunk:
                self.sock.sendall(chunk)

    def _receive(self, deadline: float) -> list:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.sock], [], [], left)[0]:
            self.close()
            raise PushUnavailable(f"the WebSocket API at {self.url} did not answer within {self.timeout:.0f} s")
        data = self._recv()
        if not data:
            self.close()
            raise PushUnavailable(f"the WebSocket API at {self.url} closed the connection")
        self._proto.receive_data(data)
        return self._proto.events_received()

    def _messages(self, events: list) -> list[dict[str, Any]]:
        from websockets.frames import Frame, Opcode

        out = []
        for frame in events:
            if not isinstance(frame, Frame):
                continue
            if frame.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT) and (frame.opcode is Opcode.CONT) == bool(self._partial):
                self._partial.append(frame.data)
                if frame.fin:
                    data, self._partial = b"".join(self._partial), []
                    try:
                        msg = orjson.loads(data)
                    except orjson.JSONDecodeError:
                        continue
                    if isinstance(msg, dict):
                        out.append(msg)
        return out
