"""The communicator's Python API on loopback: real rendezvous server, real rank processes
(2, 3, 5 and 8 ranks), real TCP channels. Point to point with tags, every collective with
uneven and empty buffers, reductions of every dtype and op against numpy, argument errors,
channel statistics, server-assigned ranks and relayed channels.

Functions named ``on_*`` run inside the rank processes (tests/comm/rank_group.py): they
get the rank's Communicator and return plain values the test asserts on.
"""
from __future__ import annotations

import functools
import itertools
import uuid

import numpy as np
import pytest

import rendezvous
from comm import Buffer, CommError, Communicator
from tests.comm.rank_group import RankGroup

SECRET = "collectives-secret"
SIZES = [2, 3, 5, 8]
DTYPES = [np.int32, np.int64, np.float32, np.float64]
OPS = ["sum", "min", "max", "prod"]


@pytest.fixture(scope="module")
def server():
    handle = rendezvous.serve_in_thread("127.0.0.1", 0, SECRET)
    yield handle
    handle.stop()


def new_group(server, size, **kw) -> RankGroup:
    group = f"coll-{size}-{uuid.uuid4().hex[:8]}"
    g = RankGroup(server.address, rendezvous.make_token(SECRET, group), group, size, **kw)
    assert not g.join_errors, g.join_errors
    return g


@pytest.fixture(scope="module", params=SIZES, ids=[f"{n}ranks" for n in SIZES])
def group(request, server):
    g = new_group(server, request.param)
    yield g
    g.close()


def payload(rank: int, nbytes: int, salt: int = 0) -> bytes:
    return np.random.default_rng([rank, nbytes, salt]).integers(0, 256, nbytes, dtype=np.uint8).tobytes()


def uneven(rank: int) -> int:
    return 0 if rank == 1 else rank * 1000 + 7  # rank 1 sends nothing


# ---------------------------------------------------------------- point to point

def on_p2p(c: Communicator):
    r, n = c.rank, c.size
    right, left = (r + 1) % n, (r - 1) % n
    # two tags sent in one order, received in the other: matching is by tag
    c.send(payload(r, 100, 1), right, tag=1)
    c.send(np.arange(r * 10, dtype=np.float64), right, tag=0)
    first = c.recv(left, tag=0)
    second = c.recv(left, tag=1)
    # non-blocking: post the receive first, test until both complete
    rq = c.irecv(left, tag=7)
    sq = c.isend(bytearray(payload(r, 5000, 2)), right, tag=7)
    while not (rq.test() and sq.test()):
        pass
    third = rq.wait()
    assert sq.wait() is None
    # empty message
    c.send(b"", right, tag=3)
    empty = c.recv(left, tag=3)
    # several messages on one tag arrive in order
    for i in range(5):
        c.send(bytes([i]) * (i + 1), right, tag=9)
    ordered = [bytes(c.recv(left, tag=9)) for _ in range(5)]
    # to itself, blocking and not
    c.send(b"me", r, tag=4)
    own = c.irecv(r, tag=4)
    c.isend(b"again", r, tag=4).wait()
    selfs = [bytes(own.wait()), bytes(own.wait()), own.done, bytes(c.recv(r, tag=4))]
    return {
        "selfs": selfs,
        "first": np.frombuffer(first, dtype=np.float64).tolist(),
        "second": bytes(second), "third": bytes(third), "third_type": type(third).__name__,
        "empty": (len(empty), bytes(empty)), "ordered": ordered,
    }


def test_point_to_point(group):
    n = group.size
    for r, got in enumerate(group.run(on_p2p)):
        left = (r - 1) % n
        assert got["first"] == list(np.arange(left * 10, dtype=np.float64))
        assert got["second"] == payload(left, 100, 1)
        assert got["third"] == payload(left, 5000, 2)
        assert got["third_type"] == "Buffer"
        assert got["empty"] == (0, b"")
        assert got["ordered"] == [bytes([i]) * (i + 1) for i in range(5)]
        assert got["selfs"] == [b"me", b"me", True, b"again"]


def on_buffer_protocol(c: Communicator):
    """A received Buffer is shared, not copied, by memoryview and numpy, and writable."""
    r, n = c.rank, c.size
    c.send(np.arange(8, dtype=np.int32), (r + 1) % n, tag=5)
    b = c.recv((r - 1) % n, tag=5)
    arr = np.frombuffer(b, dtype=np.int32)
    mv = memoryview(b)
    arr[0] = 42  # visible through the other views: one memory
    return {"len": len(b), "nbytes": b.nbytes, "mv0": mv.cast("i")[0], "bytes": b.tobytes()[:4],
            "eq": b == np.array([42, 1, 2, 3, 4, 5, 6, 7], np.int32).tobytes(),
            "readonly": mv.readonly, "shares": np.shares_memory(arr, np.asarray(mv))}


def test_received_buffer_is_zero_copy(group):
    for got in group.run(on_buffer_protocol):
        assert got["len"] == got["nbytes"] == 32
        assert got["mv0"] == 42
        assert got["bytes"] == np.int32(42).tobytes()
        assert got["eq"] is True
        assert got["readonly"] is False
        assert got["shares"]


# ---------------------------------------------------------------- collectives

def on_barrier(c: Communicator):
    for _ in range(5):
        c.barrier()
    return c.rank


def test_barrier(group):
    assert group.run(on_barrier) == list(range(group.size))


BCAST_SIZES = [0, 1, 4096, (1 << 20), (1 << 20) * 2 + 3]  # multi-chunk past 1 MiB


def on_bcast(c: Communicator):
    out = []
    for root in sorted({0, c.size - 1, c.size // 2}):
        for nbytes in BCAST_SIZES:
            buf = payload(root, nbytes, 3) if c.rank == root else None
            got = c.bcast(buf, root)
            out.append((root, nbytes, bytes(got) == payload(root, nbytes, 3)))
    return out


def test_bcast_every_root_and_size(group):
    for per_rank in group.run(on_bcast):
        assert all(ok for _, _, ok in per_rank), [x for x in per_rank if not x[2]]


def on_gather(c: Communicator, root: int):
    v = c.gatherv(payload(c.rank, uneven(c.rank)), root)
    e = c.gather(np.full(4, c.rank, np.int16), root)
    return (None if v is None else [bytes(b) for b in v],
            None if e is None else [np.frombuffer(b, np.int16).tolist() for b in e])


def test_gatherv_and_gather(group):
    n = group.size
    root = n - 1
    for r, (v, e) in enumerate(group.run(on_gather, root)):
        if r != root:
            assert v is None and e is None
            continue
        assert v == [payload(i, uneven(i)) for i in range(n)]
        assert e == [[i] * 4 for i in range(n)]


def on_scatter(c: Communicator, root: int):
    parts = [payload(i, uneven(i), 4) for i in range(c.size)] if c.rank == root else None
    v = c.scatterv(parts, root)
    eq = [np.full(3, i, np.float32) for i in range(c.size)] if c.rank == root else None
    e = c.scatter(eq, root)
    return bytes(v), np.frombuffer(e, np.float32).tolist()


def test_scatterv_and_scatter(group):
    for r, (v, e) in enumerate(group.run(on_scatter, 0)):
        assert v == payload(r, uneven(r), 4)
        assert e == [float(r)] * 3


def on_allgather(c: Communicator):
    v = c.allgatherv(payload(c.rank, uneven(c.rank), 5))
    e = c.allgather(np.int64(c.rank * 3).tobytes())
    return [bytes(b) for b in v], [int(np.frombuffer(b, np.int64)[0]) for b in e]


def test_allgatherv_and_allgather(group):
    n = group.size
    for v, e in group.run(on_allgather):
        assert v == [payload(i, uneven(i), 5) for i in range(n)]
        assert e == [i * 3 for i in range(n)]


def a2a_part(src: int, dst: int) -> bytes:
    return payload(src * 100 + dst, (src + dst) % 3 * 777, 6)  # a third of the parts empty


def on_alltoall(c: Communicator):
    v = c.alltoallv([a2a_part(c.rank, d) for d in range(c.size)])
    e = c.alltoall([np.array([c.rank, d], np.int32) for d in range(c.size)])
    empty = c.alltoallv([b""] * c.size)
    return ([bytes(b) for b in v], [np.frombuffer(b, np.int32).tolist() for b in e],
            [len(b) for b in empty])


def test_alltoallv_and_alltoall(group):
    n = group.size
    for r, (v, e, empty) in enumerate(group.run(on_alltoall)):
        assert v == [a2a_part(s, r) for s in range(n)]
        assert e == [[s, r] for s in range(n)]
        assert empty == [0] * n


# ---------------------------------------------------------------- reductions

def contribution(rank: int, dtype, count: int, op: str) -> np.ndarray:
    rng = np.random.default_rng([rank, count, DTYPES.index(dtype)])
    if op == "prod":  # keep products representable
        vals = rng.choice([-2, -1, 1, 2], size=count)
    else:
        vals = rng.integers(-1000, 1000, size=count)
    arr = vals.astype(dtype)
    if np.dtype(dtype).kind == "f" and op != "prod":
        arr = arr / dtype(7)  # fractions: sums depend on order, compared with tolerance
    return arr.astype(dtype).reshape(-1, 5) if count % 5 == 0 else arr.astype(dtype)


REDUCE_COUNTS = [1, 35, 40_000]  # 40,000 elements is past the ring threshold for every dtype
NP_OPS = {"sum": np.add, "min": np.minimum, "max": np.maximum, "prod": np.multiply}


def expected_reduction(n: int, dtype, count: int, op: str) -> np.ndarray:
    return functools.reduce(NP_OPS[op], [contribution(r, dtype, count, op) for r in range(n)])


def on_reductions(c: Communicator):
    out = {}
    for dtype, op, count in itertools.product(DTYPES, OPS, REDUCE_COUNTS):
        mine = contribution(c.rank, dtype, count, op)
        everywhere = c.allreduce(mine, op=op)
        at_root = c.reduce(mine, op=op, root=c.size - 1)
        out[(np.dtype(dtype).name, op, count)] = (everywhere, at_root)
    return out


def test_reduce_and_allreduce_every_dtype_and_op(group):
    n = group.size
    results = group.run(on_reductions)
    for dtype, op, count in itertools.product(DTYPES, OPS, REDUCE_COUNTS):
        want = expected_reduction(n, dtype, count, op)
        key = (np.dtype(dtype).name, op, count)
        for r, per_rank in enumerate(results):
            everywhere, at_root = per_rank[key]
            assert everywhere.dtype == want.dtype and everywhere.shape == want.shape, key
            if np.dtype(dtype).kind == "f":
                tol = dict(rtol=1e-5, atol=1e-3) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-9)
                np.testing.assert_allclose(everywhere, want, err_msg=str(key), **tol)
            else:
                np.testing.assert_array_equal(everywhere, want, err_msg=str(key))
            # every rank holds the same bytes (not just close values)
            assert everywhere.tobytes() == results[0][key][0].tobytes(), key
            if r == n - 1:
                assert at_root.dtype == want.dtype and at_root.shape == want.shape
                np.testing.assert_allclose(at_root, want, rtol=1e-5, atol=1e-3, err_msg=str(key))
            else:
                assert at_root is None


def on_reduce_special(c: Communicator):
    nan_where = np.array([np.nan if c.rank == 0 else 1.0, 2.0 + c.rank])
    big = np.array([np.iinfo(np.int32).max], np.int32)
    return (c.allreduce(nan_where, op="max").tolist(), c.allreduce(nan_where, op="min").tolist(),
            c.allreduce(big, op="sum").tolist(), c.allreduce(np.zeros(0, np.float64)).shape,
            c.allreduce(np.float32(1.5)).tolist())


def test_reduction_nan_overflow_empty_scalar(group):
    n = group.size
    wrapped = int(np.sum(np.full(n, np.iinfo(np.int32).max, np.int32), dtype=np.int32))
    for mx, mn, s, empty_shape, scalar in group.run(on_reduce_special):
        assert np.isnan(mx[0]) and np.isnan(mn[0])  # NaN propagates like numpy
        assert mx[1] == 2.0 + n - 1 and mn[1] == 2.0
        assert s == [wrapped]  # integer sums wrap around like numpy
        assert empty_shape == (0,)
        assert scalar == 1.5 * n  # a 0-d result for a scalar


# ---------------------------------------------------------------- argument errors

def _err(fn):
    try:
        fn()
    except Exception as e:  # the test asserts on type and message
        return type(e).__name__, str(e)
    return None


def on_bad_arguments(c: Communicator):
    n = c.size
    return {
        "dest": _err(lambda: c.send(b"x", n)),
        "source": _err(lambda: c.recv(-1)),
        "root": _err(lambda: c.bcast(b"x", root=n + 3)),
        "tag": _err(lambda: c.send(b"x", 0, tag=-2)),
        "tag_type": _err(lambda: c.irecv(0, tag="a")),
        "str": _err(lambda: c.send("text", 0)),
        "object": _err(lambda: c.send(object(), 0)),
        "noncontig": _err(lambda: c.isend(np.arange(10)[::2], 0)),
        "dtype": _err(lambda: c.allreduce(np.arange(3, dtype=np.int16))),
        "op": _err(lambda: c.allreduce(np.arange(3), op="avg")),
        "parts": _err(lambda: c.alltoallv([b"x"] * (n + 1))),
        "parts_type": _err(lambda: c.alltoallv(b"abc")),
        "uneven": _err(lambda: c.alltoall([b"x"] * (n - 1) + [b"yy"])),
        "bcast_none": _err(lambda: c.bcast(None, root=c.rank)),
        "scatter_uneven": _err(lambda: c.scatter([b"x"] * (n - 1) + [b"yy"], root=c.rank)),
        "buffer_ctor": _err(lambda: Buffer()),
    }


def test_bad_arguments_are_clear_errors(group):
    n = group.size
    got = group.run(on_bad_arguments)[0]
    assert got["dest"] == ("ValueError", f"dest {n} is out of range: ranks are 0..{n - 1}")
    assert got["source"][0] == "ValueError" and "source -1 is out of range" in got["source"][1]
    assert got["root"][0] == "ValueError" and f"root {n + 3}" in got["root"][1]
    assert got["tag"][0] == "ValueError" and "negative tags are reserved" in got["tag"][1]
    assert got["tag_type"][0] == "TypeError"
    assert got["str"][0] == "TypeError" and "encode it first" in got["str"][1]
    assert got["object"][0] == "TypeError" and "buffer protocol" in got["object"][1]
    assert got["noncontig"][0] == "ValueError" and "ascontiguousarray" in got["noncontig"][1]
    assert got["dtype"][0] == "TypeError" and "int16" in got["dtype"][1]
    assert got["op"][0] == "ValueError" and "'avg'" in got["op"][1]
    assert got["parts"][0] == "ValueError" and f"one buffer per rank ({n})" in got["parts"][1]
    assert got["parts_type"][0] == "TypeError"
    assert got["uneven"][0] == "ValueError" and "use alltoallv" in got["uneven"][1]
    assert got["bcast_none"][0] == "TypeError"
    assert got["scatter_uneven"][0] == "ValueError" and "use scatterv" in got["scatter_uneven"][1]
    assert got["buffer_ctor"][0] == "TypeError"


def on_gather_unequal(c: Communicator):
    res = _err(lambda: c.gather(b"x" * (c.rank + 1), root=0))
    c.barrier()  # the group is still in step after the error
    return res


def test_gather_of_unequal_sizes_fails_on_root_only(group):
    got = group.run(on_gather_unequal)
    assert got[0][0] == "ValueError" and "use gatherv" in got[0][1]
    assert all(g is None for g in got[1:])


def on_allreduce_mismatch(c: Communicator):
    return _err(lambda: c.allreduce(np.zeros(4 + 4 * (c.rank % 2), np.int64)))


def test_mismatched_reduction_counts_raise(server):
    with new_group(server, 2, timeout=5.0) as g:
        got = g.run(on_allreduce_mismatch)
    for name, msg in got:
        assert name == "CommError"
        assert "same element count" in msg


# ---------------------------------------------------------------- stats, ranks, relay

def on_stats(c: Communicator):
    c.allgatherv(b"z" * 1000)
    return c.stats()


def test_stats_report_direct_channels_and_bytes(group):
    n = group.size
    for r, st in enumerate(group.run(on_stats)):
        assert sorted(st) == list(range(n))
        assert st[r]["mode"] == "self"
        for peer in range(n):
            if peer == r:
                continue
            assert st[peer]["mode"] == "direct"
            assert st[peer]["address"].startswith("127.0.0.1:")
            assert st[peer]["bytes_sent"] >= 1000 and st[peer]["bytes_received"] >= 1000


def on_relay_workload(c: Communicator):
    total = c.allreduce(np.arange(100_000, dtype=np.float64) * (c.rank + 1))
    parts = c.alltoallv([payload(c.rank, 3000 + d, 8) for d in range(c.size)])
    return ({k: v["mode"] for k, v in c.stats().items()}, float(total[-1]),
            [bytes(p) == payload(s, 3000 + c.rank, 8) for s, p in enumerate(parts)])


def test_relayed_channels_carry_collectives(server):
    with new_group(server, 3, allow_direct=False) as g:
        got = g.run(on_relay_workload)
    for r, (modes, last, parts_ok) in enumerate(got):
        assert modes == {p: ("self" if p == r else "relay") for p in range(3)}
        assert last == 99_999.0 * 6
        assert all(parts_ok)


def on_rank(c: Communicator):
    return c.rank, c.size


def test_server_assigns_distinct_ranks(server):
    with new_group(server, 4, ranks=[None] * 4) as g:
        got = g.run(on_rank)
    assert sorted(got) == [(r, 4) for r in range(4)]


def on_context_manager(c: Communicator):
    c.barrier()
    c.close()
    c.close()  # idempotent
    err = _err(lambda: c.send(b"x", 0))
    return c.closed, err


def test_closed_communicator_raises(server):
    with new_group(server, 2) as g:
        got = g.run(on_context_manager)
    for closed, err in got:
        assert closed is True
        assert err[0] == "CommError" and "closed" in err[1]


def test_join_argument_errors():
    with pytest.raises(ValueError, match="host:port"):
        Communicator.join("g", rendezvous="nohost", token="t", size=2)
    with pytest.raises(ValueError, match="group must match"):
        Communicator.join("bad group!", rendezvous="127.0.0.1:1", token="t", size=2)
    with pytest.raises(ValueError, match="size must be"):
        Communicator.join("g", rendezvous="127.0.0.1:1", token="t", size=0)
    with pytest.raises(ValueError, match="rank must be None"):
        Communicator.join("g", rendezvous="127.0.0.1:1", token="t", size=2, rank=2)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        Communicator.join("g", rendezvous="127.0.0.1:1", token="t", size=2, timeout=0)
    with pytest.raises(TypeError, match="make_token"):
        Communicator.join("g", rendezvous="127.0.0.1:1", token=None, size=2)
    assert issubclass(CommError, Exception)
