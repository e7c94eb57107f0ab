"""One communicator rank of benchmarks/comm.py, run inside a peer network namespace.

    python -m benchmarks.comm_peer pair RENDEZVOUS GROUP RANK REDIS_HOST REPEATS
        two ranks over one punched channel: bandwidth (64 MiB messages), 1-byte
        round trips, 1 MiB and 64 MiB transfers direct (send, 1-byte ack) and through
        Redis only (SET + LPUSH notice, BRPOP + GET, LPUSH ack, BRPOP ack); then the
        same pair relayed by the rendezvous server (allow_direct=False): bandwidth,
        round trips, 1 MiB transfers.
    python -m benchmarks.comm_peer coll RENDEZVOUS GROUP SIZE ITERS
        allreduce (1 and 1 Mi float64) and alltoall (64 KiB and 1 MiB per destination).

Tokens from $SKYFN_BENCH_TOKEN (and $SKYFN_BENCH_RELAY_TOKEN for GROUP.relay). Rank 0 prints one JSON line with its figures; every rank
prints {"error": ...} and exits 1 on failure.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback

import numpy as np

from comm import Communicator

MiB = 1 << 20
now = time.perf_counter


def _join(rendezvous: str, group: str, size: int, rank: int | None, relay: bool = False) -> Communicator:
    token = os.environ["SKYFN_BENCH_RELAY_TOKEN" if relay else "SKYFN_BENCH_TOKEN"]
    return Communicator.join(group + (".relay" if relay else ""), rendezvous=rendezvous, token=token, size=size,
                             rank=rank, timeout=120.0, allow_direct=not relay)


def _bandwidth_gbit(c, msg: int, count: int) -> float:
    buf = np.ones(msg, dtype=np.uint8)
    c.barrier()
    if c.rank == 0:
        t0 = now()
        for _ in range(count):
            c.send(buf, 1, tag=10)
        c.recv(1, tag=11)
        return count * msg * 8 / (now() - t0) / 1e9
    for _ in range(count):
        c.recv(0, tag=10)
    c.send(b"k", 0, tag=11)
    return 0.0


def _round_trips_us(c, iters: int, warmup: int = 1000) -> list[float]:
    one = b"x"
    out = []
    c.barrier()
    if c.rank == 0:
        for i in range(warmup + iters):
            t0 = now()
            c.send(one, 1)
            c.recv(1)
            if i >= warmup:
                out.append((now() - t0) * 1e6)
    else:
        for _ in range(warmup + iters):
            c.send(c.recv(0), 0)
    return out


def _transfer_ms(c, payload, reps: int) -> list[float]:
    """Rank 0 sends `payload` to rank 1 and waits for its 1-byte ack; per-rep times in ms."""
    times = []
    c.barrier()
    for _ in range(reps):
        if c.rank == 0:
            t0 = now()
            c.send(payload, 1, tag=20)
            c.recv(1, tag=21)
            times.append((now() - t0) * 1e3)
        else:
            n = memoryview(c.recv(0, tag=20)).nbytes
            if n != len(payload):
                raise RuntimeError(f"received {n} bytes, expected {len(payload)}")
            c.send(b"a", 0, tag=21)
    return times


def _redis_transfer_ms(c, r, payload, reps: int, ns: str) -> list[float]:
    """The same hand-over with Redis as the only medium, as functions that cannot reach each
    other do it: rank 0 SETs the value and pushes a notice (one pipelined round trip),
    rank 1 BRPOPs the notice, GETs the value and pushes an ack, rank 0 BRPOPs the ack.
    The channel is used only for the barrier before the timed loop."""
    times = []
    c.barrier()
    for k in range(reps):
        key = f"{ns}:v{k}"
        if c.rank == 0:
            t0 = now()
            r.pipeline(transaction=False).set(key, payload).lpush(f"{ns}:notice", key).execute()
            r.brpop(f"{ns}:ack", timeout=60)
            times.append((now() - t0) * 1e3)
        else:
            _, got_key = r.brpop(f"{ns}:notice", timeout=60)
            value = r.get(got_key)
            if value is None or len(value) != len(payload):
                raise RuntimeError(f"Redis gave {None if value is None else len(value)} bytes, expected {len(payload)}")
            r.lpush(f"{ns}:ack", b"a")
    c.barrier()
    if c.rank == 0:
        r.delete(*[f"{ns}:v{k}" for k in range(reps)])
    return times


def pair(rendezvous: str, group: str, rank: int, redis_host: str, repeats: int) -> dict:
    import redis

    c = _join(rendezvous, group, 2, rank)
    mode = c.stats()
    bw = [_bandwidth_gbit(c, 64 * MiB, 24) for _ in range(repeats)]
    rtt = [_round_trips_us(c, 20000) for _ in range(repeats)]
    r = redis.Redis(host=redis_host, port=6379)
    figures = {}
    for label, size, reps in (("1mib", MiB, 50), ("64mib", 64 * MiB, 5)):
        payload = os.urandom(size)
        figures[f"direct_{label}_ms"] = _transfer_ms(c, payload, reps)
        figures[f"redis_{label}_ms"] = _redis_transfer_ms(c, r, payload, reps, f"{group}:{label}")
    c.barrier()
    c.close()
    # The same pair forced through the rendezvous server's relay, for comparison.
    c = _join(rendezvous, group, 2, rank, relay=True)
    relay_mode = _plain_stats(c.stats())
    relay_bw = max(_bandwidth_gbit(c, 64 * MiB, 8) for _ in range(repeats))
    relay_rtt = _round_trips_us(c, 5000)
    relay_1mib = _transfer_ms(c, os.urandom(MiB), 50)
    c.barrier()
    c.close()
    if rank != 0:
        return {}
    medians = [statistics.median(x) for x in rtt]
    best = min(range(repeats), key=lambda i: medians[i])
    return {"stats": _plain_stats(mode), "relay_stats": relay_mode, "relay_bw_gbit": relay_bw,
            "relay_rtt_us_median": statistics.median(relay_rtt), "relay_1mib_ms": statistics.median(relay_1mib),
            "bw_gbit_runs": bw, "bw_gbit": max(bw),
            "rtt_us_median": medians[best], "rtt_us_min": min(rtt[best]),
            "rtt_us_mean": statistics.fmean(rtt[best]), "rtt_us_median_runs": medians,
            **{k: statistics.median(v) for k, v in figures.items()},
            **{k.replace("_ms", "_ms_min"): min(v) for k, v in figures.items()}}


def _op_ms(c, fn, iters: int) -> float:
    """Median over iterations of the slowest rank's time for one call of fn, in ms."""
    fn()  # warm-up (buffers, first use of each channel)
    times = np.zeros(iters)
    for i in range(iters):
        c.barrier()
        t0 = now()
        fn()
        times[i] = (now() - t0) * 1e3
    slowest = np.frombuffer(memoryview(c.allreduce(times, op="max")), dtype=np.float64)
    return float(np.median(slowest))


def coll(rendezvous: str, group: str, size: int, iters: int) -> dict:
    c = _join(rendezvous, group, size, None)
    small = np.ones(1, dtype=np.float64)
    big = np.ones(MiB, dtype=np.float64)
    parts_64k = [np.full(64 << 10, c.rank, dtype=np.uint8) for _ in range(size)]
    parts_1m = [np.full(MiB, c.rank, dtype=np.uint8) for _ in range(size)]
    out = {
        "allreduce_8b_ms": _op_ms(c, lambda: c.allreduce(small, op="sum"), iters),
        "allreduce_8mib_ms": _op_ms(c, lambda: c.allreduce(big, op="sum"), iters),
        "alltoall_64kib_ms": _op_ms(c, lambda: c.alltoall(parts_64k), iters),
        "alltoall_1mib_ms": _op_ms(c, lambda: c.alltoall(parts_1m), iters),
    }
    check = np.frombuffer(memoryview(c.allreduce(big, op="sum")), dtype=np.float64)
    got = [np.frombuffer(memoryview(p), dtype=np.uint8) for p in c.alltoall(parts_64k)]
    if check[0] != size or any(g.size != 64 << 10 or g[0] != src for src, g in enumerate(got)):
        raise RuntimeError("collective result is wrong")
    modes = sorted({s["mode"] for s in _plain_stats(c.stats()).values()})
    rank = c.rank
    c.close()
    return {"size": size, "modes": modes, **out} if rank == 0 else {}


def _plain_stats(raw) -> dict:
    if isinstance(raw, dict):
        return {str(k): dict(v) for k, v in raw.items()}
    return {str(s["rank"]): dict(s) for s in raw}


def main(argv: list[str]) -> int:
    try:
        if argv[0] == "pair":
            out = pair(argv[1], argv[2], int(argv[3]), argv[4], int(argv[5]))
        elif argv[0] == "coll":
            out = coll(argv[1], argv[2], int(argv[3]), int(argv[4]))
        else:
            raise SystemExit(f"unknown mode {argv[0]!r}: pair or coll")
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}), flush=True)
        return 1
    if out:
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
