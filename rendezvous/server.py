"""The rendezvous server core: groups, atomic rank assignment, PEERS, barriers, relay splicing.

One asyncio Protocol instance per TCP connection (no streams: a pairing is a handful of
short lines, and per-connection overhead is what limits pairings per second). Everything
runs on one event loop, so rank assignment is atomic by construction. docs/comm.md is the
wire contract; a protocol error closes only the connection that made it.

Object servers (skyfn's direct data connector) stay reachable behind their NAT through a
LISTEN connection held under a name; a consumer's CALL of that name makes a fresh 2-rank
group (rank 0 the listener, rank 1 the caller, tokens minted here) that both then JOIN and
punch like any other group, relay fallback included.
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

from . import protocol as P
from . import splice
from .tokens import TokenError, make_token, verify_call_token, verify_token

log = logging.getLogger("rendezvous")

# Bytes a relay half may send before its partner arrives (it should send none).
_RELAY_EARLY_LIMIT = 64 * 1024
# After ERROR the server half-closes and discards input for this long before closing: closing
# with unread input would send a reset, and the peer could lose the ERROR line.
_LINGER_S = 1.0
# BARRIERs one connection may have outstanding (a client waits for each; this bounds memory).
_MAX_PENDING_BARRIERS = 16
# Write buffer limits of spliced relay connections: big enough for full-speed streaming,
# small enough that a slow reader holds back its writer instead of filling our memory.
_SPLICE_HIGH = 4 * 1024 * 1024
_SPLICE_LOW = 1024 * 1024


@dataclass
class Limits:
    """Bounds that let one server survive floods (hitting one answers ERROR busy)."""

    max_connections: int = 16000          # open connections (control, relay, spliced) at most
    max_groups: int = 8000                # groups still filling at most (complete ones hold connections)
    join_timeout_s: float = 60.0          # a group, or a relay half, waits this long for its peers
    first_line_timeout_s: float = 10.0    # for the JOIN or RELAY line of a new connection
    zero_copy_relay: bool = True          # splice(2) relays where the platform has it; else Python forwarding
    listen_idle_timeout_s: float = 90.0   # a LISTEN connection silent this long (no PING) is closed


class Group:
    """One group: who joined at which rank, and (after completion) the barrier epochs."""

    __slots__ = ("gid", "size", "members", "low", "complete", "timer", "barriers", "open", "lost")

    def __init__(self, gid: str, size: int):
        self.gid = gid
        self.size = size
        self.members: Dict[int, "Connection"] = {}
        self.low = 0                  # every rank below `low` is taken
        self.complete = False
        self.timer: Optional[asyncio.TimerHandle] = None
        self.barriers: Dict[int, set] = {}
        self.open = 0                 # control connections still open after completion
        self.lost: Optional[int] = None   # a rank that left after completion

    def take(self, rank: int) -> int:
        if rank < 0:
            while self.low in self.members:
                self.low += 1
            rank = self.low
        return rank

    def free(self, rank: int) -> None:
        del self.members[rank]
        if rank < self.low:
            self.low = rank
        for waiting in self.barriers.values():
            waiting.discard(rank)


class Connection(asyncio.Protocol):
    """One peer connection: control (JOIN ...) or relay (RELAY ...), chosen by its first line."""

    __slots__ = ("server", "transport", "address", "buf", "group", "rank", "relay_key", "partner",
                 "timer", "closed", "paused", "eof", "barriers", "listen_name")

    def __init__(self, server: "RendezvousServer"):
        self.server = server
        self.transport: Optional[asyncio.Transport] = None
        self.address: Tuple[str, int] = ("?", 0)
        self.buf = b""
        self.group: Optional[Group] = None
        self.rank = -1
        self.relay_key: Optional[Tuple[str, int, int]] = None
        self.partner: Optional["Connection"] = None
        self.timer: Optional[asyncio.TimerHandle] = None
        self.closed = False
        self.paused = False
        self.eof = False
        self.barriers = 0             # outstanding BARRIER requests
        self.listen_name: Optional[str] = None   # a LISTEN connection: the name it holds

    # ---- asyncio callbacks ----------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport
        srv = self.server
        srv.open_connections.add(self)
        peer = transport.get_extra_info("peername")
        if peer:
            self.address = (peer[0], peer[1])
        if srv.connections + srv.spliced_sockets > srv.limits.max_connections:
            self.fail(P.BUSY, f"server has {srv.limits.max_connections} connections; retry later")
            return
        self.timer = srv.loop.call_later(srv.limits.first_line_timeout_s, self._first_line_timeout)

    def data_received(self, data: bytes):
        partner = self.partner
        if partner is not None:
            if not partner.closed:
                partner.transport.write(data)
            return
        if self.closed:
            return
        if self.relay_key is not None:
            # A relay half waiting for its partner: keep early bytes for the splice.
            self.buf += data
            if len(self.buf) > _RELAY_EARLY_LIMIT:
                self.fail(P.MALFORMED, "relay data sent before RELAYED")
            return
        buf = self.buf + data if self.buf else data
        self.buf = b""
        start = 0
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            if end - start >= P.MAX_LINE:
                self.fail(P.MALFORMED, f"line longer than {P.MAX_LINE} bytes")
                return
            line = buf[start:end]
            start = end + 1
            if line.startswith(b"RELAY "):
                self.buf = buf[start:]    # if accepted, the rest belongs to the relayed stream
            self._line(line)
            if self.closed:
                return
            if self.relay_key is not None:
                # relay() forwarded the rest to the partner, or keeps it until the partner arrives.
                if self.partner is None and len(self.buf) > _RELAY_EARLY_LIMIT:
                    self.fail(P.MALFORMED, "relay data sent before RELAYED")
                return
        if start < len(buf):
            self.buf = buf[start:]
            if len(self.buf) >= P.MAX_LINE:
                self.fail(P.MALFORMED, f"line longer than {P.MAX_LINE} bytes")

    def eof_received(self):
        partner = self.partner
        if partner is None:
            return False          # a control peer half-closed: close the connection
        self.eof = True
        if partner.eof:
            self.transport.close()
            partner.transport.close()
            return True
        if not partner.closed and partner.transport.can_write_eof():
            partner.transport.write_eof()
        return True               # keep writing the other direction

    def connection_lost(self, exc):
        self.closed = True
        srv = self.server
        srv.open_connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        partner = self.partner
        if partner is not None:
            if not partner.closed:
                partner.transport.close()
            return
        if self.relay_key is not None:
            if srv.relays.get(self.relay_key) is self:
                del srv.relays[self.relay_key]
            return
        if self.listen_name is not None:
            srv.unlisten(self)
        if self.group is not None:
            srv.leave(self)

    # relay backpressure: our transport's write buffer is full -> stop reading the partner
    def pause_writing(self):
        partner = self.partner
        if partner is not None and not partner.closed and not partner.paused:
            partner.paused = True
            partner.transport.pause_reading()

    def resume_writing(self):
        partner = self.partner
        if partner is not None and not partner.closed and partner.paused:
            partner.paused = False
            partner.transport.resume_reading()

    # ---- helpers ----------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def fail(self, code: str, reason: str) -> None:
        """ERROR <code> <reason>, then close this connection only."""
        if self.closed:
            return
        log.info("error %s to %s:%d: %s", code, self.address[0], self.address[1], reason)
        self.server.stats["errors"] += 1
        self.transport.write(P.error(code, reason))
        self.drop(linger=True)

    def drop(self, linger: bool = False) -> None:
        """Close, and leave the group at once (not at connection_lost: barriers must see it now)."""
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()        # input is discarded until the peer closes or time is up
            self.timer = self.server.loop.call_later(_LINGER_S, self.transport.close)
        else:
            self.transport.close()
        if self.group is not None:
            self.server.leave(self)
        elif self.relay_key is not None and self.server.relays.get(self.relay_key) is self:
            del self.server.relays[self.relay_key]
        elif self.listen_name is not None:
            self.server.unlisten(self)

    def _first_line_timeout(self):
        self.timer = None
        self.fail(P.TIMEOUT, f"no JOIN or RELAY line within {self.server.limits.first_line_timeout_s:g} s")

    def _line(self, raw: bytes) -> None:
        try:
            msg = P.parse_peer_line(raw)
        except P.ProtocolError as exc:
            self.fail(exc.code, exc.reason)
            return
        kind = type(msg)
        if self.listen_name is not None:
            if kind is P.Ping:
                self.server.ping(self)
            elif kind is P.Bye:
                self.drop()
            else:
                self.fail(P.MALFORMED, f"{kind.__name__.upper()} after LISTEN: a listener sends only PING or BYE")
            return
        if self.group is None:
            if kind is P.Join:
                self.server.join(self, msg)
            elif kind is P.Relay:
                self.server.relay(self, msg)
            elif kind is P.Listen:
                self.server.listen(self, msg)
            elif kind is P.Call:
                self.server.call(self, msg)
            else:
                self.fail(P.MALFORMED, "the first line must be JOIN or RELAY (LISTEN or CALL for object servers)")
            return
        if kind is P.Barrier:
            self.server.barrier(self, msg.epoch)
        elif kind is P.Result:
            log.debug("group %s: rank %d reports %s to rank %d", self.group.gid, self.rank, msg.mode,
                      msg.peer_rank)
        elif kind is P.Bye:
            self.drop()
        else:
            self.fail(P.MALFORMED, f"{kind.__name__.upper()} after JOIN")


class RendezvousServer:
    """State of one server; `start()` binds and listens on the running loop."""

    def __init__(self, secret: Union[str, bytes], limits: Optional[Limits] = None):
        if isinstance(secret, str):
            secret = secret.encode()
        if not secret:
            raise ValueError("the rendezvous secret is empty: pass --secret or set SKYFN_RENDEZVOUS_SECRET")
        self._secret = secret
        self.limits = limits or Limits()
        self.groups: Dict[str, Group] = {}
        self.relays: Dict[Tuple[str, int, int], Connection] = {}
        self.listeners: Dict[str, Connection] = {}
        self.open_connections: set = set()   # lingering ones included (stop() closes them)
        self.filling = 0              # groups not complete yet (complete ones are bounded by connections)
        self.spliced_sockets = 0
        self._pairs: set = set()
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self._server: Optional[asyncio.base_events.Server] = None
        self.stats = {"joins": 0, "groups_completed": 0, "relays_spliced": 0, "errors": 0, "listens": 0,
                      "calls": 0}

    @property
    def connections(self) -> int:
        """Open connections that still have a transport (spliced relays are counted apart)."""
        return len(self.open_connections)

    async def start(self, host: str, port: int, backlog: int = 4096) -> Tuple[str, int]:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(lambda: Connection(self), host, port, backlog=backlog,
                                                     reuse_address=True)
        sockname = self._server.sockets[0].getsockname()
        log.info("rendezvous listening on %s:%d", sockname[0], sockname[1])
        return sockname[0], sockname[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for conn in list(self.open_connections):
            conn.transport.close()
        for pair in list(self._pairs):
            pair.close()

    # ---- JOIN -------------------------------------------------------------------------

    def _admit(self, conn: Connection, group: str, token: str, caller: str = "") -> bool:
        try:
            if caller:
                verify_call_token(self._secret, group, caller, token)
            else:
                verify_token(self._secret, group, token)
        except TokenError as exc:
            conn.fail(exc.code, exc.reason)
            return False
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        return True

    def join(self, conn: Connection, msg: P.Join) -> None:
        if not self._admit(conn, msg.group, msg.token):
            return
        size, rank = msg.size, msg.rank
        if rank >= size:
            conn.fail(P.RANK_OUT_OF_RANGE, f"rank {rank} is not in [0, {size - 1}] (or -1 for any free rank)")
            return
        group = self.groups.get(msg.group)
        if group is None:
            if self.filling >= self.limits.max_groups:
                conn.fail(P.BUSY, f"server has {self.limits.max_groups} groups still filling; retry later")
                return
            group = self.groups[msg.group] = Group(msg.group, size)
            self.filling += 1
            group.timer = self.loop.call_later(self.limits.join_timeout_s, self._group_timeout, group)
        elif group.size != size:
            conn.fail(P.SIZE_MISMATCH, f"group {msg.group} has size {group.size}, this JOIN says {size}")
            return
        elif group.complete:
            conn.fail(P.GROUP_FULL, f"group {msg.group} already has all {size} peers")
            return
        rank = group.take(rank)
        if rank in group.members:
            conn.fail(P.RANK_TAKEN, f"rank {rank} of group {msg.group} is taken; ask for -1 to get any "
                                    "free rank")
            return
        group.members[rank] = conn
        conn.group = group
        conn.rank = rank
        self.stats["joins"] += 1
        log.info("join group %s rank %d/%d from %s:%d", group.gid, rank, size, conn.address[0],
                 conn.address[1])
        if len(group.members) < size:
            conn.send(P.welcome(rank, size))
            return
        # Complete: everyone gets PEERS (the last joiner with its WELCOME in one write).
        group.complete = True
        self.filling -= 1
        group.open = size
        group.timer.cancel()
        group.timer = None
        self.stats["groups_completed"] += 1
        members = group.members
        table = P.peers([members[r].address for r in range(size)])
        for r in range(size):
            member = members[r]
            member.send(P.welcome(rank, size) + table if member is conn else table)

    def _group_timeout(self, group: Group) -> None:
        group.timer = None
        self.filling -= 1
        if self.groups.get(group.gid) is group:
            del self.groups[group.gid]
        reason = (f"group {group.gid} got {len(group.members)} of {group.size} peers within "
                  f"{self.limits.join_timeout_s:g} s")
        for conn in list(group.members.values()):
            conn.group = None     # nothing to free any more
            conn.fail(P.TIMEOUT, reason)

    def leave(self, conn: Connection) -> None:
        """A control connection closed: free its rank, or wind the completed group down."""
        group = conn.group
        conn.group = None
        if not group.complete:
            group.free(conn.rank)
            if not group.members:
                self.filling -= 1
                if group.timer is not None:
                    group.timer.cancel()
                if self.groups.get(group.gid) is group:
                    del self.groups[group.gid]
            return
        group.open -= 1
        if group.open <= 0:
            if self.groups.get(group.gid) is group:
                del self.groups[group.gid]
            return
        if group.lost is None:
            group.lost = conn.rank
        # A barrier can no longer complete: tell whoever waits in one.
        pending, group.barriers = group.barriers, {}
        for epoch, waiting in pending.items():
            for r in waiting:
                group.members[r].fail(P.PEER_LOST, f"rank {conn.rank} of group {group.gid} closed its "
                                                   f"connection before barrier {epoch}")

    # ---- BARRIER ----------------------------------------------------------------------

    def barrier(self, conn: Connection, epoch: int) -> None:
        group = conn.group
        if group.lost is not None:
            conn.fail(P.PEER_LOST, f"rank {group.lost} of group {group.gid} closed its connection; "
                                   f"barrier {epoch} cannot complete")
            return
        waiting = group.barriers.setdefault(epoch, set())
        if conn.rank in waiting:
            return                    # a repeated BARRIER for the same epoch changes nothing
        if conn.barriers >= _MAX_PENDING_BARRIERS:
            conn.fail(P.MALFORMED, f"more than {_MAX_PENDING_BARRIERS} barriers outstanding; wait for "
                                   "BARRIER_OK before the next BARRIER")
            return
        waiting.add(conn.rank)
        conn.barriers += 1
        if len(waiting) == group.size:
            del group.barriers[epoch]
            line = P.barrier_ok(epoch)
            for member in group.members.values():
                member.barriers -= 1
                member.send(line)

    # ---- RELAY ------------------------------------------------------------------------

    def relay(self, conn: Connection, msg: P.Relay) -> None:
        if not self._admit(conn, msg.group, msg.token):
            return
        key = (msg.group, msg.my_rank, msg.peer_rank)
        if key in self.relays:
            conn.fail(P.RANK_TAKEN, f"a relay from rank {msg.my_rank} to rank {msg.peer_rank} of group "
                                    f"{msg.group} is already waiting")
            return
        other = self.relays.pop((msg.group, msg.peer_rank, msg.my_rank), None)
        if other is None:
            conn.relay_key = key
            self.relays[key] = conn
            conn.timer = self.loop.call_later(self.limits.join_timeout_s, self._relay_timeout, conn)
            return
        conn.relay_key = key
        if other.timer is not None:
            other.timer.cancel()
            other.timer = None
        self.stats["relays_spliced"] += 1
        log.info("relay group %s ranks %d<->%d spliced", msg.group, msg.my_rank, msg.peer_rank)
        for a in (conn, other):
            a.transport.write(P.RELAYED)
        if self.limits.zero_copy_relay and splice.available() and all(
                a.transport.get_write_buffer_size() == 0 for a in (conn, other)):
            heads = (conn.buf, other.buf)
            socks = (self._detach(conn), self._detach(other))
            try:
                pair = splice.SplicedPair(self.loop, socks[0], socks[1], heads[0], heads[1],
                                          on_close=self._pair_closed)
            except OSError as exc:     # no pipe left (descriptor limit): both halves must retry
                log.warning("relay group %s ranks %d<->%d: cannot splice (%s); closed both halves", msg.group,
                            msg.my_rank, msg.peer_rank, exc)
                for sock in socks:
                    sock.close()
                return
            self._pairs.add(pair)
            self.spliced_sockets += 2
            pair.start()
            return
        for a, b in ((conn, other), (other, conn)):
            a.partner = b
            a.transport.set_write_buffer_limits(high=_SPLICE_HIGH, low=_SPLICE_LOW)
        for a, b in ((conn, other), (other, conn)):
            if a.buf:
                early, a.buf = a.buf, b""
                b.transport.write(early)

    @staticmethod
    def _detach(conn: Connection) -> socket.socket:
        """Take the socket away from its transport (RELAYED is already sent): a dup, then abort."""
        fd = os.dup(conn.transport.get_extra_info("socket").fileno())
        conn.closed = True
        conn.relay_key = None
        conn.transport.abort()     # closes only the transport's descriptor; the dup keeps the connection
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        return sock

    def _pair_closed(self, pair) -> None:
        self._pairs.discard(pair)
        self.spliced_sockets -= 2

    def _relay_timeout(self, conn: Connection) -> None:
        conn.timer = None
        if self.relays.get(conn.relay_key) is conn:
            del self.relays[conn.relay_key]
        group, me, peer = conn.relay_key
        conn.fail(P.TIMEOUT, f"rank {peer} of group {group} did not open its relay to rank {me} within "
                             f"{self.limits.join_timeout_s:g} s")

    # ---- LISTEN / CALL (object servers behind NATs) -------------------------------------

    def listen(self, conn: Connection, msg: P.Listen) -> None:
        """Hold `msg.name` for this connection until it closes, says BYE or stays silent."""
        if not self._admit(conn, msg.name, msg.token):
            return
        held = self.listeners.get(msg.name)
        if held is not None and not held.closed:
            conn.fail(P.NAME_TAKEN, f"an object server already listens as {msg.name} (from {held.address[0]}); "
                                    "stop it or pick another name (a silent listener is dropped after "
                                    f"{self.limits.listen_idle_timeout_s:g} s)")
            return
        conn.listen_name = msg.name
        self.listeners[msg.name] = conn
        self.stats["listens"] += 1
        log.info("listen %s from %s:%d", msg.name, conn.address[0], conn.address[1])
        conn.send(P.listening(msg.name))
        self._arm_idle(conn)

    def _arm_idle(self, conn: Connection) -> None:
        if conn.timer is not None:
            conn.timer.cancel()
        conn.timer = self.loop.call_later(self.limits.listen_idle_timeout_s, self._listen_timeout, conn)

    def _listen_timeout(self, conn: Connection) -> None:
        conn.timer = None
        conn.fail(P.TIMEOUT, f"listener {conn.listen_name} sent no PING within "
                             f"{self.limits.listen_idle_timeout_s:g} s")

    def ping(self, conn: Connection) -> None:
        self._arm_idle(conn)
        conn.send(P.PONG)

    def unlisten(self, conn: Connection) -> None:
        if self.listeners.get(conn.listen_name) is conn:
            del self.listeners[conn.listen_name]
            log.info("listener %s closed", conn.listen_name)

    def call(self, conn: Connection, msg: P.Call) -> None:
        """A fresh 2-rank group for the caller and the listener of `msg.name`: both are told
        its id and a token for it (the listener INCOMING, the caller CALLED), then this
        connection closes; the two JOIN it (listener rank 0, caller rank 1). A call with a
        caller needs a call token for (name, caller); the listener is told the caller."""
        if not self._admit(conn, msg.name, msg.token, msg.caller):
            return
        listener = self.listeners.get(msg.name)
        if listener is None or listener.closed:
            conn.fail(P.NO_LISTENER, f"no object server listens as {msg.name}: start it (python -m "
                                     "endpoint_agent.data.object_server, or `data: direct:` in the endpoint's "
                                     "config) or check the name")
            return
        group = f"{msg.name}@{secrets.token_hex(8)}"
        token = make_token(self._secret, group, ttl_s=self.limits.join_timeout_s + 300)
        self.stats["calls"] += 1
        log.info("call %s from %s:%d: group %s", msg.name, conn.address[0], conn.address[1], group)
        listener.send(P.incoming(group, token, msg.caller))
        conn.send(P.called(group, token))
        conn.drop(linger=True)
