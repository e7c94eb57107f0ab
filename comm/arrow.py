"""pyarrow Tables over the communicator, in the Arrow IPC stream format.

A table is serialized once into an Arrow buffer and sent from it without another copy;
a received table's columns point into the received comm.Buffer (no copy either).

    send_table(comm, table, dest, tag=0) / recv_table(comm, source, tag=0)
    bcast_table, gather_tables, allgather_tables, alltoallv_tables (one table per rank)
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import pyarrow as pa

from comm.communicator import Communicator


def _as_table(table: Any, what: str) -> pa.Table:
    if isinstance(table, pa.Table):
        return table
    if isinstance(table, pa.RecordBatch):
        return pa.Table.from_batches([table])
    raise TypeError(f"{what} needs a pyarrow.Table (or RecordBatch), got {type(table).__name__}")


def table_to_buffer(table: Any) -> pa.Buffer:
    """Serialize a table (or record batch) to one Arrow IPC stream buffer."""
    table = _as_table(table, "table_to_buffer")
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def buffer_to_table(buf: Any) -> pa.Table:
    """Read a table from an Arrow IPC stream held in any bytes-like object (zero-copy)."""
    try:
        return pa.ipc.open_stream(pa.py_buffer(buf)).read_all()
    except pa.ArrowInvalid as e:
        raise ValueError(f"message is not an Arrow IPC stream ({e}): was it sent with "
                         "comm.arrow.send_table?") from None


def send_table(comm: Communicator, table: Any, dest: int, tag: int = 0) -> None:
    comm.send(table_to_buffer(table), dest, tag)


def recv_table(comm: Communicator, source: int, tag: int = 0) -> pa.Table:
    return buffer_to_table(comm.recv(source, tag))


def bcast_table(comm: Communicator, table: Optional[Any], root: int = 0) -> pa.Table:
    """Every rank gets root's table (other ranks pass None)."""
    payload = table_to_buffer(table) if comm.rank == root else None
    return buffer_to_table(comm.bcast(payload, root))


def gather_tables(comm: Communicator, table: Any, root: int = 0) -> Optional[list[pa.Table]]:
    """Root gets every rank's table, in rank order; other ranks get None."""
    parts = comm.gatherv(table_to_buffer(table), root)
    return None if parts is None else [buffer_to_table(p) for p in parts]


def allgather_tables(comm: Communicator, table: Any) -> list[pa.Table]:
    return [buffer_to_table(p) for p in comm.allgatherv(table_to_buffer(table))]


def alltoallv_tables(comm: Communicator, tables: Sequence[Any]) -> list[pa.Table]:
    """Send ``tables[i]`` to rank i; returns the tables received, indexed by source rank."""
    if isinstance(tables, (pa.Table, pa.RecordBatch)) or len(tables) != comm.size:
        got = type(tables).__name__ if isinstance(tables, (pa.Table, pa.RecordBatch)) else len(tables)
        raise ValueError(f"alltoallv_tables needs a list of {comm.size} tables (one per rank), "
                         f"got {got}")
    return [buffer_to_table(p) for p in comm.alltoallv([table_to_buffer(t) for t in tables])]


__all__ = ["allgather_tables", "alltoallv_tables", "bcast_table", "buffer_to_table",
           "gather_tables", "recv_table", "send_table", "table_to_buffer"]
