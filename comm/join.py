"""Distributed hash join of pyarrow Tables (the Cylon algorithm): every rank holds a part of
each input; rows are hash-partitioned by key so equal keys meet on one rank (one
alltoallv per table), and each rank joins what it received with pyarrow. The union of the
ranks' results is the join of the whole inputs.

The partitioning hash is stable across processes and machines (splitmix64 of integer and
float keys, FNV-1a of string and binary keys, compiled in comm._core), and key columns of
different integer widths or string flavours hash alike, so both sides agree.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from comm import _core
from comm.arrow import alltoallv_tables
from comm.communicator import Communicator

_HOW = {
    "inner": "inner",
    "left": "left outer", "left outer": "left outer",
    "right": "right outer", "right outer": "right outer",
    "outer": "full outer", "full": "full outer", "full outer": "full outer",
    "left semi": "left semi", "right semi": "right semi",
    "left anti": "left anti", "right anti": "right anti",
}
_NULL_HASH = np.uint64(0x9E3779B97F4A7C15)


def _column_hash(col: Union[pa.Array, pa.ChunkedArray]) -> np.ndarray:
    """uint64 hash per row of one key column."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    t = arr.type
    n = len(arr)
    out = np.empty(n, dtype=np.uint64)
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        vals = pc.cast(arr, pa.int64(), safe=False).fill_null(0)
        _core.hash_u64(vals.to_numpy().view(np.uint64), out)
    elif pa.types.is_temporal(t):
        width = pa.int64() if t.bit_width == 64 else pa.int32()
        vals = pc.cast(arr.view(width), pa.int64()).fill_null(0)
        _core.hash_u64(vals.to_numpy().view(np.uint64), out)
    elif pa.types.is_floating(t):
        vals = pc.cast(arr, pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
        vals = vals + 0.0  # -0.0 == 0.0 must hash alike
        vals[np.isnan(vals)] = np.nan  # one NaN bit pattern
        _core.hash_u64(np.ascontiguousarray(vals).view(np.uint64), out)
    elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_large_binary(t) or pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        arr = pc.cast(arr, pa.large_binary())
        _, offsets_buf, data_buf = arr.buffers()
        offsets = np.frombuffer(offsets_buf, dtype=np.int64)[arr.offset:arr.offset + n + 1]
        data = (np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None and data_buf.size
                else np.zeros(1, dtype=np.uint8))
        if n == 0:
            offsets = np.zeros(1, dtype=np.int64)
        _core.hash_binary(np.ascontiguousarray(offsets), data, out)
    else:
        raise TypeError(f"distributed_join cannot hash key columns of type {t}: use integer, "
                        "floating point, temporal, string or binary keys (cast first)")
    if arr.null_count:
        out[arr.is_null().to_numpy(zero_copy_only=False)] = _NULL_HASH
    return out


def key_hash(table: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """uint64 hash per row of the key columns (same value for equal keys on any process)."""
    h = np.zeros(table.num_rows, dtype=np.uint64)
    for k in keys:
        _core.combine_hashes(h, _column_hash(table.column(k)))
    return h


def hash_partition(table: pa.Table, keys: Sequence[str], nparts: int) -> list[pa.Table]:
    """Split ``table`` into ``nparts`` tables by key hash (row order kept within a part)."""
    if nparts == 1:
        return [table]
    part = (key_hash(table, keys) % np.uint64(nparts)).astype(np.int64)
    order = np.argsort(part, kind="stable")
    counts = np.bincount(part, minlength=nparts)
    ordered = table.take(pa.array(order))
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return [ordered.slice(int(s), int(c)) for s, c in zip(starts, counts)]


def _keys(value: Any, name: str) -> list[str]:
    keys = [value] if isinstance(value, str) else list(value or [])
    if not keys or not all(isinstance(k, str) for k in keys):
        raise ValueError(f"{name} must be a column name or a non-empty list of names, got {value!r}")
    return keys


def _check_columns(table: pa.Table, keys: list[str], side: str) -> None:
    missing = [k for k in keys if k not in table.column_names]
    if missing:
        raise ValueError(f"{side} table has no key column {missing[0]!r}; its columns are "
                         f"{table.column_names}")


def distributed_join(comm: Communicator, left: pa.Table, right: pa.Table,
                     on: Optional[Union[str, Sequence[str]]] = None, how: str = "inner", *,
                     left_on: Optional[Union[str, Sequence[str]]] = None,
                     right_on: Optional[Union[str, Sequence[str]]] = None,
                     left_suffix: Optional[str] = None, right_suffix: Optional[str] = None,
                     coalesce_keys: bool = True) -> pa.Table:
    """Join this rank's parts ``left`` and ``right`` with every other rank's (all ranks
    call it together). Returns this rank's part of the result: the union over ranks is
    ``pyarrow.Table.join`` of the concatenated inputs (row order differs).

    ``on`` names the key column(s) of both sides, or give ``left_on`` and ``right_on``.
    ``how``: inner, left, right, outer (or pyarrow's "left outer", "full outer", ...,
    "left semi", "left anti", "right semi", "right anti")."""
    for side, t in (("left", left), ("right", right)):
        if not isinstance(t, pa.Table):
            raise TypeError(f"distributed_join: {side} must be a pyarrow.Table, got {type(t).__name__}")
    if on is not None and (left_on is not None or right_on is not None):
        raise ValueError("distributed_join: pass either on=... or left_on=/right_on=, not both")
    if on is not None:
        lkeys = rkeys = _keys(on, "on")
    else:
        if left_on is None or right_on is None:
            raise ValueError("distributed_join: pass on=<key column(s)> (or both left_on and right_on)")
        lkeys, rkeys = _keys(left_on, "left_on"), _keys(right_on, "right_on")
        if len(lkeys) != len(rkeys):
            raise ValueError(f"left_on has {len(lkeys)} columns but right_on has {len(rkeys)}")
    if how not in _HOW:
        raise ValueError(f"how must be one of {sorted(_HOW)}, got {how!r}")
    _check_columns(left, lkeys, "left")
    _check_columns(right, rkeys, "right")

    if comm.size > 1:
        # permissive: parts from other ranks may differ in flavour (string/large_string, a
        # null-typed empty column) and are promoted to one schema
        left = pa.concat_tables(alltoallv_tables(comm, hash_partition(left, lkeys, comm.size)),
                                promote_options="permissive")
        right = pa.concat_tables(alltoallv_tables(comm, hash_partition(right, rkeys, comm.size)),
                                 promote_options="permissive")
    return left.join(right, keys=lkeys, right_keys=rkeys, join_type=_HOW[how],
                     left_suffix=left_suffix, right_suffix=right_suffix,
                     coalesce_keys=coalesce_keys)


__all__ = ["distributed_join", "hash_partition", "key_hash"]
