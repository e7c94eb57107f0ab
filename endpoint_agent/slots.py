"""Progress slots: what each worker is running, in shared memory, without messages.

The manager creates one anonymous shared mapping (memfd) with a 24-byte slot per
worker and passes its file descriptor to the worker processes. A worker writes, per
task, the number of tasks it has started and a running flag with the start time: two
memory writes, no syscall. The manager reads the slots to report tasks running for a
while (RUNNING updates), to enforce walltimes, and, when a worker dies, to tell the
task that was running (the culprit) from the ones that were merely queued behind it.
"""
from __future__ import annotations

import mmap
import os
import struct

SLOT = struct.Struct("<QQd")  # started (count), running (0/1), start time of the current task
_RUN = struct.Struct("<QQ")
_TS = struct.Struct("<d")
_FLAG = struct.Struct("<Q")


class Slots:
    def __init__(self, n: int, fd: int | None = None):
        self.n = n
        self.size = max(mmap.PAGESIZE, SLOT.size * n)
        self.owner = fd is None
        if fd is None:
            if hasattr(os, "memfd_create"):
                fd = os.memfd_create("skyfn-slots", 0)
            else:  # pragma: no cover - non-Linux fallback
                import tempfile

                fd, path = tempfile.mkstemp(prefix="skyfn-slots-")
                os.unlink(path)
            os.ftruncate(fd, self.size)
        self.fd = fd
        self.mm = mmap.mmap(fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    # worker side -------------------------------------------------------------
    def begin(self, i: int, started: int, ts: float) -> None:
        off = i * SLOT.size
        _TS.pack_into(self.mm, off + 16, ts)
        _RUN.pack_into(self.mm, off, started, 1)

    def end(self, i: int) -> None:
        _FLAG.pack_into(self.mm, i * SLOT.size + 8, 0)

    # manager side ------------------------------------------------------------
    def read(self, i: int) -> tuple[int, bool, float]:
        started, running, ts = SLOT.unpack_from(self.mm, i * SLOT.size)
        return started, bool(running), ts

    def reset(self, i: int) -> None:
        SLOT.pack_into(self.mm, i * SLOT.size, 0, 0, 0.0)

    def close(self) -> None:
        try:
            self.mm.close()
        finally:
            if self.owner:
                os.close(self.fd)
