"""One large (256 MiB) message through the communicator on loopback: point to point and a
broadcast to three ranks (which streams it down the tree in chunks). The receivers
check every byte against a regenerated copy."""
from __future__ import annotations

import uuid

import numpy as np
import pytest

import rendezvous
from comm import Communicator
from tests.comm.rank_group import RankGroup

SECRET = "large-secret"
NBYTES = 256 << 20


def big_message(salt: int) -> np.ndarray:
    """256 MiB whose every 8-byte word differs (cheap to make again on the receiver)."""
    return np.arange(NBYTES // 8, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(salt)


def on_large(c: Communicator):
    out = {}
    if c.rank == 0:
        c.send(big_message(1), 1)
    elif c.rank == 1:
        got = c.recv(0)
        out["p2p"] = (len(got), bool(np.array_equal(np.frombuffer(got, np.uint64), big_message(1))))
        del got
    got = c.bcast(big_message(2) if c.rank == 0 else None, root=0)
    out["bcast"] = (len(got), bool(np.array_equal(np.frombuffer(got, np.uint64), big_message(2))))
    return out


@pytest.fixture
def server():
    handle = rendezvous.serve_in_thread("127.0.0.1", 0, SECRET)
    yield handle
    handle.stop()


def test_256_mib_point_to_point_and_bcast(server):
    group = f"large-{uuid.uuid4().hex[:8]}"
    with RankGroup(server.address, rendezvous.make_token(SECRET, group), group, 3, timeout=120.0) as g:
        assert not g.join_errors
        got = g.run(on_large, timeout=300)
    assert got[1]["p2p"] == (NBYTES, True)
    for r in range(3):
        assert got[r]["bcast"] == (NBYTES, True)
