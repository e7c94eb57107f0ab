"""The rendezvous server over real sockets: ranks, PEERS, errors, barriers, timeouts, relays.

Each server runs on its own event loop in a background thread (rendezvous.serve_in_thread);
peers are real TCP clients (rendezvous.client, or raw sockets for malformed input).
"""
from __future__ import annotations

import hashlib
import os
import socket
import threading
import time

import pytest

import rendezvous
from rendezvous import Limits, client, make_token
from rendezvous.client import RendezvousError

SECRET = "test-secret"


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def server(request):
    handle = rendezvous.serve_in_thread("127.0.0.1", 0, SECRET, loop=request.param)
    yield handle
    handle.stop()


@pytest.fixture
def gid(unique):
    counter = iter(range(1000))
    return lambda: f"g-{unique}-{next(counter)}"


def tok(group, secret=SECRET, **kw):
    return make_token(secret, group, **kw)


def raw_exchange(address, payload: bytes, timeout=10.0) -> bytes:
    """Send `payload` on a fresh connection; return everything received until the server closes."""
    with socket.create_connection(address, timeout=timeout) as sock:
        try:
            sock.sendall(payload)
        except OSError:
            pass  # the server may already have closed on the first bad byte
        got = b""
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            got += data
    return got


def wait_for(predicate, timeout=10.0):
    """Wait until the server thread has processed some event (a condition, not a timing check)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def join_in_threads(address, group, token, size, ranks):
    """Join `len(ranks)` peers concurrently; returns (sessions, errors) by index."""
    sessions, errors = [None] * len(ranks), [None] * len(ranks)

    def go(i):
        try:
            sessions[i] = client.join(address, group, token, size, ranks[i], timeout=20)
        except Exception as exc:  # noqa: BLE001 - collected for the assertions
            errors[i] = exc
    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(ranks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sessions, errors


# ---- ranks and PEERS ---------------------------------------------------------------------

def test_explicit_ranks_and_public_addresses(server, gid):
    g = gid()
    sessions, errors = join_in_threads(server.address, g, tok(g), 3, [2, 0, 1])
    assert errors == [None] * 3
    assert [s.rank for s in sessions] == [2, 0, 1]
    table = sessions[0].peers
    # Every peer gets the same table: rank r's address is r's source address as the server saw it.
    assert all(s.peers == table for s in sessions)
    for s in sessions:
        assert table[s.rank] == s.local_address
    for s in sessions:
        s.close()


def test_any_rank_gets_the_lowest_free_one(server, gid):
    g = gid()
    t = tok(g)
    one = client.connect(server.address, g, t, 4, 1)
    a = client.connect(server.address, g, t, 4, None)
    b = client.connect(server.address, g, t, 4, -1)
    assert (one.rank, a.rank, b.rank) == (1, 0, 2)
    c = client.connect(server.address, g, t, 4)
    assert c.rank == 3 and c.size == 4
    peers = [s.wait_peers(10) for s in (one, a, b, c)]
    assert all(p == peers[0] for p in peers) and len(peers[0]) == 4
    for s in (one, a, b, c):
        s.close()


def test_rank_of_a_peer_that_left_before_completion_is_freed(server, gid):
    g = gid()
    t = tok(g)
    first = client.connect(server.address, g, t, 2)
    assert first.rank == 0
    first.sock.close()
    wait_for(lambda: g not in server.server.groups)
    a = client.connect(server.address, g, t, 2)
    assert a.rank == 0
    explicit = client.connect(server.address, g, t, 2, 1)
    assert explicit.rank == 1
    assert a.wait_peers(10) == explicit.wait_peers(10)
    a.close()
    explicit.close()


def test_rank_errors(server, gid):
    g = gid()
    t = tok(g)
    a = client.connect(server.address, g, t, 3, 1)
    with pytest.raises(RendezvousError) as err:
        client.connect(server.address, g, t, 3, 1)
    assert err.value.code == "rank_taken" and "ask for -1" in err.value.reason
    with pytest.raises(RendezvousError) as err:
        client.connect(server.address, g, t, 3, 3)
    assert err.value.code == "rank_out_of_range" and "[0, 2]" in err.value.reason
    with pytest.raises(RendezvousError) as err:
        client.connect(server.address, g, t, 4, 0)
    assert err.value.code == "size_mismatch" and "has size 3" in err.value.reason
    b = client.connect(server.address, g, t, 3)
    c = client.connect(server.address, g, t, 3)
    assert sorted([a.rank, b.rank, c.rank]) == [0, 1, 2]
    assert a.wait_peers(10) == b.wait_peers(10) == c.wait_peers(10)
    with pytest.raises(RendezvousError) as err:
        client.connect(server.address, g, t, 3)
    assert err.value.code == "group_full"
    for s in (a, b, c):
        s.close()


def test_group_of_one(server, gid):
    g = gid()
    with client.join(server.address, g, tok(g), 1) as s:
        assert (s.rank, s.size) == (0, 1)
        assert s.peers == [s.local_address]
        assert s.barrier() == 0


def test_ipv6_listener_and_peers(gid):
    try:
        handle = rendezvous.serve_in_thread("::1", 0, SECRET)
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    with handle:
        g = gid()
        with client.join(f"[::1]:{handle.port}", g, tok(g), 1) as s:
            assert s.peers == [("::1", s.local_address[1])]


# ---- tokens and malformed input never disturb other groups -------------------------------

def test_bad_and_expired_tokens_rejected_while_another_group_completes(server, gid):
    g, other = gid(), gid()
    waiting = client.connect(server.address, g, tok(g), 2)
    with pytest.raises(RendezvousError) as err:
        client.connect(server.address, g, tok(g, secret="wrong"), 2)
    assert err.value.code == "bad_token"
    with pytest.raises(RendezvousError) as err:
        client.connect(server.address, g, tok(other), 2)          # a token of another group
    assert err.value.code == "bad_token"
    with pytest.raises(RendezvousError) as err:
        client.connect(server.address, g, tok(g, ttl_s=-5), 2)
    assert err.value.code == "expired_token"
    with pytest.raises(RendezvousError) as err:
        client.relay(server.address, g, "123.abc", 0, 1)
    assert err.value.code == "bad_token"
    last = client.connect(server.address, g, tok(g), 2)
    assert {waiting.rank, last.rank} == {0, 1}
    assert waiting.wait_peers(10) == last.wait_peers(10)
    waiting.close()
    last.close()


@pytest.mark.parametrize("payload,code,fragment", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "malformed", "unknown command"),
    (b"J" * 2000, "malformed", "longer than 1024"),
    (b"JOIN " + b"g" * 1100 + b" t 2 -1\n", "malformed", "longer than 1024"),
    (os.urandom(64).replace(b"\n", b"") + b"\n", "malformed", ""),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\n", "malformed", "not ASCII"),
    (b"BARRIER 0\n", "malformed", "first line must be JOIN or RELAY"),
    (b"JOIN g tok 0 -1\n", "malformed", "size must be in"),
    (b"JOIN bad/group tok 2 -1\n", "malformed", "group id"),
])
def test_malformed_lines_get_an_error_and_close(server, gid, payload, code, fragment):
    g = gid()
    waiting = client.connect(server.address, g, tok(g), 2)    # a bystander group
    got = raw_exchange((server.host, server.port), payload)
    assert got.startswith(b"ERROR " + code.encode() + b" ")
    assert got.count(b"\n") == 1, "one ERROR line, then the server closes"
    assert fragment.encode() in got
    last = client.connect(server.address, g, tok(g), 2)
    assert waiting.wait_peers(10) == last.wait_peers(10)
    waiting.close()
    last.close()


def test_error_survives_a_peer_that_keeps_sending(server):
    """The server half-closes and drains after ERROR, so no reset destroys the ERROR line."""
    got = raw_exchange((server.host, server.port), b"HELLO\n" + b"junk\n" * 400_000)
    assert got == (b"ERROR malformed unknown command 'HELLO': expected JOIN, RELAY, BARRIER, RESULT, BYE, LISTEN, "
                   b"CALL or PING\n")


def test_many_lines_in_one_read_are_all_handled(server, gid):
    g = gid()
    a, b = join_in_threads(server.address, g, tok(g), 2, [0, 1])[0]
    a.sock.sendall(b"RESULT 1 direct\n" * 50_000 + b"BARRIER 0\n")   # ~800 KB of lines at once
    assert b.barrier(timeout=30) == 0
    assert a._reader.readline(time.monotonic() + 30) == b"BARRIER_OK 0"
    a.close()
    b.close()


def test_a_misordered_token_is_not_echoed(server, gid):
    g = gid()
    t = tok(g)
    got = raw_exchange((server.host, server.port), f"JOIN {g} 2 -1 {t}\n".encode())
    assert got.startswith(b"ERROR malformed ")
    assert t.encode()[:12] not in got and t.split(".")[1][:8].encode() not in got


def test_second_join_on_one_connection_is_malformed(server, gid):
    g = gid()
    t = tok(g)
    got = raw_exchange((server.host, server.port), f"JOIN {g} {t} 3 -1\nJOIN {g} {t} 3 -1\n".encode())
    assert got.splitlines() == [b"WELCOME 0 3", b"ERROR malformed JOIN after JOIN"]
    wait_for(lambda: g not in server.server.groups)            # rank 0 was freed


# ---- timeouts ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def quick_server():
    handle = rendezvous.serve_in_thread("127.0.0.1", 0, SECRET, limits=Limits(join_timeout_s=0.5,
                                                                              first_line_timeout_s=0.5))
    yield handle
    handle.stop()


def test_group_that_does_not_fill_times_out(quick_server, gid):
    g = gid()
    sessions = [client.connect(quick_server.address, g, tok(g), 3) for _ in range(2)]
    for s in sessions:
        with pytest.raises(RendezvousError) as err:
            s.wait_peers(10)
        assert err.value.code == "timeout"
        assert f"group {g} got 2 of 3 peers within 0.5 s" in err.value.reason
        s.sock.close()
    assert g not in quick_server.server.groups
    # The same group id can be used again afterwards.
    sessions, errors = join_in_threads(quick_server.address, g, tok(g), 2, [-1, -1])
    assert errors == [None, None]
    for s in sessions:
        s.close()


def test_silent_connection_times_out(quick_server):
    got = raw_exchange((quick_server.host, quick_server.port), b"")
    assert got.startswith(b"ERROR timeout no JOIN or RELAY line within 0.5 s")


def test_unmatched_relay_times_out(quick_server, gid):
    g = gid()
    with pytest.raises(RendezvousError) as err:
        client.relay(quick_server.address, g, tok(g), 0, 1, timeout=10)
    assert err.value.code == "timeout" and "did not open its relay" in err.value.reason


# ---- barriers ------------------------------------------------------------------------------

def test_barrier_epochs(server, gid):
    g = gid()
    sessions, errors = join_in_threads(server.address, g, tok(g), 4, [-1] * 4)
    assert errors == [None] * 4
    for epoch in range(3):
        done = []
        threads = [threading.Thread(target=lambda s=s: done.append(s.barrier(timeout=10))) for s in sessions]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert done == [epoch] * 4
    for s in sessions:
        s.close()


def test_barrier_waits_for_every_rank(server, gid):
    g = gid()
    a, b = join_in_threads(server.address, g, tok(g), 2, [0, 1])[0]
    a.sock.sendall(b"BARRIER 5\n")
    a.sock.settimeout(0.2)
    with pytest.raises(socket.timeout):
        a.sock.recv(100)            # no BARRIER_OK while rank 1 has not arrived
    assert b.barrier(5, timeout=10) == 5
    assert a._reader.readline(time.monotonic() + 10) == b"BARRIER_OK 5"
    a.close()
    b.close()


def test_barrier_after_a_peer_left_fails_with_peer_lost(server, gid):
    g = gid()
    a, b = join_in_threads(server.address, g, tok(g), 2, [0, 1])[0]
    b.close()
    with pytest.raises(RendezvousError) as err:
        a.barrier(timeout=10)
    assert err.value.code == "peer_lost" and "rank 1" in err.value.reason
    a.sock.close()
    wait_for(lambda: g not in server.server.groups)


def test_outstanding_barriers_are_bounded(server, gid):
    g = gid()
    a, b = join_in_threads(server.address, g, tok(g), 2, [0, 1])[0]
    a.sock.sendall(b"".join(b"BARRIER %d\n" % e for e in range(17)))
    line = a._reader.readline(time.monotonic() + 10)
    assert line == b"ERROR malformed more than 16 barriers outstanding; wait for BARRIER_OK before the next BARRIER"
    a.sock.close()
    with pytest.raises(RendezvousError) as err:
        b.barrier(timeout=10)
    assert err.value.code == "peer_lost"
    b.sock.close()


def test_result_is_accepted_and_bye_closes(server, gid):
    g = gid()
    a, b = join_in_threads(server.address, g, tok(g), 2, [0, 1])[0]
    a.result(1, "direct")
    b.result(0, "relay")
    done = []
    t = threading.Thread(target=lambda: done.append(b.barrier(timeout=10)))
    t.start()
    done.append(a.barrier(timeout=10))
    t.join()
    assert done == [0, 0]
    a.sock.sendall(b"BYE\n")
    a.sock.settimeout(10)
    assert a.sock.recv(100) == b""      # the server closed after BYE
    a.sock.close()
    b.close()
    wait_for(lambda: g not in server.server.groups)


# ---- relay ---------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=[("uvloop", "splice"), ("asyncio", "splice"), ("uvloop", "python"),
                                        ("asyncio", "python")], ids="-".join)
def relay_server(request):
    """Relays are spliced in the kernel (splice(2)) or forwarded through Python: test both, on both loops."""
    loop, mode = request.param
    handle = rendezvous.serve_in_thread("127.0.0.1", 0, SECRET, loop=loop,
                                        limits=Limits(zero_copy_relay=mode == "splice"))
    yield handle
    handle.stop()


def _pump(sock, data, out, key):
    """Send `data` then half-close, while reading the other direction to EOF."""
    received = []

    def reader():
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            received.append(chunk)
    t = threading.Thread(target=reader)
    t.start()
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
    t.join()
    out[key] = b"".join(received)
    sock.close()


def open_relay_pair(handle, group, token):
    """Both halves of a relay between ranks 0 and 1 (each blocks until the other arrives)."""
    socks = {}

    def open_half(me):
        socks[me] = client.relay(handle.address, group, token, me, 1 - me, timeout=10)
    threads = [threading.Thread(target=open_half, args=(r,)) for r in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(socks) == [0, 1], "a relay half did not open"
    return socks


def test_relay_splices_both_directions_byte_exact(relay_server, gid):
    g = gid()
    t = tok(g)
    data = {0: os.urandom(6 * 1024 * 1024 + 17), 1: os.urandom(3 * 1024 * 1024 + 5)}
    socks = open_relay_pair(relay_server, g, t)
    out = {}
    pumps = [threading.Thread(target=_pump, args=(socks[r], data[r], out, r)) for r in (0, 1)]
    for th in pumps:
        th.start()
    for th in pumps:
        th.join()
    assert hashlib.sha256(out[0]).digest() == hashlib.sha256(data[1]).digest()
    assert hashlib.sha256(out[1]).digest() == hashlib.sha256(data[0]).digest()
    assert relay_server.server.stats["relays_spliced"] >= 1
    srv = relay_server.server
    wait_for(lambda: srv.connections == 0 and srv.spliced_sockets == 0)   # both halves released


def test_relay_holds_back_a_writer_whose_reader_does_not_read(relay_server, gid):
    g = gid()
    t = tok(g)
    socks = open_relay_pair(relay_server, g, t)
    data = os.urandom(1 << 20) * 64        # far more than every buffer on the way can hold
    sender = threading.Thread(target=lambda: (socks[0].sendall(data), socks[0].shutdown(socket.SHUT_WR)))
    sender.start()
    sender.join(1.0)
    assert sender.is_alive(), "64 MiB went into buffers although nobody read: no backpressure"
    got = bytearray()
    while True:
        chunk = socks[1].recv(1 << 20)
        if not chunk:
            break
        got += chunk
    sender.join()
    assert len(got) == len(data) and got == data
    for sock in socks.values():
        sock.close()


def test_relay_bytes_in_the_same_packet_as_the_matching_relay_line(relay_server, gid):
    g = gid()
    t = tok(g)
    first = socket.create_connection((relay_server.host, relay_server.port), timeout=10)
    first.sendall(f"RELAY {g} {t} 0 1\n".encode())
    wait_for(lambda: (g, 0, 1) in relay_server.server.relays)
    second = socket.create_connection((relay_server.host, relay_server.port), timeout=10)
    second.sendall(f"RELAY {g} {t} 1 0\n".encode() + b"SKYC" + bytes(range(256)) * 100)
    want = b"RELAYED\n" + b"SKYC" + bytes(range(256)) * 100
    got = b""
    while len(got) < len(want):
        chunk = first.recv(65536)
        assert chunk, "relay closed early"
        got += chunk
    assert got == want
    first.sendall(b"pong")
    got = b""
    while len(got) < len(b"RELAYED\npong"):
        got += second.recv(100)
    assert got == b"RELAYED\npong"
    first.close()
    second.close()


def test_relay_keeps_bytes_sent_before_the_partner_arrived(relay_server, gid):
    g = gid()
    t = tok(g)
    early = socket.create_connection((relay_server.host, relay_server.port), timeout=10)
    early.sendall(f"RELAY {g} {t} 3 0\n".encode() + b"SKYC early bytes")
    wait_for(lambda: (g, 3, 0) in relay_server.server.relays)
    late = client.relay(relay_server.address, g, t, 0, 3, timeout=10)
    got = b""
    while len(got) < len(b"SKYC early bytes"):
        got += late.recv(100)
    assert got == b"SKYC early bytes"
    line = b""
    while not line.endswith(b"\n"):
        line += early.recv(1)
    assert line == b"RELAYED\n"
    late.sendall(b"back")
    assert early.recv(100) == b"back"
    late.close()
    assert early.recv(100) == b""    # closing one half closes the other
    early.close()


def test_duplicate_relay_half_is_rejected(relay_server, gid):
    g = gid()
    t = tok(g)
    first = socket.create_connection((relay_server.host, relay_server.port), timeout=10)
    first.sendall(f"RELAY {g} {t} 0 1\n".encode())
    wait_for(lambda: (g, 0, 1) in relay_server.server.relays)
    with pytest.raises(RendezvousError) as err:
        client.relay(relay_server.address, g, t, 0, 1, timeout=10)
    assert err.value.code == "rank_taken"
    first.close()
    wait_for(lambda: (g, 0, 1) not in relay_server.server.relays)


# ---- limits --------------------------------------------------------------------------------

def test_limits_answer_busy():
    with rendezvous.serve_in_thread("127.0.0.1", 0, SECRET, limits=Limits(max_connections=3, max_groups=1)) as h:
        a = client.connect(h.address, "one", tok("one"), 2)
        with pytest.raises(RendezvousError) as err:
            client.connect(h.address, "two", tok("two"), 2)
        assert err.value.code == "busy" and "1 groups" in err.value.reason
        b = client.connect(h.address, "one", tok("one"), 2)
        extra = [socket.create_connection((h.host, h.port), timeout=10) for _ in range(2)]
        got = b""
        while not got.endswith(b"\n"):
            got += extra[1].recv(200)
        assert got.startswith(b"ERROR busy server has 3 connections")
        assert a.wait_peers(10) == b.wait_peers(10)
        for s in extra:
            s.close()
        # "one" is complete (it no longer counts as filling): a new group may start.
        wait_for(lambda: h.server.connections == 2)
        with client.join(h.address, "three", tok("three"), 1) as c:
            assert c.rank == 0
        a.close()
        b.close()
