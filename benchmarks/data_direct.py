"""The direct path vs Redis: put in a producer -> resolved in a consumer process (issue 12).

    python -m benchmarks.data_direct [--json] [--sizes 1kib,1mib,100mib] [--reps-small 30] [--reps-large 7] [--netns]

On loopback: a rendezvous server and the object server (child processes, started by
`benchmarks.object_server.benchmark_connector`), a password-protected redis-server
(ours, stopped by PID), this process as the producer and one spawned consumer process.
For each size a numpy uint8 array of that many bytes is put as a ref (`store.ref(array,
evict=True)`), the pickled ref goes over a pipe, and the consumer resolves it and reports
CLOCK_MONOTONIC (one clock for every process of a machine), so each sample is put ->
resolved. The consumer knows the Redis store (its secret) but not the direct one: it
resolves direct refs through the object server's capability check, as a task on another
endpoint would, over a channel it keeps between pulls (the first pull's call and punch
are in the warm-ups). Median after two warm-ups per cell. The last line (--json) holds
`direct_over_redis_<size>` (goal for 100 MiB: <= 0.5).

`--netns` (root): the producer's endpoint and the consumer each behind its own NAT router,
Redis and the rendezvous server in the public namespace (benchmarks/data_direct_peer.py;
each sample also crosses the driver's pipes, a few hundred microseconds).

`pair_seconds(kind, nbytes, reps)` runs one such producer/consumer pair and returns the
samples in seconds (kind "direct" or "redis"); benchmarks/data.py uses
`benchmark_connector(store, secret)` for its own harness.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.data_peer import consume

SIZES = {"1kib": 1 << 10, "1mib": 1 << 20, "100mib": 100 << 20}
SECRET = os.urandom(32).hex()


def _consume(pipe, stores: dict) -> None:
    """The consumer process: registers `stores` (name -> (connector config, secret)), then
    answers each pickled ref with (monotonic time when resolved, size in bytes), and
    b"channels" with its channels (proof of the path)."""
    os.environ["SKYFN_DATA_CACHE_BYTES"] = "0"          # every sample goes to the connector
    consume(pipe, stores, {b"channels": _channel_stats})


def _channel_stats() -> dict:
    from skyfn.data.connectors.direct import channel_stats

    return channel_stats()


class Pair:
    """This process as the producer of `stores` (kind -> Store), one consumer process."""

    def __init__(self, stores: dict, known: dict):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.stores = stores
        self.pipe, child = ctx.Pipe()
        self.proc = ctx.Process(target=_consume, args=(child, known), daemon=True)
        self.proc.start()
        child.close()

    def once(self, kind: str, payload) -> float:
        t0 = time.monotonic()
        ref = self.stores[kind].ref(payload, evict=True, owner="bench")
        self.pipe.send_bytes(pickle.dumps(ref))
        t1, size = self.pipe.recv()
        if size != payload.nbytes:
            raise RuntimeError(f"the consumer resolved {size} bytes, not {payload.nbytes}")
        return t1 - t0

    def channels(self) -> dict:
        """The consumer's channels to object servers (mode direct|relay, bytes received)."""
        self.pipe.send_bytes(b"channels")
        return self.pipe.recv()

    def close(self) -> None:
        try:
            self.pipe.send_bytes(b"")
        except OSError:
            pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


class Setup:
    """Servers and stores of one run (context manager: everything stops by PID at exit)."""

    def __enter__(self) -> "Setup":
        from infra.local.processes import start_redis
        from skyfn.data import Store
        from benchmarks.object_server import benchmark_connector
        from skyfn.data.connectors.redis import RedisConnector

        self.work = Path(tempfile.mkdtemp(prefix="skyfn-bench-direct-"))
        self.redis = start_redis(self.work / "redis", appendonly=False, secure=True)
        os.environ["SKYFN_DATA_REDIS_PASSWORD"] = (self.work / "redis" / "redis.password").read_text().strip()
        self.stores = {"redis": Store("bench-redis", RedisConnector(port=self.redis.port), secret=SECRET),
                       "direct": Store("bench-direct", benchmark_connector("bench-direct", SECRET), secret=SECRET)}
        # the consumer knows the Redis store; the direct one it resolves without its secret
        self.pair = Pair(self.stores, {"bench-redis": (self.stores["redis"].connector.config(), SECRET)})
        return self

    def __exit__(self, *exc) -> None:
        from benchmarks.object_server import stop_benchmark

        self.pair.close()
        stop_benchmark()
        self.redis.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def pair_seconds(kind: str, nbytes: int, reps: int = 5, warmup: int = 2) -> list[float]:
    """Seconds from put in a producer to resolved in a consumer process, `reps` samples."""
    import numpy as np

    payload = np.frombuffer(os.urandom(nbytes), dtype=np.uint8)
    with Setup() as s:
        for _ in range(warmup):
            s.pair.once(kind, payload)
        return [s.pair.once(kind, payload) for _ in range(reps)]


class NetnsSetup:
    """--netns: the producer's endpoint (object server + producer process) and the consumer
    in their own network namespaces behind NAT routers (tests/comm/netns.py), the rendezvous
    server and the redis-server in the public namespace -- Redis as the third party both
    reach through their NATs. Needs root; everything is removed at exit."""

    PORT_RDV, PORT_REDIS = 7300, 6379

    def __enter__(self) -> "NetnsSetup":
        import secrets
        import subprocess

        from tests.comm.natgroup import LineReader, start_rendezvous
        from tests.comm.netns import NatTopology, wait_listening

        self.topo = NatTopology(2).create()
        self.work = Path(tempfile.mkdtemp(prefix="skyfn-bench-direct-netns-"))
        try:
            topo, pub = self.topo, self.topo.public_ip
            rdv_secret = secrets.token_hex(16)
            start_rendezvous(topo, rdv_secret, self.PORT_RDV)
            password = secrets.token_hex(24)
            conf = self.work / "redis.conf"
            fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)   # the password: never on argv
            with os.fdopen(fd, "w") as f:
                f.write(f"port {self.PORT_REDIS}\nbind {pub}\nrequirepass {password}\nsave \"\"\nappendonly no\n"
                        f"dir {self.work}\n")
            redis = topo.spawn(topo.public_ns, ["redis-server", str(conf)], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_listening(topo, topo.public_ns, self.PORT_REDIS, proc=redis)
            name, directory, ready = "objects.bench-producer", str(self.work / "objects"), self.work / "ready.json"
            rdv = f"{pub}:{self.PORT_RDV}"
            topo.python(topo.sites[0].ns, ["-m", "endpoint_agent.data.object_server", "--rendezvous", rdv, "--name", name,
                                           "--store", "bench-direct", "--directory", directory, "--endpoint-id",
                                           "bench-producer", "--ready-file", str(ready), "--log-level", "warning"],
                        env={"SKYFN_RENDEZVOUS_SECRET": rdv_secret, "SKYFN_DIRECT_STORE_SECRET": SECRET},
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            deadline = time.monotonic() + 30
            while not ready.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("the object server did not listen within 30 s")
                time.sleep(0.05)
            env = {"SKYFN_RENDEZVOUS_SECRET": rdv_secret, "SKYFN_DATA_REDIS_PASSWORD": password,
                   "SKYFN_BENCH_STORE_SECRET": SECRET, "SKYFN_DATA_CACHE_BYTES": "0"}
            args = [rdv, name, directory, pub, str(self.PORT_REDIS)]
            self.peers = {}
            for role, site, ep in (("producer", topo.sites[0], "bench-producer"),
                                   ("consumer", topo.sites[1], "bench-consumer")):
                proc = topo.python(site.ns, ["-m", "benchmarks.data_direct_peer", role, *args],
                                   env={**env, "SKYFN_ENDPOINT_ID": ep}, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                self.peers[role] = (proc, LineReader(proc))
        except BaseException:
            self.__exit__()
            raise
        return self

    def _ask(self, role: str, msg: dict) -> dict:
        proc, reader = self.peers[role]
        proc.stdin.write(json.dumps(msg) + "\n")
        proc.stdin.flush()
        return reader.json(300)

    def once(self, kind: str, nbytes: int) -> float:
        made = self._ask("producer", {"kind": kind, "nbytes": nbytes})
        got = self._ask("consumer", {"ref": made["ref"]})
        if got["size"] != nbytes:
            raise RuntimeError(f"the consumer resolved {got['size']} bytes, not {nbytes}")
        return got["t1"] - made["t0"]

    def channels(self) -> dict:
        return self._ask("consumer", {"channels": True})["channels"]

    def __exit__(self, *exc) -> None:
        for proc, _ in getattr(self, "peers", {}).values():
            if proc.stdin:
                proc.stdin.close()
        self.topo.close()
        shutil.rmtree(self.work, ignore_errors=True)


def measure(once, labels: list[str], reps_small: int, reps_large: int) -> dict:
    """{kind: {label: {median_ms, min_ms, reps}}}: two warm-ups per cell, then samples of Redis
    and direct interleaved, so both see the same machine load."""
    results: dict[str, dict] = {}
    for label in labels:
        nbytes = SIZES[label]
        reps = reps_large if nbytes >= 16 << 20 else reps_small
        for kind in ("redis", "direct"):
            for _ in range(2):
                once(kind, nbytes)
        samples: dict[str, list] = {"redis": [], "direct": []}
        for _ in range(reps):
            for kind in ("redis", "direct"):
                samples[kind].append(once(kind, nbytes))
        for kind, times in samples.items():
            results.setdefault(kind, {})[label] = {"median_ms": round(statistics.median(times) * 1000, 3),
                                                   "min_ms": round(min(times) * 1000, 3), "reps": reps}
            print(f"  {kind:<7} {label:>7} median {statistics.median(times) * 1000:10.3f} ms  "
                  f"min {min(times) * 1000:10.3f} ms  (n={reps})", flush=True)
    return results


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description="direct vs Redis: put -> resolved in another process")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--reps-small", type=int, default=30)
    parser.add_argument("--reps-large", type=int, default=7)
    parser.add_argument("--netns", action="store_true", help="producer and consumer behind NATs (root)")
    args = parser.parse_args()
    labels = [x for x in args.sizes.split(",") if x]
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if args.netns:
        with NetnsSetup() as s:
            results = measure(s.once, labels, args.reps_small, args.reps_large)
            channels = [c for chans in s.channels().values() for c in chans]
    else:
        payloads: dict[int, Any] = {}

        with Setup() as s:
            def once(kind: str, nbytes: int) -> float:
                if nbytes not in payloads:
                    payloads[nbytes] = np.frombuffer(os.urandom(nbytes), dtype=np.uint8)
                return s.pair.once(kind, payloads[nbytes])

            results = measure(once, labels, args.reps_small, args.reps_large)
            channels = [c for chans in s.pair.channels().values() for c in chans]
    print("consumer's channels to the object server:", channels)
    summary = {"setup": "netns (two NATs; Redis and rendezvous in the public namespace)" if args.netns else "loopback",
               "load_average_start": load_start,
               "load_average_end": " ".join(f"{x:.2f}" for x in os.getloadavg()), "results": results,
               "direct_channels": channels}
    for label in results.get("direct", {}):
        summary[f"direct_over_redis_{label}"] = round(results["direct"][label]["median_ms"]
                                                      / results["redis"][label]["median_ms"], 3)
    print("ratios:", {k: v for k, v in summary.items() if "_over_" in k})
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
