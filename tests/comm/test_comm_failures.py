"""Failures of the communicator surface as exceptions, never as hangs or exits: a wrong
token is an AuthError, a group that never fills is a TimeoutError, and a peer killed with
SIGKILL makes the others raise PeerLostError/TimeoutError within their timeout. Real
rendezvous server, real processes, real sockets."""
from __future__ import annotations

import time
import uuid

import numpy as np
import pytest

import rendezvous
from comm import AuthError, CommError, Communicator, PeerLostError, TimeoutError as CommTimeout
from tests.comm.rank_group import RankGroup

SECRET = "failures-secret"


@pytest.fixture(scope="module")
def server():
    handle = rendezvous.serve_in_thread("127.0.0.1", 0, SECRET)
    yield handle
    handle.stop()


def gid() -> str:
    return f"fail-{uuid.uuid4().hex[:10]}"


def test_exception_hierarchy():
    assert issubclass(AuthError, CommError)
    assert issubclass(PeerLostError, CommError) and issubclass(PeerLostError, ConnectionError)
    assert issubclass(CommTimeout, CommError) and issubclass(CommTimeout, TimeoutError)


@pytest.mark.parametrize("token_for", ["wrong secret", "other group"])
def test_bad_token_is_rejected_with_auth_error(server, token_for):
    group = gid()
    token = (rendezvous.make_token("not-the-secret", group) if token_for == "wrong secret"
             else rendezvous.make_token(SECRET, "some-other-group"))
    with pytest.raises(AuthError) as info:
        Communicator.join(group, rendezvous=server.address, token=token, size=2, timeout=10)
    assert "token" in str(info.value)


def test_expired_token_is_rejected(server):
    group = gid()
    token = rendezvous.make_token(SECRET, group, ttl_s=60, now=time.time() - 3600)
    with pytest.raises(AuthError):
        Communicator.join(group, rendezvous=server.address, token=token, size=2, timeout=10)


def test_group_that_never_fills_times_out(server):
    group = gid()
    with pytest.raises(CommTimeout):
        Communicator.join(group, rendezvous=server.address, token=rendezvous.make_token(SECRET, group),
                          size=2, timeout=2.0)


def test_unreachable_rendezvous_is_a_comm_error():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(CommError):
        Communicator.join("g", rendezvous=f"127.0.0.1:{port}", token="1.ab", size=2, timeout=3.0)


def on_recv_from(c: Communicator, source: int):
    c.barrier()
    return bytes(c.recv(source))


def on_barrier_then_sleep(c: Communicator):
    c.barrier()
    time.sleep(120)  # killed by the test meanwhile


def on_send_until_error(c: Communicator, dest: int):
    try:
        for _ in range(1000):  # the first sends may still be accepted by the kernel
            c.send(b"x" * 65536, dest)
    except CommError as e:
        return type(e).__name__, str(e)
    return "no error", ""


def on_allreduce(c: Communicator):
    return c.allreduce(np.ones(10)).tolist()


def test_killed_peer_raises_instead_of_hanging(server):
    group = gid()
    with RankGroup(server.address, rendezvous.make_token(SECRET, group), group, 3, timeout=5.0) as g:
        assert not g.join_errors
        g.submit(on_barrier_then_sleep, ranks=[2])
        blocked = g.submit(on_recv_from, 2, ranks=[0, 1])
        time.sleep(0.5)  # ranks 0 and 1 are now blocked in recv(2)
        g.kill(2)  # SIGKILL: no bye on any channel
        for exc_type, exc_type_name, detail in g.collect(blocked, timeout=30, raw=True):
            assert exc_type == "error" and exc_type_name == "PeerLostError", detail
        # sending to the dead rank fails too; a collective that needs it fails on every
        # rank still alive (PeerLostError where it talks to rank 2, TimeoutError where it
        # waits for a rank that gave up), each within the 5 s timeout
        [(sent_exc, sent_msg)] = g.collect(g.submit(on_send_until_error, 2, ranks=[0]), timeout=30)
        assert sent_exc == "PeerLostError", sent_msg
        for exc_type, exc_type_name, _ in g.collect(g.submit(on_allreduce, ranks=[0, 1]),
                                                    timeout=30, raw=True):
            assert exc_type == "error"
            assert exc_type_name in ("PeerLostError", "TimeoutError")
