"""The Python Communicator: MPI-like point-to-point and collective operations between the
members of a rendezvous group, over direct (NAT-punched) or relayed TCP channels.

This module checks arguments and gives errors that name the problem and the fix; the
work happens in the C++ core through comm._core (GIL released while blocked).

Buffers: anything with the buffer protocol (bytes, bytearray, memoryview, numpy arrays,
pyarrow buffers, comm.Buffer) is sent without copying. Everything received is a
``comm.Buffer``: a bytes-like object owning the received memory, usable zero-copy as
``memoryview(b)``, ``numpy.frombuffer(b, dtype)`` or ``pyarrow.py_buffer(b)``;
``len(b)`` is its size in bytes and ``b.tobytes()`` copies it.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Optional

import numpy as np

from comm import _core
from comm.errors import CommError

Buffer = _core.Buffer
Request = _core.Request

_DTYPES = {np.dtype(np.int32): 0, np.dtype(np.int64): 1,
           np.dtype(np.float32): 2, np.dtype(np.float64): 3}
_OPS = {"sum": 0, "min": 1, "max": 2, "prod": 3}
_GROUP_RE = re.compile(r"[A-Za-z0-9._:@-]{1,128}")


def _parse_address(rendezvous: str) -> tuple[str, int]:
    if not isinstance(rendezvous, str):
        raise TypeError(f"rendezvous must be a 'host:port' string, got {type(rendezvous).__name__}")
    m = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:\s]+):(\d+)", rendezvous.strip())
    if not m:
        raise ValueError(f"rendezvous must look like 'host:port' (or '[ipv6]:port'), got {rendezvous!r}")
    host = m.group(1) or m.group(3)
    port = int(m.group(2) or m.group(4))
    if not 0 < port < 65536:
        raise ValueError(f"rendezvous port must be 1..65535, got {port}")
    return host, port


def _positive_seconds(name: str, value: float) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}") from None
    if not value > 0:
        raise ValueError(f"{name} must be > 0 seconds, got {value}")
    return value


def _as_reducible(array: Any, what: str) -> tuple[np.ndarray, tuple]:
    """(C-contiguous native-endian array, original shape); ascontiguousarray makes 0-d 1-d."""
    shape = np.shape(array)
    arr = np.ascontiguousarray(array)
    dt = arr.dtype
    if dt.kind in "iuf" and not dt.isnative:
        arr = arr.astype(dt.newbyteorder("="))
        dt = arr.dtype
    if dt not in _DTYPES:
        raise TypeError(f"{what} works on int32, int64, float32 and float64 arrays, got dtype "
                        f"{dt}: convert first, e.g. array.astype(numpy.float64)")
    return arr, shape


def _op_code(op: str) -> int:
    try:
        return _OPS[op]
    except (KeyError, TypeError):
        raise ValueError(f"op must be one of {', '.join(repr(o) for o in _OPS)}, got {op!r}") from None


class Communicator:
    """A member of a group. Create with :meth:`join`; every member calls collectives in
    the same order. Usable as a context manager (closes on exit)."""

    def __init__(self, core: Any):
        if not isinstance(core, _core._Core):
            raise TypeError("use Communicator.join(...) to create a communicator")
        self._core = core
        self._rank = core.rank
        self._size = core.size

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def join(cls, group: str, rendezvous: str, token: str, size: int, rank: Optional[int] = None,
             timeout: float = 30.0, punch_timeout: float = 3.0, allow_direct: bool = True,
             keepalive: float = 15.0) -> "Communicator":
        """Join ``group`` through the rendezvous server at ``"host:port"`` with a group token
        (``rendezvous.make_token(secret, group)``). Blocks until all ``size`` members joined
        and every pair has a channel (direct when punching works within ``punch_timeout``
        seconds, relayed otherwise; ``allow_direct=False`` relays every pair). ``rank=None``
        lets the server assign one. ``timeout`` bounds every blocking operation, join
        included: a silent or dead peer raises TimeoutError/PeerLostError, never hangs."""
        if not isinstance(group, str) or not _GROUP_RE.fullmatch(group):
            raise ValueError(f"group must match [A-Za-z0-9._:@-]{{1,128}}, got {group!r}")
        if not isinstance(token, str) or not token:
            raise TypeError("token must be the non-empty string from rendezvous.make_token(secret, group)")
        host, port = _parse_address(rendezvous)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be an int >= 1 (the number of group members), got {size!r}")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)
                                 or not 0 <= rank < size):
            raise ValueError(f"rank must be None (assigned by the server) or 0..{size - 1}, got {rank!r}")
        timeout = _positive_seconds("timeout", timeout)
        punch_timeout = _positive_seconds("punch_timeout", punch_timeout)
        keepalive = _positive_seconds("keepalive", keepalive)
        core = _core.join(group, host, port, token, size, -1 if rank is None else rank,
                          timeout, punch_timeout, keepalive, bool(allow_direct))
        return cls(core)

    def close(self) -> None:
        """Say bye on every channel and release them; idempotent."""
        self._core.close()

    @property
    def closed(self) -> bool:
        return self._core.closed

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<comm.Communicator rank {self._rank} of {self._size}, {state}>"

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def stats(self) -> dict[int, dict]:
        """Per peer rank: ``{"mode": "direct"|"relay"|"self", "address": "ip:port",
        "bytes_sent": n, "bytes_received": n}``."""
        return self._core.stats()

    # ------------------------------------------------------------------ checks

    def _check_rank(self, value: Any, name: str) -> int:
        if type(value) is int and 0 <= value < self._size:  # the fast path of every call
            return value
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int rank, got {type(value).__name__}")
        value = int(value)
        if not 0 <= value < self._size:
            raise ValueError(f"{name} {value} is out of range: ranks are 0..{self._size - 1}")
        return value

    @staticmethod
    def _check_tag(tag: Any) -> int:
        if type(tag) is int and 0 <= tag < 2**31:
            return tag
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)):
            raise TypeError(f"tag must be an int >= 0, got {type(tag).__name__}")
        tag = int(tag)
        if not 0 <= tag < 2**31:
            raise ValueError(f"tag must be 0..2**31-1 (negative tags are reserved for the "
                             f"collectives), got {tag}")
        return tag

    def _check_parts(self, parts: Any, what: str) -> list:
        if parts is None or isinstance(parts, (str, bytes, bytearray, memoryview, np.ndarray)):
            raise TypeError(f"{what} needs a list of {self._size} buffers (one per rank), "
                            f"got {type(parts).__name__}")
        parts = list(parts)
        if len(parts) != self._size:
            raise ValueError(f"{what} needs one buffer per rank ({self._size}), got {len(parts)}")
        return parts

    @staticmethod
    def _nbytes(obj: Any) -> int:
        return memoryview(obj).nbytes

    # ------------------------------------------------------------------ point to point

    def send(self, buf: Any, dest: int, tag: int = 0) -> None:
        """Send ``buf`` (zero-copy) to ``dest``; returns once the core is done with it."""
        self._core.send(buf, self._check_rank(dest, "dest"), self._check_tag(tag))

    def recv(self, source: int, tag: int = 0) -> Buffer:
        """Receive the next message from ``source`` with ``tag``; returns a comm.Buffer."""
        return self._core.recv(self._check_rank(source, "source"), self._check_tag(tag))

    def isend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        """Start sending ``buf``; it must not change until the request completes.
        Returns a Request (``wait()`` -> None, ``test()`` -> bool)."""
        return self._core.isend(buf, self._check_rank(dest, "dest"), self._check_tag(tag))

    def irecv(self, source: int, tag: int = 0) -> Request:
        """Start receiving; ``wait()`` returns the comm.Buffer."""
        return self._core.irecv(self._check_rank(source, "source"), self._check_tag(tag))

    # ------------------------------------------------------------------ collectives

    def barrier(self) -> None:
        self._core.barrier()

    def bcast(self, buf: Any, root: int = 0) -> Buffer:
        """Every rank gets root's ``buf`` (other ranks may pass None)."""
        root = self._check_rank(root, "root")
        if self._rank == root and buf is None:
            raise TypeError("bcast: root must pass the buffer to broadcast, got None")
        return self._core.bcast(buf if self._rank == root else None, root)

    def gatherv(self, buf: Any, root: int = 0) -> Optional[list[Buffer]]:
        """Root gets a list of every rank's buffer (any sizes); others get None."""
        return self._core.gatherv(buf, self._check_rank(root, "root"))

    def gather(self, buf: Any, root: int = 0) -> Optional[list[Buffer]]:
        """Like gatherv, but every rank must send the same number of bytes (checked on root)."""
        parts = self.gatherv(buf, root)
        if parts is not None:
            self._check_equal(parts, "gather", "gatherv")
        return parts

    def scatterv(self, parts: Optional[Iterable[Any]], root: int = 0) -> Buffer:
        """Root passes one buffer per rank (any sizes); rank i gets ``parts[i]``.
        Other ranks may pass None."""
        root = self._check_rank(root, "root")
        if self._rank == root:
            parts = self._check_parts(parts, "scatterv")
        else:
            parts = None
        return self._core.scatterv(parts, root)

    def scatter(self, parts: Optional[Iterable[Any]], root: int = 0) -> Buffer:
        """Like scatterv, but root's parts must all have the same size."""
        root = self._check_rank(root, "root")
        if self._rank == root:
            parts = self._check_parts(parts, "scatter")
            sizes = [self._nbytes(p) for p in parts]
            if len(set(sizes)) > 1:
                raise ValueError(f"scatter needs equal-size parts, got sizes {sizes}: "
                                 "use scatterv for uneven parts")
        return self.scatterv(parts, root)

    def allgatherv(self, buf: Any) -> list[Buffer]:
        """Every rank gets the list of every rank's buffer (any sizes)."""
        return self._core.allgatherv(buf)

    def allgather(self, buf: Any) -> list[Buffer]:
        """Like allgatherv, but every rank must send the same number of bytes."""
        parts = self.allgatherv(buf)
        self._check_equal(parts, "allgather", "allgatherv")
        return parts

    def alltoallv(self, parts: Iterable[Any]) -> list[Buffer]:
        """Rank i sends ``parts[j]`` to rank j and gets a list whose entry j came from j."""
        return self._core.alltoallv(self._check_parts(parts, "alltoallv"))

    def alltoall(self, parts: Iterable[Any]) -> list[Buffer]:
        """Like alltoallv, but all parts (on every rank) have the same size."""
        parts = self._check_parts(parts, "alltoall")
        sizes = [self._nbytes(p) for p in parts]
        if len(set(sizes)) > 1:
            raise ValueError(f"alltoall needs equal-size parts, got sizes {sizes}: "
                             "use alltoallv for uneven parts")
        got = self._core.alltoallv(parts)
        self._check_equal(got, "alltoall", "alltoallv", expect=sizes[0] if sizes else None)
        return got

    def _check_equal(self, parts: list, what: str, variant: str, expect: Optional[int] = None) -> None:
        sizes = [len(p) for p in parts]
        ref = sizes[self._rank] if expect is None else expect
        bad = [i for i, n in enumerate(sizes) if n != ref]
        if bad:
            raise ValueError(f"{what}: rank {bad[0]} sent {sizes[bad[0]]} bytes, not {ref} like "
                             f"this rank: every rank must pass the same size (use {variant} "
                             "for uneven sizes)")

    def reduce(self, array: Any, op: str = "sum", root: int = 0) -> Optional[np.ndarray]:
        """Element-wise reduction (``op``: sum, min, max, prod) of a numpy int32, int64,
        float32 or float64 array over all ranks (same shape and dtype everywhere). Root gets
        an array of that dtype and shape; other ranks get None. Integer sums wrap around."""
        arr, shape = _as_reducible(array, "reduce")
        code = _op_code(op)
        buf = self._core.reduce(arr, arr.size, _DTYPES[arr.dtype], code,
                                self._check_rank(root, "root"))
        if buf is None:
            return None
        return np.frombuffer(buf, dtype=arr.dtype).reshape(shape)

    def allreduce(self, array: Any, op: str = "sum") -> np.ndarray:
        """Like reduce, with the result on every rank (bit-identical everywhere)."""
        arr, shape = _as_reducible(array, "allreduce")
        code = _op_code(op)
        buf = self._core.allreduce(arr, arr.size, _DTYPES[arr.dtype], code)
        return np.frombuffer(buf, dtype=arr.dtype).reshape(shape)


__all__ = ["Buffer", "CommError", "Communicator", "Request"]
