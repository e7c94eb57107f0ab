"""Pure-Python reference client of the rendezvous protocol (docs/comm.md).

Used by the tests and benchmarks, and usable as a fallback by the Python communicator:

    s = client.join("host:port", group, token, size=4)        # blocks until PEERS
    s.rank, s.size, s.peers          # peers[r] = (public_ip, public_port) as the server saw it
    s.barrier()                      # bootstrap barrier, epochs 0, 1, 2, ...
    s.close()                        # BYE
    sock = client.relay("host:port", group, token, my_rank, peer_rank)   # spliced socket

    lst = client.listen("host:port", name, token)   # an object server's LISTEN connection
    group, tok = lst.next_call(timeout=15)          # INCOMING: join group as rank 0 (PING sent meanwhile)
    group, tok = client.call("host:port", name, token)   # CALLED: join group as rank 1
    inc = lst.next_incoming(timeout=15)             # Incoming(group, token, caller): caller "" or
                                                    # the one a call token admitted

`join_async` is the asyncio counterpart (many peers from one thread). Server errors
raise RendezvousError with the wire code (bad_token, rank_taken, timeout, no_listener, ...).
"""
from __future__ import annotations

import asyncio
import socket
import time
from typing import List, NamedTuple, Optional, Tuple, Union

from . import protocol as P

Address = Union[str, Tuple[str, int]]


class RendezvousError(Exception):
    """The server answered ERROR <code> <reason>, or the connection ended unexpectedly."""

    def __init__(self, code: str, reason: str):
        super().__init__(f"rendezvous error {code}: {reason}")
        self.code = code
        self.reason = reason


def parse_address(address: Address) -> Tuple[str, int]:
    if isinstance(address, tuple):
        return address[0], int(address[1])
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"rendezvous address {address!r} is not 'host:port'")
    return host.strip("[]"), int(port)


def reuse_socket(bind: Optional[Tuple[str, int]] = None, family: int = socket.AF_INET) -> socket.socket:
    """A TCP socket with SO_REUSEADDR and SO_REUSEPORT set before bind (hole punching shares the port)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if bind is not None:
        sock.bind(bind)
    return sock


def _expect(line: bytes, verb: str) -> List[str]:
    try:
        got, fields = P.parse_server_line(line)
    except P.ProtocolError as exc:
        raise RendezvousError(exc.code, exc.reason) from None
    if got != verb:
        raise RendezvousError(P.MALFORMED, f"expected {verb} from the server, got {line[:80]!r}")
    return fields


def _peer_table(n_line: bytes, lines: List[bytes]) -> List[Tuple[str, int]]:
    n = int(_expect(n_line, "PEERS")[0])
    table: List[Tuple[str, int]] = [("", 0)] * n
    for line in lines:
        rank, ip, port = _expect(line, "PEER")
        table[int(rank)] = (ip, int(port))
    return table


class _LineSocket:
    """Blocking line reader over a socket, with a deadline per call."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def readline(self, deadline: Optional[float]) -> bytes:
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line, self.buf = self.buf[:i], self.buf[i + 1:]
                return line
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RendezvousError(P.TIMEOUT, "no answer from the rendezvous server in time")
                self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                raise RendezvousError(P.TIMEOUT, "no answer from the rendezvous server in time") from None
            if not data:
                raise RendezvousError("closed", "the rendezvous server closed the connection")
            self.buf += data


def _deadline(timeout: Optional[float]) -> Optional[float]:
    return None if timeout is None else time.monotonic() + timeout


def _connect(address: Address, timeout: Optional[float], bind) -> socket.socket:
    host, port = parse_address(address)
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = reuse_socket(bind, family)
    sock.settimeout(timeout)
    try:
        sock.connect(sockaddr)
    except BaseException:
        sock.close()
        raise
    return sock


class _Control:
    """A control connection to the rendezvous server: says BYE and closes, also as a context."""

    sock: socket.socket

    def close(self) -> None:
        try:
            self.sock.sendall(b"BYE\n")
        except OSError:
            pass
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Session(_Control):
    """A joined control connection: rank, size, and (after wait_peers) the peer table."""

    def __init__(self, sock: socket.socket, reader: _LineSocket, rank: int, size: int):
        self.sock = sock
        self._reader = reader
        self.rank = rank
        self.size = size
        self.peers: Optional[List[Tuple[str, int]]] = None
        self._epoch = 0

    @property
    def local_address(self) -> Tuple[str, int]:
        return self.sock.getsockname()[:2]

    def wait_peers(self, timeout: Optional[float] = 60.0) -> List[Tuple[str, int]]:
        """Block until the group is complete; returns peers[rank] = (public_ip, public_port)."""
        if self.peers is None:
            deadline = _deadline(timeout)
            head = self._reader.readline(deadline)
            n = int(_expect(head, "PEERS")[0])
            self.peers = _peer_table(head, [self._reader.readline(deadline) for _ in range(n)])
        return self.peers

    def barrier(self, epoch: Optional[int] = None, timeout: Optional[float] = 60.0) -> int:
        """Wait until every rank reached barrier `epoch` (default: the next one); returns the epoch."""
        epoch = self._epoch if epoch is None else epoch
        self.sock.sendall(b"BARRIER %d\n" % epoch)
        deadline = _deadline(timeout)
        while True:
            fields = _expect(self._reader.readline(deadline), "BARRIER_OK")
            if int(fields[0]) == epoch:
                self._epoch = epoch + 1
                return epoch

    def result(self, peer_rank: int, mode: str) -> None:
        """Report how the channel to `peer_rank` ended up (direct or relay)."""
        self.sock.sendall(f"RESULT {peer_rank} {mode}\n".encode())



def connect(address: Address, group: str, token: str, size: int, rank: Optional[int] = None,
            timeout: Optional[float] = 30.0, bind: Optional[Tuple[str, int]] = None) -> Session:
    """JOIN and return after WELCOME (the group may not be complete yet: see Session.wait_peers)."""
    deadline = _deadline(timeout)
    sock = _connect(address, timeout, bind)
    try:
        sock.sendall(f"JOIN {group} {token} {size} {-1 if rank is None else rank}\n".encode())
        reader = _LineSocket(sock)
        got_rank, got_size = (int(x) for x in _expect(reader.readline(deadline), "WELCOME"))
        return Session(sock, reader, got_rank, got_size)
    except BaseException:
        sock.close()
        raise


def join(address: Address, group: str, token: str, size: int, rank: Optional[int] = None,
         timeout: Optional[float] = 30.0, bind: Optional[Tuple[str, int]] = None) -> Session:
    """JOIN and block until the group is complete (PEERS received)."""
    deadline = _deadline(timeout)
    session = connect(address, group, token, size, rank, timeout, bind)
    try:
        session.wait_peers(None if deadline is None else max(0.0, deadline - time.monotonic()))
    except BaseException:
        session.sock.close()
        raise
    return session


def relay(address: Address, group: str, token: str, my_rank: int, peer_rank: int,
          timeout: Optional[float] = 30.0) -> socket.socket:
    """Open a relay half and return the socket once the server spliced it to `peer_rank`'s."""
    deadline = _deadline(timeout)
    sock = _connect(address, timeout, None)
    try:
        sock.sendall(f"RELAY {group} {token} {my_rank} {peer_rank}\n".encode())
        # Read byte by byte up to the newline: whatever follows RELAYED is the peer's stream.
        line = b""
        while not line.endswith(b"\n"):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise RendezvousError(P.TIMEOUT, "no RELAYED from the rendezvous server in time")
            sock.settimeout(left)
            try:
                ch = sock.recv(1)
            except socket.timeout:
                raise RendezvousError(P.TIMEOUT, "no RELAYED from the rendezvous server in time") from None
            if not ch:
                raise RendezvousError("closed", "the rendezvous server closed the relay connection")
            line += ch
            if len(line) > P.MAX_LINE:
                raise RendezvousError(P.MALFORMED, "server line too long")
        _expect(line[:-1], "RELAYED")
        sock.settimeout(None)
        return sock
    except BaseException:
        sock.close()
        raise


# ---- LISTEN / CALL ---------------------------------------------------------------------------

class Incoming(NamedTuple):
    """A call a listener received: join `group` as rank 0 with `token`; `caller` is the
    caller a call token admitted ("" for a holder of the name's token)."""

    group: str
    token: str
    caller: str


class Listener(_Control):
    """A LISTEN connection: holds `name` at the server and receives one INCOMING per call.

    One thread uses it: `next_call` waits for the next call and sends a PING whenever
    `ping_interval` seconds pass without one (so the server and NATs keep the connection);
    a server silent for `3 * ping_interval` after a PING counts as lost ("closed")."""

    def __init__(self, sock: socket.socket, reader: _LineSocket, name: str, ping_interval: float):
        self.sock, self._reader, self.name = sock, reader, name
        self.ping_interval = ping_interval
        self._next_ping = time.monotonic() + ping_interval
        self._unanswered: Optional[float] = None    # when the oldest unanswered PING was sent

    def next_call(self, timeout: Optional[float] = None) -> Optional[Tuple[str, str]]:
        """(group, token) of the next call, or None when `timeout` passed without one."""
        got = self.next_incoming(timeout)
        return None if got is None else (got.group, got.token)

    def next_incoming(self, timeout: Optional[float] = None) -> Optional[Incoming]:
        """The next call (Incoming), or None when `timeout` passed without one."""
        deadline = _deadline(timeout)
        while True:
            now = time.monotonic()
            if now >= self._next_ping:
                self.sock.sendall(b"PING\n")
                if self._unanswered is None:
                    self._unanswered = now
                self._next_ping = now + self.ping_interval
            if self._unanswered is not None and now - self._unanswered > 3 * self.ping_interval:
                raise RendezvousError("closed", f"the rendezvous server did not answer PING for "
                                                f"{now - self._unanswered:.0f} s")
            wake = self._next_ping if deadline is None else min(self._next_ping, deadline)
            try:
                line = self._reader.readline(wake)
            except RendezvousError as exc:
                if exc.code != P.TIMEOUT:
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            verb = line.split(b" ", 1)[0]
            if verb == b"PONG":
                self._unanswered = None
                continue
            fields = _expect(line, "INCOMING")
            if len(fields) not in (2, 3):
                raise RendezvousError(P.MALFORMED, f"expected INCOMING <group> <token> [<caller>], got "
                                                   f"{len(fields)} fields")
            return Incoming(fields[0], fields[1], fields[2] if len(fields) == 3 else "")



def listen(address: Address, name: str, token: str, timeout: Optional[float] = 30.0,
           ping_interval: float = 15.0) -> Listener:
    """LISTEN under `name` (token: make_token(secret, name)); returns after LISTENING."""
    deadline = _deadline(timeout)
    sock = _connect(address, timeout, None)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.sendall(f"LISTEN {name} {token}\n".encode())
        reader = _LineSocket(sock)
        _expect(reader.readline(deadline), "LISTENING")
        sock.settimeout(None)
        return Listener(sock, reader, name, ping_interval)
    except BaseException:
        sock.close()
        raise


def call(address: Address, name: str, token: str, timeout: Optional[float] = 30.0,
         caller: str = "") -> Tuple[str, str]:
    """CALL the listener of `name`: (group, token) of a fresh 2-rank group to join as rank 1.
    With `caller`, `token` is a call token for (name, caller) (tokens.make_call_token)."""
    deadline = _deadline(timeout)
    sock = _connect(address, timeout, None)
    try:
        sock.sendall((f"CALL {name} {token} {caller}\n" if caller else f"CALL {name} {token}\n").encode())
        group, group_token = _expect(_LineSocket(sock).readline(deadline), "CALLED")
        return group, group_token
    finally:
        sock.close()


# ---- asyncio -------------------------------------------------------------------------------

class AsyncSession:
    """asyncio counterpart of Session (after join_async the peer table is filled)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rank: int, size: int,
                 peers: List[Tuple[str, int]]):
        self.reader, self.writer = reader, writer
        self.rank, self.size, self.peers = rank, size, peers
        self._epoch = 0
        self.local_address: Tuple[str, int] = tuple(writer.get_extra_info("sockname")[:2])

    async def barrier(self, epoch: Optional[int] = None) -> int:
        epoch = self._epoch if epoch is None else epoch
        self.writer.write(b"BARRIER %d\n" % epoch)
        while True:
            fields = _expect(await self._line(), "BARRIER_OK")
            if int(fields[0]) == epoch:
                self._epoch = epoch + 1
                return epoch

    async def _line(self) -> bytes:
        line = await self.reader.readline()
        if not line.endswith(b"\n"):
            raise RendezvousError("closed", "the rendezvous server closed the connection")
        return line[:-1]

    def close(self) -> None:
        self.writer.close()


async def join_async(address: Address, group: str, token: str, size: int, rank: Optional[int] = None,
                     timeout: Optional[float] = 30.0) -> AsyncSession:
    """JOIN and wait for PEERS on the running loop; raises RendezvousError like `join`."""
    host, port = parse_address(address)

    async def go():
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(f"JOIN {group} {token} {size} {-1 if rank is None else rank}\n".encode())

            async def line():
                raw = await reader.readline()
                if not raw.endswith(b"\n"):
                    raise RendezvousError("closed", "the rendezvous server closed the connection")
                return raw[:-1]

            got_rank, got_size = (int(x) for x in _expect(await line(), "WELCOME"))
            head = await line()
            n = int(_expect(head, "PEERS")[0])
            table = _peer_table(head, [await line() for _ in range(n)])
            return AsyncSession(reader, writer, got_rank, got_size, table)
        except BaseException:
            writer.close()
            raise

    try:
        return await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError:
        raise RendezvousError(P.TIMEOUT, "no answer from the rendezvous server in time") from None
