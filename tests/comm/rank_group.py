"""A group of real rank processes for the communicator tests.

Each rank is its own process (multiprocessing "spawn": a fresh interpreter, as a function
on another endpoint would be) that joins one rendezvous group and then runs the functions
the test sends it: ``group.run(fn, *args)`` calls ``fn(comm, *args)`` on every rank at once
and returns the per-rank results in rank order. ``fn`` must be a module-level function and
its result picklable (turn comm.Buffer into bytes). Keeping the processes across calls
amortizes their start-up over many collectives.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import traceback
from typing import Any, Callable, Iterable, Optional

_CTX = mp.get_context("spawn")


def _rank_main(conn, address: str, token: str, group: str, size: int, rank: Optional[int],
               join_kwargs: dict) -> None:
    from comm import Communicator

    try:
        c = Communicator.join(group, rendezvous=address, token=token, size=size, rank=rank,
                              **join_kwargs)
    except BaseException as e:  # reported to the test, which asserts on it
        conn.send(("join_error", type(e).__name__, str(e)))
        return
    conn.send(("ready", c.rank))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            c.close()
            return
        if msg[0] == "stop":
            c.close()
            conn.send(("stopped",))
            return
        _, fn, args = msg
        try:
            conn.send(("ok", fn(c, *args)))
        except BaseException as e:
            conn.send(("error", type(e).__name__, f"{e}\n{traceback.format_exc()}"))


class RankFailed(AssertionError):
    def __init__(self, rank: int, exc_type: str, detail: str):
        super().__init__(f"rank {rank} raised {exc_type}: {detail}")
        self.rank, self.exc_type, self.detail = rank, exc_type, detail


class RankGroup:
    """``size`` processes joined to ``group`` at the rendezvous server ``address``."""

    def __init__(self, address: str, token: str, group: str, size: int,
                 ranks: Optional[list[Optional[int]]] = None, join_timeout: float = 60.0,
                 **join_kwargs: Any):
        self.size = size
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        join_kwargs.setdefault("timeout", 20.0)
        ranks = ranks if ranks is not None else list(range(size))
        for r in ranks:
            parent, child = _CTX.Pipe()
            p = _CTX.Process(target=_rank_main, daemon=True,
                             args=(child, address, token, group, size, r, join_kwargs))
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        self.ranks: list[int] = []
        self.join_errors: list[tuple[str, str]] = []
        deadline = time.monotonic() + join_timeout
        for i, conn in enumerate(self.conns):
            msg = self._recv(conn, deadline, f"process {i} joining")
            if msg[0] == "ready":
                self.ranks.append(msg[1])
            else:
                self.join_errors.append((msg[1], msg[2]))
        if not self.join_errors:
            # index processes by their rank (the server may have assigned them)
            order = sorted(range(len(self.ranks)), key=lambda i: self.ranks[i])
            self.procs = [self.procs[i] for i in order]
            self.conns = [self.conns[i] for i in order]

    @staticmethod
    def _recv(conn, deadline: float, what: str):
        left = deadline - time.monotonic()
        if left <= 0 or not conn.poll(left):
            raise AssertionError(f"no answer from {what} before the deadline (hung?)")
        try:
            return conn.recv()
        except EOFError:
            raise AssertionError(f"{what}: the process exited without answering") from None

    def submit(self, fn: Callable, *args: Any, ranks: Optional[Iterable[int]] = None) -> list[int]:
        ranks = list(range(self.size)) if ranks is None else list(ranks)
        for r in ranks:
            self.conns[r].send(("run", fn, args))
        return ranks

    def collect(self, ranks: Iterable[int], timeout: float = 120.0, raw: bool = False) -> list[Any]:
        """Per-rank results; raises RankFailed for the first failing rank unless raw, in
        which case failures come back as ("error", exc_type, detail) tuples."""
        deadline = time.monotonic() + timeout
        out = []
        for r in ranks:
            msg = self._recv(self.conns[r], deadline, f"rank {r}")
            if msg[0] == "ok":
                out.append(msg[1])
            elif raw:
                out.append(msg)
            else:
                raise RankFailed(r, msg[1], msg[2])
        return out

    def run(self, fn: Callable, *args: Any, timeout: float = 120.0) -> list[Any]:
        return self.collect(self.submit(fn, *args), timeout)

    def kill(self, rank: int) -> None:
        """SIGKILL one rank's process (a function that dies without saying bye)."""
        os.kill(self.procs[rank].pid, signal.SIGKILL)
        self.procs[rank].join(10)

    def close(self) -> None:
        for p, conn in zip(self.procs, self.conns):
            if p.is_alive():
                try:
                    conn.send(("stop",))
                except (BrokenPipeError, OSError):
                    pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
        for conn in self.conns:
            conn.close()

    def __enter__(self) -> "RankGroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
