"""Objects to bytes and back for stores: pickle protocol 5 with out-of-band buffers.

numpy arrays, pyarrow buffers and bytes-likes travel as raw frames after the pickle
stream, so encoding copies each buffer once (into the frame) and decoding copies nothing:
the decoded array is a view on the buffer the connector returned (writable when the
connector returned a writable buffer, e.g. a bytearray).

A large top-level `bytes` object (pickled in band by pickle itself, i.e. copied into the
stream) travels out of band too: it is the buffer frame as is, and decoding makes the one
copy a `bytes` needs.

Layout: b"SKD1" | u32 n | u64 len(pickle) | n x u64 len(buffer) | pickle | buffers.
"""
from __future__ import annotations

import pickle
import struct
from typing import Any

MAGIC = b"SKD1"
_HEAD = struct.Struct("<4sIQ")
OOB_BYTES = 64 << 10  # top-level bytes at least this large go out of band


class _OutOfBandBytes:
    """Pickles `bytes` as bytes(<out-of-band buffer>): no copy into the pickle stream."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def __reduce_ex__(self, protocol):
        return bytes, (pickle.PickleBuffer(self.data),)


def encode_frames(obj: Any) -> list:
    """[header, pickle, buffer...]: write them in order (a connector may send them as is)."""
    buffers: list[pickle.PickleBuffer] = []
    if type(obj) is bytes and len(obj) >= OOB_BYTES:
        obj = _OutOfBandBytes(obj)
    try:
        body = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    except Exception:  # functions, lambdas, closures: cloudpickle handles them, in band
        import cloudpickle

        buffers = []
        body = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    head = _HEAD.pack(MAGIC, len(raws), len(body)) + struct.pack(f"<{len(raws)}Q", *(r.nbytes for r in raws))
    return [head, body, *raws]


def encode(obj: Any) -> bytes:
    return b"".join(encode_frames(obj))


def size_of(frames: list) -> int:
    return sum(memoryview(f).nbytes for f in frames)


def decode(data: Any) -> Any:
    view = memoryview(data).cast("B")
    magic, n, body_len = _HEAD.unpack_from(view, 0)
    if magic != MAGIC:
        raise ValueError("not a skyfn data object (bad magic): the key holds something else")
    pos = _HEAD.size
    lens = struct.unpack_from(f"<{n}Q", view, pos)
    pos += 8 * n
    body = view[pos:pos + body_len]
    pos += body_len
    bufs = []
    for ln in lens:
        bufs.append(view[pos:pos + ln])
        pos += ln
    return pickle.loads(body, buffers=bufs)
