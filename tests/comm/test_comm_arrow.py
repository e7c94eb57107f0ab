"""pyarrow Tables over the communicator (comm.arrow) and the distributed hash join
(comm.join) on 2, 3 and 4 real rank processes: every join result is compared with
pyarrow's single-process join of the same whole inputs."""
from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pytest

import rendezvous
from comm import Communicator
from comm.arrow import (allgather_tables, alltoallv_tables, bcast_table, buffer_to_table,
                        gather_tables, recv_table, send_table, table_to_buffer)
from comm.join import distributed_join, hash_partition, key_hash
from tests.comm.rank_group import RankGroup

SECRET = "arrow-secret"


@pytest.fixture(scope="module")
def server():
    handle = rendezvous.serve_in_thread("127.0.0.1", 0, SECRET)
    yield handle
    handle.stop()


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"{n}ranks")
def group(request, server):
    name = f"arrow-{uuid.uuid4().hex[:8]}"
    g = RankGroup(server.address, rendezvous.make_token(SECRET, name), name, request.param)
    assert not g.join_errors
    yield g
    g.close()


def small_table(rank: int, rows: int) -> pa.Table:
    return pa.table({
        "i": pa.array(np.arange(rows, dtype=np.int64) + rank * 1000),
        "s": pa.array([f"r{rank}-{j}" if j % 4 else None for j in range(rows)]),
        "f": pa.array(np.linspace(0, 1, rows, dtype=np.float32)),
    })


def on_tables(c: Communicator):
    r, n = c.rank, c.size
    send_table(c, small_table(r, 5 + r), (r + 1) % n, tag=2)
    got = recv_table(c, (r - 1) % n, tag=2)
    b = bcast_table(c, small_table(99, 3) if r == 0 else None, root=0)
    gathered = gather_tables(c, small_table(r, r), root=0)  # rank 0's part is empty
    everyone = allgather_tables(c, small_table(r, 2))
    routed = alltoallv_tables(c, [small_table(r * 10 + d, d) for d in range(n)])
    return got, b, gathered, everyone, routed


def test_table_transfer_and_collectives(group):
    n = group.size
    for r, (got, b, gathered, everyone, routed) in enumerate(group.run(on_tables)):
        left = (r - 1) % n
        assert got.equals(small_table(left, 5 + left))
        assert b.equals(small_table(99, 3))
        if r == 0:
            assert [t.num_rows for t in gathered] == list(range(n))
            assert all(t.equals(small_table(i, i)) for i, t in enumerate(gathered))
        else:
            assert gathered is None
        assert all(t.equals(small_table(i, 2)) for i, t in enumerate(everyone))
        assert all(t.equals(small_table(s * 10 + r, r)) for s, t in enumerate(routed))


def test_ipc_helpers_round_trip_and_reject_junk():
    t = small_table(1, 10)
    assert buffer_to_table(memoryview(table_to_buffer(t))).equals(t)
    assert buffer_to_table(table_to_buffer(t.to_batches()[0])).equals(t)
    with pytest.raises(ValueError, match="not an Arrow IPC stream"):
        buffer_to_table(b"definitely not arrow")
    with pytest.raises(TypeError, match="pyarrow.Table"):
        table_to_buffer({"a": [1]})


# ---------------------------------------------------------------- distributed join

def join_inputs(rank: int, n: int, kind: str) -> tuple[pa.Table, pa.Table]:
    """This rank's part of the left and right inputs: overlapping, duplicated and null keys;
    the last rank's right part is empty."""
    rng = np.random.default_rng([rank, n, len(kind)])
    ln, rn = 300 + 37 * rank, (0 if rank == n - 1 else 200 + 11 * rank)
    lk, rk = rng.integers(0, 150, ln), rng.integers(50, 250, rn)
    if kind == "int":
        lkey, rkey = pa.array(lk, pa.int64()), pa.array(rk, pa.int32())  # widths differ
    else:
        lkey = pa.array([f"key-{k}" for k in lk])
        rkey = pa.array([f"key-{k}" for k in rk], pa.large_string())
    lmask = rng.random(ln) < 0.05
    lkey = pa.array(lkey.to_pylist(), lkey.type, mask=lmask)  # some null keys
    left = pa.table({"k": lkey, "k2": pa.array(lk % 3), "lv": pa.array(rng.random(ln)),
                     "lrank": pa.array(np.full(ln, rank, np.int32))})
    right = pa.table({"k": rkey.cast(lkey.type), "k2": pa.array(rk % 3), "rv": pa.array(rng.random(rn))})
    return left, right


JOINS = [("int", "inner", ["k"]), ("int", "left", ["k"]), ("int", "outer", ["k"]),
         ("str", "inner", ["k"]), ("str", "right", ["k", "k2"]), ("str", "left semi", ["k"]),
         ("int", "inner", ["k", "k2"])]


def on_join(c: Communicator, kind: str, how: str, keys: list[str]):
    left, right = join_inputs(c.rank, c.size, kind)
    return distributed_join(c, left, right, on=keys, how=how, right_suffix="_r")


def canonical(t: pa.Table) -> pa.Table:
    t = t.combine_chunks()
    return t.sort_by([(name, "ascending") for name in t.column_names])


@pytest.mark.parametrize("kind,how,keys", JOINS, ids=[f"{k}-{h}-{'+'.join(c)}" for k, h, c in JOINS])
def test_distributed_join_matches_pyarrow(group, kind, how, keys):
    n = group.size
    parts = group.run(on_join, kind, how, keys)
    got = pa.concat_tables([p.cast(parts[0].schema) for p in parts])
    lefts, rights = zip(*(join_inputs(r, n, kind) for r in range(n)))
    left, right = pa.concat_tables(lefts), pa.concat_tables(rights)
    pyarrow_how = {"left": "left outer", "right": "right outer", "outer": "full outer"}.get(how, how)
    want = left.join(right, keys=keys, join_type=pyarrow_how, right_suffix="_r")
    assert got.num_rows == want.num_rows > 0
    assert canonical(got).equals(canonical(want.cast(got.schema)))
    if how == "inner" and keys == ["k"]:
        # rows were really spread: more than one rank produced output
        assert sum(p.num_rows > 0 for p in parts) > 1


def test_join_argument_errors():
    class OneRank:  # distributed_join checks its arguments before touching the communicator
        size, rank = 1, 0
    left, right = join_inputs(0, 2, "int")
    with pytest.raises(ValueError, match="no key column 'nope'"):
        distributed_join(OneRank(), left, right, on="nope")
    with pytest.raises(ValueError, match="how must be one of"):
        distributed_join(OneRank(), left, right, on="k", how="sideways")
    with pytest.raises(ValueError, match="pass on="):
        distributed_join(OneRank(), left, right)
    with pytest.raises(TypeError, match="pyarrow.Table"):
        distributed_join(OneRank(), {"k": [1]}, right, on="k")
    with pytest.raises(TypeError, match="cannot hash key columns"):
        key_hash(pa.table({"k": pa.array([[1], [2]])}), ["k"])


def test_hash_partition_is_stable_and_type_insensitive():
    a = pa.table({"k": pa.array([5, 1, None, 5, 9], pa.int32()), "v": [0, 1, 2, 3, 4]})
    b = pa.table({"k": pa.array([5, 1, None, 5, 9], pa.int64()), "v": [0, 1, 2, 3, 4]})
    assert key_hash(a, ["k"]).tolist() == key_hash(b, ["k"]).tolist()
    # fixed values: pure arithmetic, the same on any process or machine (no per-process seed)
    assert key_hash(a, ["k"])[:2].tolist() == [16717243559324746421, 8841707400507832957]
    strings = pa.table({"k": pa.array(["abc", ""])})
    assert key_hash(strings, ["k"]).tolist() == [9354677890559832686, 9886184608339236366]
    pa_parts = hash_partition(a, ["k"], 3)
    assert sum(p.num_rows for p in pa_parts) == 5
    for p in pa_parts:  # equal keys land in one part, row order kept
        assert p.column("v").to_pylist() == sorted(p.column("v").to_pylist())
    holders = {}
    for i, p in enumerate(pa_parts):
        for k in p.column("k").to_pylist():
            holders.setdefault(k, set()).add(i)
    assert set(holders) == {5, 1, None, 9}
    assert all(len(parts) == 1 for parts in holders.values())
