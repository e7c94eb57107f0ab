"""Copy bytes both ways between two connected sockets until either side ends: what joins a
punched or relayed channel (rendezvous/pair.py) to a local ZeroMQ connection, so the same
ZeroMQ session runs over either (skyfn/executor/direct_path.py, endpoint_agent/direct/reach.py).

    p = Pump(a, b, name="direct-path", on_close=callback)   # starts its two threads
    p.sent, p.received         # bytes a -> b, b -> a
    p.close()                  # ends both directions (also when either socket ends or fails)

One thread per direction, blocking reads: a byte is forwarded the moment it arrives (no
polling interval). When one direction ends (EOF, reset, close) both sockets are shut down
and closed, so each side sees the loss at once; `on_close(pump, why)` runs once, from
the thread that saw it.
"""
from __future__ import annotations

import socket
import threading
from typing import Callable, Optional

CHUNK = 256 * 1024


class Pump:
    def __init__(self, a: socket.socket, b: socket.socket, name: str = "pump",
                 on_close: Optional[Callable[["Pump", str], None]] = None):
        self.a, self.b = a, b
        self.sent = 0       # a -> b
        self.received = 0   # b -> a
        self.why: Optional[str] = None
        self._on_close = on_close
        self._lock = threading.Lock()
        self.closed = threading.Event()
        for s in (a, b):
            s.setblocking(True)
            s.settimeout(None)
        self._threads = [threading.Thread(target=self._copy, args=(a, b, True), name=f"{name}-out", daemon=True),
                         threading.Thread(target=self._copy, args=(b, a, False), name=f"{name}-in", daemon=True)]
        for t in self._threads:
            t.start()

    def _copy(self, src: socket.socket, dst: socket.socket, out: bool) -> None:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        why = "closed"
        try:
            while True:
                n = src.recv_into(buf)
                if n == 0:
                    why = "the other side closed" if not out else "the local side closed"
                    break
                dst.sendall(view[:n])
                if out:
                    self.sent += n
                else:
                    self.received += n
        except OSError as exc:
            why = f"{'sending' if out else 'receiving'} failed: {exc.strerror or exc}"
        self._end(why)

    def _end(self, why: str) -> None:
        with self._lock:
            if self.why is not None:
                return
            self.why = why
        for s in (self.a, self.b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for s in (self.a, self.b):
            try:
                s.close()
            except OSError:
                pass
        self.closed.set()
        if self._on_close is not None:
            self._on_close(self, why)

    def close(self) -> None:
        self._end("closed here")

    def join(self, timeout: Optional[float] = None) -> None:
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)
