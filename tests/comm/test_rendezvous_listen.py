"""LISTEN / CALL: how a consumer reaches an object server behind a NAT (docs/comm.md).

A real server on its own loop in a thread (rendezvous.serve_in_thread); listeners and
callers are real TCP clients (rendezvous.client, raw sockets for malformed input). A call
yields a fresh 2-rank group that both sides really JOIN; the last test punches it with
the C++ communicator and moves bytes over it.
"""
from __future__ import annotations

import socket
import threading
import time

import pytest

import rendezvous
from rendezvous import Limits, client, make_token
from rendezvous import protocol as P
from rendezvous.client import RendezvousError

SECRET = "listen-test-secret"


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def server(request):
    handle = rendezvous.serve_in_thread("127.0.0.1", 0, SECRET, loop=request.param)
    yield handle
    handle.stop()


@pytest.fixture
def name(unique):
    counter = iter(range(1000))
    return lambda: f"objects.{unique}.{next(counter)}"


def tok(group, secret=SECRET, **kw):
    return make_token(secret, group, **kw)


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def raw_lines(address, payload: bytes, timeout=10.0) -> list[bytes]:
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(payload)
        got = b""
        while True:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not data:
                break
            got += data
    return got.splitlines()


def test_parse_listen_call_ping_lines():
    assert P.parse_peer_line(b"LISTEN objects.ep-1 tok") == P.Listen("objects.ep-1", "tok")
    assert P.parse_peer_line(b"CALL objects.ep-1 tok\r") == P.Call("objects.ep-1", "tok")
    assert P.parse_peer_line(b"CALL direct.ep-1 tok s-1.u-ab") == P.Call("direct.ep-1", "tok", "s-1.u-ab")
    assert P.parse_peer_line(b"PING") == P.Ping()
    for line, fragment in [(b"LISTEN a", "expected 'LISTEN <name> <token>'"),
                           (b"CALL a b c d", "expected 'CALL <name> <token> [<caller>]'"),
                           (b"CALL a b c/d", "group id is invalid"),
                           (b"LISTEN a/b tok", "listener name is invalid"),
                           (b"CALL " + b"n" * 111 + b" tok", "use 1-110 characters"),
                           (b"PING now", "expected 'PING'")]:
        with pytest.raises(P.ProtocolError) as err:
            P.parse_peer_line(line)
        assert err.value.code == "malformed" and fragment in err.value.reason, (line, err.value.reason)


def test_a_call_token_admits_its_caller_only_and_the_listener_is_told_who_called(server, name):
    from rendezvous.tokens import make_call_token

    n = name()
    listener = client.listen(server.address, n, tok(n))
    group, token = client.call(server.address, n, make_call_token(SECRET, n, "s-1.u-ab"), caller="s-1.u-ab")
    assert listener.next_incoming(timeout=10) == client.Incoming(group, token, "s-1.u-ab")
    for bad_token, caller in [(make_call_token(SECRET, n, "s-2.u-ab"), "s-1.u-ab"),    # another caller's
                              (make_call_token(SECRET, n + "x", "s-1.u-ab"), "s-1.u-ab"),  # another listener's
                              (tok(n), "s-1.u-ab")]:                                  # a name token
        with pytest.raises(RendezvousError) as err:
            client.call(server.address, n, bad_token, caller=caller)
        assert err.value.code == "bad_token"
    with pytest.raises(RendezvousError) as err:  # and a call token is no name token
        client.call(server.address, n, make_call_token(SECRET, n, "s-1.u-ab"))
    assert err.value.code == "bad_token"
    listener.close()


def test_call_gives_both_sides_the_same_fresh_group_and_both_join_it(server, name):
    n = name()
    listener = client.listen(server.address, n, tok(n))
    assert server.server.listeners[n] is not None
    groups = []
    for _ in range(3):
        group, token = client.call(server.address, n, tok(n))
        incoming = listener.next_call(timeout=10)
        assert incoming == (group, token)
        assert group.startswith(n + "@") and group not in groups   # a new group per call
        groups.append(group)
        rendezvous.verify_token(SECRET, group, token)                # minted by the server for it
        # both join it with the ordinary JOIN path: listener rank 0, caller rank 1
        sessions = {}
        ts = [threading.Thread(target=lambda r=r: sessions.__setitem__(
            r, client.join(server.address, group, token, 2, r, timeout=10))) for r in (0, 1)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert sessions[0].wait_peers() == sessions[1].wait_peers()
        for s in sessions.values():
            s.close()
    assert server.server.stats["calls"] >= 3
    listener.close()
    wait_for(lambda: n not in server.server.listeners)


def test_calls_are_counted_per_listener_and_concurrent_calls_all_arrive(server, name):
    n = name()
    listener = client.listen(server.address, n, tok(n))
    got = []
    ts = [threading.Thread(target=lambda: got.append(client.call(server.address, n, tok(n)))) for _ in range(20)]
    for t in ts:
        t.start()
    incoming = [listener.next_call(timeout=10) for _ in range(20)]
    for t in ts:
        t.join()
    assert sorted(incoming) == sorted(got) and len(set(incoming)) == 20
    listener.close()


def test_call_without_listener_is_refused_with_the_name(server, name):
    n = name()
    with pytest.raises(RendezvousError) as err:
        client.call(server.address, n, tok(n))
    assert err.value.code == "no_listener"
    assert f"no object server listens as {n}" in err.value.reason
    # a listener that left frees its name: calling it is refused again
    listener = client.listen(server.address, n, tok(n))
    listener.close()
    wait_for(lambda: n not in server.server.listeners)
    with pytest.raises(RendezvousError) as err:
        client.call(server.address, n, tok(n))
    assert err.value.code == "no_listener"


def test_a_name_has_one_listener_until_it_leaves(server, name):
    n = name()
    first = client.listen(server.address, n, tok(n))
    with pytest.raises(RendezvousError) as err:
        client.listen(server.address, n, tok(n))
    assert err.value.code == "name_taken" and f"already listens as {n}" in err.value.reason
    first.sock.close()                                  # gone without BYE: the name is freed too
    wait_for(lambda: n not in server.server.listeners)
    second = client.listen(server.address, n, tok(n))
    group, token = client.call(server.address, n, tok(n))
    assert second.next_call(timeout=10) == (group, token)
    second.close()


def test_tokens_are_checked_for_listen_and_call_and_never_echoed(server, name):
    n, other = name(), name()
    for verb in ("LISTEN", "CALL"):
        for bad, code in [(tok(n, secret="wrong"), "bad_token"), (tok(other), "bad_token"),
                          (tok(n, ttl_s=-5), "expired_token")]:
            lines = raw_lines((server.host, server.port), f"{verb} {n} {bad}\n".encode())
            assert len(lines) == 1 and lines[0].startswith(f"ERROR {code} ".encode()), (verb, lines)
            assert bad.split(".")[1][:12].encode() not in lines[0]
    assert n not in server.server.listeners


def test_ping_pong_and_only_ping_or_bye_after_listen(server, name):
    n = name()
    t = tok(n)
    lines = raw_lines((server.host, server.port), f"LISTEN {n} {t}\nPING\nPING\nBARRIER 0\n".encode())
    assert lines == [f"LISTENING {n}".encode(), b"PONG", b"PONG",
                     b"ERROR malformed BARRIER after LISTEN: a listener sends only PING or BYE"]
    wait_for(lambda: n not in server.server.listeners)


def test_listener_pings_keep_it_and_a_silent_one_is_dropped(name):
    handle = rendezvous.serve_in_thread("127.0.0.1", 0, SECRET, limits=Limits(listen_idle_timeout_s=0.6))
    try:
        n, quiet = name(), name()
        chatty = client.listen(handle.address, n, tok(n), ping_interval=0.2)
        silent = client.listen(handle.address, quiet, tok(quiet), ping_interval=60)
        assert chatty.next_call(timeout=1.5) is None        # 1.5 s > idle timeout: PINGs kept it
        assert n in handle.server.listeners
        wait_for(lambda: quiet not in handle.server.listeners, timeout=5)
        with pytest.raises(RendezvousError) as err:
            client.call(handle.address, quiet, tok(quiet))
        assert err.value.code == "no_listener"
        group, token = client.call(handle.address, n, tok(n))
        assert chatty.next_call(timeout=5) == (group, token)
        chatty.close()
        silent.close()
    finally:
        handle.stop()


def test_listener_sees_a_stopped_server():
    handle = rendezvous.serve_in_thread("127.0.0.1", 0, SECRET)
    listener = client.listen(handle.address, "objects.stop", tok("objects.stop"), ping_interval=0.2)
    handle.stop()
    with pytest.raises(RendezvousError) as err:
        listener.next_call(timeout=10)
    assert err.value.code == "closed"
    listener.close()


def test_called_group_punches_with_the_communicator(server, name):
    """The whole path on loopback: LISTEN, CALL, both sides join the C++ communicator on the
    server-minted group and move bytes both ways."""
    np = pytest.importorskip("numpy")
    from comm import Communicator

    n = name()
    listener = client.listen(server.address, n, tok(n))
    out = {}

    def serve():
        group, token = listener.next_call(timeout=10)
        with Communicator.join(group, server.address, token, 2, rank=0, timeout=20) as c:
            request = bytes(c.recv(1, tag=1))
            c.send(request[::-1], 1, tag=2)
            out["stats"] = c.stats()

    t = threading.Thread(target=serve)
    t.start()
    group, token = client.call(server.address, n, tok(n))
    with Communicator.join(group, server.address, token, 2, rank=1, timeout=20) as c:
        payload = np.arange(1 << 18, dtype=np.int64).tobytes()
        c.send(payload, 0, tag=1)
        assert bytes(c.recv(0, tag=2)) == payload[::-1]
    t.join(20)
    assert out["stats"][1]["mode"] in ("direct", "relay")
    listener.close()
