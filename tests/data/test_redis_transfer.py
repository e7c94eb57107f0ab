"""The redis connector's transfer path (skyfn/data/connectors/redis.py) against a real
redis-server with a password: frames sent without joining, chunks cut along frames,
replies received in place, replacement and eviction leaving no keys behind, TTLs."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
import redis

from infra.local.processes import start_redis
from skyfn.data import codec
from skyfn.data.connectors.redis import RedisConnector


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_redis(tmp_path_factory.mktemp("redis-data"), appendonly=False, secure=True)
    yield srv
    srv.stop()


@pytest.fixture
def conn(server):
    password = (server.workdir / "redis.password").read_text().strip()
    c = RedisConnector(port=server.port, password=password, chunk_bytes=1 << 20)
    c.client.flushall()
    yield c
    c.close()


@pytest.mark.parametrize("size", [0, 5, (1 << 20) - 2, (1 << 20) - 1, (1 << 20) + 7, 3 * (1 << 20) + 12345])
def test_values_of_every_size_come_back_equal(conn, size):
    data = os.urandom(size)
    arr = np.random.default_rng(size).random(size // 8 + 1)
    for obj in (data, [arr, data, arr]):
        conn.put("k", codec.encode_frames(obj))
        back = codec.decode(conn.get("k"))
        if obj is data:
            assert back == data and type(back) is bytes
        else:
            assert np.array_equal(back[0], arr) and back[1] == data and np.array_equal(back[2], arr)
            assert back[0].flags.writeable  # decoded in place from the received buffer


def test_chunks_are_cut_along_frames_and_frames_are_not_copied(conn):
    big = np.arange((5 << 20) // 8, dtype=np.int64)
    frames = codec.encode_frames(big)
    chunks = conn._chunks([memoryview(f).cast("B") for f in frames])
    assert b"".join(chunks) == b"".join(frames)
    assert bytes(chunks[0]) == b"".join(frames[:2])  # the small frames, together
    assert all(isinstance(c, memoryview) and c.obj is memoryview(big).obj for c in chunks[1:])  # views of the array
    assert [len(c) for c in chunks[1:]] == [1 << 20] * 5


def test_replacing_and_evicting_leave_no_keys(conn):
    conn.put("k", codec.encode_frames(os.urandom(5 << 20)))
    assert conn.client.dbsize() == 1 + 1 + 5  # header, the small frames, five 1 MiB slices
    conn.put("k", codec.encode_frames(os.urandom(2 << 20)))  # fewer chunks: the stale ones go
    assert conn.client.dbsize() == 1 + 1 + 2
    conn.put("k", codec.encode_frames(b"small"))
    assert conn.client.dbsize() == 1 and codec.decode(conn.get("k")) == b"small"
    conn.put("k", codec.encode_frames(os.urandom(3 << 20)))
    conn.evict("k")
    conn.evict("k")
    assert conn.client.dbsize() == 0 and not conn.exists("k") and conn.get("k") is None


def test_a_missing_chunk_is_a_missing_object_and_the_connection_stays_usable(conn):
    conn.put("k", codec.encode_frames(os.urandom(3 << 20)))
    conn.client.delete("skyfn:d:k:1")
    assert conn.get("k") is None
    conn.put("j", codec.encode_frames(b"still fine"))
    assert codec.decode(conn.get("j")) == b"still fine"


def test_ttl_applies_to_every_key_of_an_object(conn):
    conn.put("small", codec.encode_frames(b"x"), ttl=0.3)
    conn.put("big", codec.encode_frames(os.urandom(3 << 20)), ttl=0.3)
    assert 0 < conn.client.pttl("skyfn:d:big:2") <= 300 and 0 < conn.client.pttl("skyfn:d:small") <= 300
    time.sleep(0.5)
    assert conn.get("small") is None and conn.get("big") is None and conn.client.dbsize() == 0


def test_a_wrong_password_is_an_authentication_error(server):
    bad = RedisConnector(port=server.port, password="wrong")
    with pytest.raises(redis.AuthenticationError):
        bad.get("k")
