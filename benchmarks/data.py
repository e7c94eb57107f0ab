"""Data-plane benchmark (issue 12): put in a producer -> resolved in a consumer process.

    python -m benchmarks.data [--json] [--reps-small 40] [--reps-large 5]

For 1 KiB, 1 MiB and 100 MiB of bytes, the time from the producer's put (skyfn:
`store.ref(obj, evict=True)`; ProxyStore: `store.proxy(obj, evict=True)`) to the object
resolved in a separate consumer process (the pickled ref/proxy goes over a pipe; the
consumer forces resolution and reports the monotonic clock, which is system-wide, so both
ends read one clock). Median over repetitions after two warm-ups per cell; the systems
take turns within each repetition, so the shared machine's noise falls on all alike.

skyfn connectors: redis, file, s3 (moto in server mode), direct (its peer started by
benchmarks/object_server.py when it can be, else reported "not available"). ProxyStore 1.1.0
(`make bench-deps`) in the same run with its RedisConnector and FileConnector against the
same redis-server (our own, started here with a password, stopped by PID) and the same
directory. The last line is one JSON object (--json); ratios are ours / ProxyStore's time
(`redis_over_proxystore_1mib`, `redis_over_proxystore_100mib`, goal <= 1.0) and
`direct_over_redis_100mib` (goal <= 0.5).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pickle
import shutil
import statistics
import tempfile
import time
from pathlib import Path

SIZES = {"1kib": 1 << 10, "1mib": 1 << 20, "100mib": 100 << 20}
SECRET = "ab" * 32


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Consumer:
    """A spawned consumer process (benchmarks.data_peer.consume) and its pipe."""

    def __init__(self, stores: dict):
        from benchmarks.data_peer import consume

        ctx = multiprocessing.get_context("spawn")
        self.pipe, child = ctx.Pipe()
        self.proc = ctx.Process(target=consume, args=(child, stores), daemon=True)
        self.proc.start()
        child.close()

    def roundtrip(self, make_handle, payload: bytes) -> float:
        """Seconds from the producer's put to the consumer's resolution."""
        t0 = time.monotonic()
        handle = make_handle(payload)
        self.pipe.send_bytes(pickle.dumps(handle))
        t1, size = self.pipe.recv()
        if size != len(payload):
            raise RuntimeError(f"the consumer resolved {size} bytes, not {len(payload)}")
        return t1 - t0

    def close(self) -> None:
        self.pipe.send_bytes(b"")
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


def direct_store(secret: str):
    """(Store, config for the consumer) of the direct connector, or (None, why not)."""
    try:
        from benchmarks.object_server import benchmark_connector as factory
    except ImportError as exc:
        return None, f"not available: benchmarks/object_server.py cannot start a peer here ({exc})"
    from skyfn.data import Store

    try:
        conn = factory("bench-direct", secret)
    except Exception as exc:  # noqa: BLE001 - reported, the other systems still run
        return None, f"not available: its benchmark peer did not start ({type(exc).__name__}: {exc})"
    return Store("bench-direct", conn, secret=secret), None


def main() -> None:
    parser = argparse.ArgumentParser(description="skyfn data plane vs ProxyStore: put -> resolved in another process")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--reps-small", type=int, default=40, help="repetitions at 1 KiB and 1 MiB")
    parser.add_argument("--reps-large", type=int, default=5, help="repetitions at 100 MiB")
    parser.add_argument("--sizes", default=",".join(SIZES), help="subset of 1kib,1mib,100mib")
    parser.add_argument("--skip", default="", help="comma-separated systems to leave out (e.g. s3)")
    args = parser.parse_args()

    import boto3

    from infra.local.processes import start_moto, start_redis
    from skyfn.data import Store
    from skyfn.data.connectors.file import FileConnector
    from skyfn.data.connectors.redis import RedisConnector
    from skyfn.data.connectors.s3 import S3Connector

    work = Path(tempfile.mkdtemp(prefix="skyfn-bench-data-"))
    load_start = load_average()
    redis_srv = start_redis(work / "redis", appendonly=False, secure=True)
    password = (work / "redis" / "redis.password").read_text().strip()
    os.environ["SKYFN_DATA_REDIS_PASSWORD"] = password
    moto = None
    stores: dict = {}
    skip = {s for s in args.skip.split(",") if s}
    results: dict[str, dict] = {}
    notes: dict[str, str] = {}
    consumer = None
    try:
        stores = {
            "redis": Store("bench-redis", RedisConnector(port=redis_srv.port), secret=SECRET),
            "file": Store("bench-file", FileConnector(str(work / "files" / "skyfn")), secret=SECRET),
        }
        if "s3" not in skip:
            moto = start_moto(work / "moto")
            os.environ.update({"AWS_ENDPOINT_URL": moto.url, "AWS_ACCESS_KEY_ID": "bench",
                               "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"})
            boto3.client("s3").create_bucket(Bucket="bench-data")
            stores["s3"] = Store("bench-s3", S3Connector("bench-data"), secret=SECRET)
        if "direct" not in skip:
            store, why = direct_store(SECRET)
            if store is None:
                notes["direct"] = why
            else:
                stores["direct"] = store
        peers = {}
        try:
            from proxystore.connectors.file import FileConnector as PSFile
            from proxystore.store import Store as PSStore

            from benchmarks.data_peer import AuthRedisConnector

            peers = {"proxystore_redis": PSStore("ps-redis", AuthRedisConnector("127.0.0.1", redis_srv.port),
                                                 cache_size=0, register=True),
                     "proxystore_file": PSStore("ps-file", PSFile(str(work / "files" / "proxystore")),
                                                cache_size=0, register=True)}
        except ImportError as exc:
            notes["proxystore"] = f"not installed ({exc}): run make bench-deps"
        consumer = Consumer({s.name: (s.connector.config(), SECRET) for s in stores.values()})

        handles = {name: (lambda st: (lambda b: st.ref(b, evict=True, owner="bench")))(st)
                   for name, st in stores.items()}
        handles.update({name: (lambda st: (lambda b: st.proxy(b, evict=True)))(st) for name, st in peers.items()})
        for label in [s for s in args.sizes.split(",") if s]:
            size = SIZES[label]
            payload = os.urandom(size)
            reps = args.reps_large if size >= 16 << 20 else args.reps_small
            names = [n for n in handles if n not in skip]
            for name in names:
                for _ in range(2):
                    consumer.roundtrip(handles[name], payload)  # warm-up: connections, imports, first allocation
            times: dict[str, list] = {n: [] for n in names}
            for rep in range(reps):  # interleaved, so the machine's noise falls on every system alike
                for name in names:
                    if name == "s3" and size >= 16 << 20 and rep >= max(1, reps // 2):
                        continue  # moto is slow at 100 MiB: half the repetitions
                    times[name].append(consumer.roundtrip(handles[name], payload))
            for name in names:
                t = times[name]
                results.setdefault(name, {})[label] = {"median_ms": round(statistics.median(t) * 1000, 3),
                                                       "min_ms": round(min(t) * 1000, 3), "reps": len(t)}
                print(f"  {name:<17} {label:>7} median {statistics.median(t) * 1000:10.3f} ms  "
                      f"min {min(t) * 1000:10.3f} ms  (n={len(t)})", flush=True)
    finally:
        if consumer is not None:
            consumer.close()
        if "direct" in stores:
            from benchmarks.object_server import stop_benchmark

            stop_benchmark()
        redis_srv.stop()
        if moto is not None:
            moto.stop()
        shutil.rmtree(work, ignore_errors=True)

    def med(name, label):
        return results.get(name, {}).get(label, {}).get("median_ms")

    def ratio(a, b):
        return round(a / b, 3) if a and b else None

    labels = [s for s in args.sizes.split(",") if s]
    print(f"\n{'system':<18}" + "".join(f"{lbl:>14}" for lbl in labels) + "   (median ms, put -> resolved)")
    for name in results:
        print(f"{name:<18}" + "".join(f"{med(name, lbl) if med(name, lbl) is not None else '-':>14}" for lbl in labels))
    for name, why in notes.items():
        print(f"{name:<18} {why}")
    summary = {"load_average_start": load_start, "load_average_end": load_average(), "results": results,
               "notes": notes}
    for lbl in labels:
        summary[f"redis_over_proxystore_{lbl}"] = ratio(med("redis", lbl), med("proxystore_redis", lbl))
        summary[f"file_over_proxystore_{lbl}"] = ratio(med("file", lbl), med("proxystore_file", lbl))
    summary["direct_over_redis_100mib"] = ratio(med("direct", "100mib"), med("redis", "100mib"))
    print("ratios:", {k: v for k, v in summary.items() if "_over_" in k})
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
