"""One TCP byte stream between the two ranks of a 2-rank group, punched through their NATs
or relayed by the rendezvous server: the pure-Python counterpart of what the communicator
does per pair (docs/comm.md, "Punching and relay choice"), for peers that need a plain
socket rather than framed messages (direct sessions reached through the rendezvous:
skyfn/executor/direct_path.py and endpoint_agent/direct/reach.py).

    chan = pair.connect(address, group, token, rank, punch_timeout=3, timeout=30)
    chan.sock, chan.mode          # a connected blocking socket; "punched" or "relayed"

Both ranks JOIN the group from one local port (SO_REUSEADDR/SO_REUSEPORT), learn each
other's public address from PEERS, then both listen on that port and connect from it to
the other's public address with jittered, bounded retries. Every connection that forms
is validated by a 16-byte HELLO each way (magic b"SKYP", u32 version 1, u32 sender rank,
u32 receiver rank, little-endian). Rank 0 decides, so both always agree: it takes the
first validated connection within `punch_timeout` and sends one select byte (b"S") on
it, closing the others; with none by then it closes every candidate and opens a relay
half. Rank 1 keeps every validated candidate and waits for the select byte on one of
them; at its own punch deadline it also opens a relay half and takes whichever comes
first, the select byte or RELAYED + HELLO on the relay (rank 0 sends its HELLO on the
relay too). `allow_direct=False` relays at once. `accept=False` punches by connecting only
(no listening socket at all, not even while punching: the SYNs cross between the NATs;
the other rank still accepts). Whatever follows is the caller's stream.
"""
from __future__ import annotations

import errno
import random
import select
import socket
import struct
import time
from typing import NamedTuple, Optional

from . import client
from . import protocol as P
from .client import RendezvousError

MAGIC = b"SKYP"
VERSION = 1
HELLO = struct.Struct("<4sIII")
SELECT = b"S"
_CONNECT_ERRORS = (errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT, errno.EHOSTUNREACH,
                   errno.ENETUNREACH, errno.ECONNABORTED)


class Channel(NamedTuple):
    sock: socket.socket     # blocking, TCP_NODELAY
    mode: str               # "punched" | "relayed"
    peer: tuple             # the other rank's public (ip, port) as the server saw it


def _hello(me: int, other: int) -> bytes:
    return HELLO.pack(MAGIC, VERSION, me, other)


class _Candidate:
    """One direct connection being validated: our HELLO out, theirs in."""

    __slots__ = ("sock", "connecting", "inbuf", "valid", "since")

    def __init__(self, sock: socket.socket, connecting: bool):
        self.sock, self.connecting = sock, connecting
        self.inbuf = b""
        self.valid = False
        self.since = time.monotonic()


def connect(address: client.Address, group: str, token: str, rank: int, *, punch_timeout: float = 3.0,
            timeout: float = 30.0, allow_direct: bool = True, accept: bool = True) -> Channel:
    """Join `group` (size 2) as `rank` and return the pair's channel; RendezvousError (with
    the server's code, or "timeout") when there is none within `timeout` seconds."""
    if rank not in (0, 1):
        raise ValueError(f"rank must be 0 or 1 (a pair), got {rank!r}")
    deadline = time.monotonic() + timeout
    session = client.join(address, group, token, size=2, rank=rank, timeout=timeout, bind=("0.0.0.0", 0))
    try:
        peer = session.peers[1 - rank]
        local_port = session.local_address[1]
        sock = None
        if allow_direct:
            sock = _Puncher(rank, local_port, peer, punch_timeout, deadline, accept).run(address, group, token)
        if sock is None:
            return Channel(_relay(address, group, token, rank, deadline), "relayed", peer)
        if isinstance(sock, tuple):  # rank 1 got rank 0's choice of the relay
            return Channel(sock[0], "relayed", peer)
        return Channel(sock, "punched", peer)
    finally:
        session.close()


def _finish(sock: socket.socket) -> socket.socket:
    sock.setblocking(True)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    return sock


def _relay(address, group: str, token: str, rank: int, deadline: float) -> socket.socket:
    """Rank 0's relay: RELAY, RELAYED, then HELLO both ways."""
    sock = client.relay(address, group, token, rank, 1 - rank, timeout=max(0.1, deadline - time.monotonic()))
    try:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        sock.sendall(_hello(rank, 1 - rank))
        got = recv_exact(sock, HELLO.size)
        if HELLO.unpack(got) != (MAGIC, VERSION, 1 - rank, rank):
            raise RendezvousError(P.MALFORMED, "the relayed peer's HELLO does not name this pair")
        return _finish(sock)
    except socket.timeout:
        sock.close()
        raise RendezvousError(P.TIMEOUT, "no HELLO from the peer through the relay in time") from None
    except PeerClosed as exc:
        sock.close()
        raise RendezvousError("closed", f"the peer's HELLO was cut short: {exc}") from None
    except BaseException:
        sock.close()
        raise


class PeerClosed(ConnectionError):
    """The other end closed a connection before a whole message had come."""


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly `n` bytes from `sock` (blocking, under its timeout); PeerClosed at an early end."""
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise PeerClosed(f"the peer closed the connection after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


class _Puncher:
    """The punching loop of one rank (see the module docstring)."""

    def __init__(self, rank: int, port: int, peer: tuple, punch_timeout: float, deadline: float, accept: bool):
        self.rank, self.port, self.peer = rank, port, (peer[0], int(peer[1]))
        self.punch_deadline = min(deadline, time.monotonic() + punch_timeout)
        self.deadline = deadline
        self.attempt_life = min(1.0, max(0.2, punch_timeout / 4))
        self.cands: list[_Candidate] = []
        self.next_connect = 0.0
        self.backoff = 0.02
        self.listener: Optional[socket.socket] = None
        if accept:
            self.listener = client.reuse_socket(("0.0.0.0", port))
            self.listener.listen(8)
            self.listener.setblocking(False)
        self.relay_sock: Optional[socket.socket] = None
        self.relay_buf = b""
        self.relayed = False

    def close_all(self, keep: Optional[socket.socket] = None) -> None:
        for c in self.cands:
            if c.sock is not keep:
                c.sock.close()
        self.cands.clear()
        if self.listener is not None:
            self.listener.close()
        if self.relay_sock is not None and self.relay_sock is not keep:
            self.relay_sock.close()

    def run(self, address, group: str, token: str):
        try:
            got = self._loop(address, group, token)
        except BaseException:
            self.close_all()
            raise
        if got is None:
            self.close_all()
            return None
        self.close_all(keep=got if not isinstance(got, tuple) else got[0])
        return got

    def _connect(self) -> None:
        sock = client.reuse_socket(("0.0.0.0", self.port))
        sock.setblocking(False)
        err = sock.connect_ex(self.peer)
        if err in (0, errno.EINPROGRESS):
            self.cands.append(_Candidate(sock, connecting=err != 0))
            if err == 0:
                sock.send(_hello(self.rank, 1 - self.rank))
            return
        sock.close()
        # EADDRNOTAVAIL / EADDRINUSE: our listener already accepted this address pair

    def _loop(self, address, group: str, token: str):
        me, other = self.rank, 1 - self.rank
        while True:
            now = time.monotonic()
            if now >= self.deadline:
                raise RendezvousError(P.TIMEOUT, "no channel to the peer in time (punched or relayed)")
            if now >= self.punch_deadline:
                if me == 0:
                    return None             # rank 0 decides: the relay
                if self.relay_sock is None:
                    self._open_relay(address, group, token)
            if now < self.punch_deadline and now >= self.next_connect and len(self.cands) < 16:
                self._connect()
                self.next_connect = now + self.backoff * random.uniform(0.5, 1.5)
                self.backoff = min(0.25, self.backoff * 1.6)
            reads = ([self.listener] if self.listener is not None else []) + \
                [c.sock for c in self.cands if not c.connecting]
            writes = [c.sock for c in self.cands if c.connecting]
            if self.relay_sock is not None:
                reads.append(self.relay_sock)
            punching = now < self.punch_deadline
            wake = min(self.deadline, self.next_connect, self.punch_deadline) if punching else self.deadline
            r, w, _ = select.select(reads, writes, [], max(0.0, min(0.05, wake - time.monotonic())))
            for sock in w:
                c = self._cand(sock)
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    self._drop(c)
                    if err in (errno.ECONNREFUSED, errno.ECONNRESET):  # routers may reset early SYNs: retry fast
                        self.next_connect = min(self.next_connect, time.monotonic() + random.uniform(0.001, 0.02))
                    continue
                c.connecting = False
                try:
                    sock.send(_hello(me, other))
                except OSError:
                    self._drop(c)
            for sock in r:
                if self.listener is not None and sock is self.listener:
                    try:
                        conn, _ = self.listener.accept()
                    except OSError:
                        continue
                    conn.setblocking(False)
                    try:
                        conn.send(_hello(me, other))
                    except OSError:
                        conn.close()
                        continue
                    self.cands.append(_Candidate(conn, connecting=False))
                    continue
                if sock is self.relay_sock:
                    got = self._read_relay()
                    if got is not None:
                        return got
                    continue
                chosen = self._read_candidate(self._cand(sock))
                if chosen is not None:
                    return chosen
            now = time.monotonic()
            for c in list(self.cands):  # a connect attempt lives a bounded time
                if c.connecting and now - c.since > self.attempt_life:
                    self._drop(c)

    def _cand(self, sock: socket.socket) -> _Candidate:
        return next(c for c in self.cands if c.sock is sock)

    def _drop(self, c: _Candidate) -> None:
        self.cands.remove(c)
        c.sock.close()

    def _read_candidate(self, c: _Candidate):
        try:
            data = c.sock.recv(HELLO.size + 1 - len(c.inbuf) if not c.valid else 1)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            self._drop(c)
            return None
        if not data:
            self._drop(c)
            return None
        c.inbuf += data
        if not c.valid:
            if len(c.inbuf) < HELLO.size:
                return None
            if HELLO.unpack(c.inbuf[:HELLO.size]) != (MAGIC, VERSION, 1 - self.rank, self.rank):
                self._drop(c)   # not our peer (a stale mapping, another pair): never used
                return None
            c.valid, c.inbuf = True, c.inbuf[HELLO.size:]
            if self.rank == 0:
                try:
                    c.sock.send(SELECT)
                except OSError:
                    self._drop(c)
                    return None
                return _finish(c.sock)
        if c.inbuf[:1] == SELECT:
            if len(c.inbuf) > 1:  # rank 0 speaks first only after the select: nothing else yet
                self._drop(c)
                return None
            return _finish(c.sock)
        if c.inbuf:
            self._drop(c)
        return None

    def _open_relay(self, address, group: str, token: str) -> None:
        host, port = client.parse_address(address)
        sock = socket.create_connection((host, port), timeout=max(0.1, self.deadline - time.monotonic()))
        sock.sendall(f"RELAY {group} {token} {self.rank} {1 - self.rank}\n".encode())
        sock.setblocking(False)
        self.relay_sock = sock

    def _read_relay(self):
        # before RELAYED at most rank 0's HELLO follows the line (it speaks on only after ours);
        # after it, exactly the HELLO is ours to read: what follows belongs to the caller
        want = 4096 if not self.relayed else HELLO.size - len(self.relay_buf)
        try:
            data = self.relay_sock.recv(want)
        except (BlockingIOError, InterruptedError):
            return None
        if not data:
            raise RendezvousError("closed", "the rendezvous server closed the relay connection")
        self.relay_buf += data
        if not self.relayed:
            i = self.relay_buf.find(b"\n")
            if i < 0:
                return None
            client._expect(self.relay_buf[:i], "RELAYED")
            self.relayed, self.relay_buf = True, self.relay_buf[i + 1:]
            self._send_relay_hello()
        if len(self.relay_buf) < HELLO.size:
            return None
        if HELLO.unpack(self.relay_buf[:HELLO.size]) != (MAGIC, VERSION, 1 - self.rank, self.rank):
            raise RendezvousError(P.MALFORMED, "the relayed peer's HELLO does not name this pair")
        if len(self.relay_buf) > HELLO.size:
            raise RendezvousError(P.MALFORMED, "the relayed peer sent data before its HELLO was answered")
        return (_finish(self.relay_sock),)

    def _send_relay_hello(self) -> None:
        self.relay_sock.setblocking(True)
        self.relay_sock.sendall(_hello(self.rank, 1 - self.rank))
        self.relay_sock.setblocking(False)
