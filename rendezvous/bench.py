"""Throughput of a rendezvous server: pairings per second (a 2-peer group joins and both
peers receive PEERS) and relay bandwidth.

    pairings_per_second(host, port, secret, seconds=3, processes=None, concurrency=64) -> float
    relay_bytes_per_second(host, port, secret, nbytes=1 GiB) -> float

Load comes from `processes` child processes, each keeping `concurrency` pairings in
flight on its own event loop with a minimal asyncio Protocol client (so the figure is the
server's, not the client's). The relay figure streams one direction through a spliced
relay pair with blocking sockets. `python -m rendezvous.bench [--json]` starts its own
server in a child process and reports both.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import threading
import time
from typing import Optional

from . import client
from .runner import new_event_loop, raise_fd_limit, serve_in_process
from .tokens import make_token

# WELCOME, PEERS 2, PEER 0, PEER 1
_LINES_PER_PAIRED_PEER = 4


class _Peer(asyncio.Protocol):
    """Sends its JOIN, counts lines until PEERS is complete, then closes."""

    __slots__ = ("line", "done", "lines", "transport")

    def __init__(self, line: bytes, done: asyncio.Future):
        self.line, self.done, self.lines = line, done, 0

    def connection_made(self, transport):
        self.transport = transport
        transport.write(self.line)

    def data_received(self, data):
        if data.startswith(b"ERROR") and not self.done.done():
            self.done.set_exception(RuntimeError(data.decode(errors="replace").strip()))
            return
        self.lines += data.count(b"\n")
        if self.lines >= _LINES_PER_PAIRED_PEER:
            self.transport.close()
            if not self.done.done():
                self.done.set_result(None)

    def connection_lost(self, exc):
        if not self.done.done():
            self.done.set_exception(ConnectionError("server closed the connection before PEERS"))


async def _pair(loop, host: str, port: int, secret: bytes, group: str) -> None:
    line = f"JOIN {group} {make_token(secret, group)} 2 -1\n".encode()
    done = (loop.create_future(), loop.create_future())
    made = await asyncio.gather(*(loop.create_connection(lambda f=f: _Peer(line, f), host, port) for f in done),
                                return_exceptions=True)
    try:
        for outcome in made:
            if isinstance(outcome, BaseException):
                raise outcome
        for outcome in await asyncio.gather(*done, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome
    finally:
        for outcome in made:
            if not isinstance(outcome, BaseException):
                outcome[0].close()
        for f in done:
            if f.done():
                f.exception()       # retrieved: no "never retrieved" warnings on failures
            else:
                f.cancel()


async def _drive(host, port, secret, seconds, concurrency, start_at, tag) -> int:
    loop = asyncio.get_running_loop()
    count = 0
    errors = 0
    stop_at = start_at + seconds
    await asyncio.sleep(max(0.0, start_at - time.time()))

    async def worker(w: int):
        nonlocal count, errors
        n = 0
        while time.time() < stop_at:
            n += 1
            try:
                await _pair(loop, host, port, secret, f"bench-{tag}-{w}-{n}")
            except (OSError, RuntimeError, ConnectionError):
                errors += 1
                await asyncio.sleep(0.01)
                continue
            if time.time() <= stop_at:
                count += 1

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    if errors and not count:
        raise RuntimeError(f"every pairing failed ({errors} errors)")
    return count


def _child(host, port, secret, seconds, concurrency, start_at, tag, out):
    raise_fd_limit()
    loop = new_event_loop()
    try:
        out.put(loop.run_until_complete(_drive(host, port, secret, seconds, concurrency, start_at, tag)))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        out.put(f"{type(exc).__name__}: {exc}")
    finally:
        loop.close()


def pairings_per_second(host: str, port: int, secret: str, seconds: float = 3.0,
                        processes: Optional[int] = None, concurrency: int = 64) -> float:
    """Completed pairings per second against the server at host:port (which must use `secret`)."""
    # One core for the server, the others for load (at least one client process, at most 4).
    processes = processes or max(1, min(4, (os.cpu_count() or 1) - 1))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 1.0 + 0.3 * processes   # let every child start before the clock runs
    tag = f"{os.getpid()}-{int(time.time() * 1000) % 100000}"
    procs = [ctx.Process(target=_child, args=(host, port, secret.encode(), seconds, concurrency, start_at,
                                              f"{tag}-{i}", out), daemon=True) for i in range(processes)]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join(10)
    failures = [r for r in results if isinstance(r, str)]
    if failures:
        raise RuntimeError(f"pairing benchmark failed: {failures[0]}")
    return sum(results) / seconds


def relay_bytes_per_second(host: str, port: int, secret: str, nbytes: int = 1 << 30) -> float:
    """Bytes per second from one relay half to the other (sender and receiver are threads here)."""
    group = f"bench-relay-{os.getpid()}-{time.time_ns()}"
    token = make_token(secret, group)
    halves = {}

    def open_half(me: int) -> None:
        halves[me] = client.relay((host, port), group, token, me, 1 - me, timeout=30)
    openers = [threading.Thread(target=open_half, args=(r,)) for r in (0, 1)]
    for t in openers:
        t.start()
    for t in openers:
        t.join()
    if len(halves) != 2:
        raise RuntimeError("the relay pair did not open")
    chunk = bytes(4 << 20)

    def send() -> None:
        left = nbytes
        while left > 0:
            n = min(left, len(chunk))
            halves[0].sendall(chunk[:n] if n < len(chunk) else chunk)
            left -= n
        halves[0].shutdown(socket.SHUT_WR)
    start = time.perf_counter()
    sender = threading.Thread(target=send)
    sender.start()
    got, buf = 0, bytearray(4 << 20)
    while True:
        n = halves[1].recv_into(buf)
        if not n:
            break
        got += n
    elapsed = time.perf_counter() - start
    sender.join()
    for sock in halves.values():
        sock.close()
    if got != nbytes:
        raise RuntimeError(f"relay delivered {got} of {nbytes} bytes")
    return got / elapsed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rendezvous.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--processes", type=int, default=None)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--loop", default="auto", choices=("auto", "uvloop", "asyncio"), help="server event loop")
    ap.add_argument("--log-level", default="warning", help="server log level")
    ap.add_argument("--relay-mib", type=int, default=1024, help="MiB streamed through a relay (0: skip)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    secret = os.urandom(16).hex()
    with serve_in_process("127.0.0.1", 0, secret, log_level=args.log_level, loop=args.loop) as srv:
        rate = pairings_per_second("127.0.0.1", srv.port, secret, args.seconds, args.processes, args.concurrency)
        relay = relay_bytes_per_second("127.0.0.1", srv.port, secret, args.relay_mib << 20) if args.relay_mib else 0
    result = {"pairings_per_s": round(rate, 1), "relay_mb_per_s": round(relay / 1e6, 1), "seconds": args.seconds,
              "server_loop": args.loop, "server_log_level": args.log_level, "load_avg_1m": os.getloadavg()[0]}
    print(json.dumps(result) if args.json else f"{rate:.0f} pairings/s, relay {relay / 1e6:.0f} MB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
