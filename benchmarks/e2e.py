"""End-to-end benchmark of the embedded runtime, with peers run in the same process.

    python -m benchmarks.e2e [--json] [--tasks 10000] [--rtt 300] [--big 100000] [--peers pool,parsl]

Starts everything it needs (redis-server, moto, the local gateway and an endpoint with
2 workers, in a private SKYFN_HOME) and stops it afterwards. Measures:

- single-task round trip with the results push (Executor.submit(...).result(), one at a
  time): p50 / p99 (``rtt_p50_ms``); and with the long-poll (Client.run + get_result:
  ``rtt_poll_p50_ms``); and in a direct session (Executor(direct=True): the SDK talks to
  the agent, the service authorizes and records: ``rtt_direct_p50_ms``);
- completion time of a batch of no-op tasks through the Executor (submit all, wait all),
  and the API requests it took with the push and with the long-poll
  (``api_requests_per_10k``: HTTP requests + WebSocket connections, scaled to 10,000 tasks),
  and in a direct session (``direct``: session and function requests; ``batch_direct_10k_s``);
- a batch of ``--big`` no-ops (``batch_100k_tasks_per_s``) with the peak RSS of the
  service (its process and its Lambda environments) and of the agent (agent, manager,
  workers), sampled every 0.1 s; and the same batch in a direct session
  (``batch_big_direct_tasks_per_s``: the tasks go SDK -> agent, the service records them);
- the same batch on concurrent.futures.ProcessPoolExecutor(2) and, when installed,
  Parsl's HighThroughputExecutor with 2 workers (logging off), and prints ratios
  (``rtt_p50_over_htex``: our push round trip over HTEX's, the same run;
  ``rtt_direct_over_htex``: the direct session's).

The last line printed is one JSON object (with --json).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml


def noop(x):
    return x


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def count_requests(client) -> list[int]:
    """Count the HTTP requests a Client sends: [all, POST /tasks/status ones]."""
    counter = [0, 0]
    send = client._http.request

    def counted(method, path, *args, **kwargs):
        counter[0] += 1
        counter[1] += path == "/tasks/status"
        return send(method, path, *args, **kwargs)

    client._http.request = counted
    return counter


class PeakRss:
    """Peak resident memory of process trees (a pid and its children), sampled every
    `period` s by a separate, lowered process (niceness +10): sampling in a thread of this
    process took the measured Executor's GIL and about a tenth of a core (psutil walks
    /proc for every tree). The trees' members are listed again every second, their RSS
    read every `period`."""

    def __init__(self, pids: dict[str, int], period: float = 0.1):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # this process has threads: no fork
        self._stop = ctx.Event()
        self._peaks, child_end = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_sample_peaks, args=(dict(pids), period, self._stop, child_end), daemon=True)
        self.peak = {name: 0 for name in pids}

    def __enter__(self) -> "PeakRss":
        self._proc.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._peaks.poll(30):
            self.peak.update(self._peaks.recv())
        self._proc.join(10)


def _sample_peaks(pids: dict[str, int], period: float, stop, out) -> None:
    import psutil

    os.nice(10)
    peak = {name: 0 for name in pids}
    trees: dict[str, list] = {}
    listed = 0.0
    while True:
        if time.monotonic() - listed >= 1.0:
            for name, pid in pids.items():
                try:
                    root = psutil.Process(pid)
                    trees[name] = [root, *root.children(recursive=True)]
                except psutil.Error:
                    trees[name] = []
            listed = time.monotonic()
        for name, procs in trees.items():
            total = 0
            for p in procs:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            peak[name] = max(peak[name], total)
        if stop.wait(period):
            break
    out.send(peak)


def batch_run(executor, tasks: int) -> float:
    t = time.perf_counter()
    out = list(executor.map(noop, range(tasks)))
    elapsed = time.perf_counter() - t
    assert out == list(range(tasks))
    return elapsed


def executor_rtts(ex, n: int) -> list[float]:
    """Milliseconds of `n` single-task round trips (submit, result), after 20 to warm up."""
    for i in range(20):
        ex.submit(noop, i).result(timeout=30)
    rtts = []
    for i in range(n):
        t = time.perf_counter()
        assert ex.submit(noop, i).result(timeout=30) == i
        rtts.append((time.perf_counter() - t) * 1000)
    return rtts


def bench_skyfn(tasks: int, rtt_n: int, big: int = 0) -> dict:
    from infra.local import runtime
    from skyfn import Client, Executor

    home = Path(tempfile.mkdtemp(prefix="skyfn-bench-"))
    cfg = home / "endpoints" / "local"
    cfg.mkdir(parents=True)
    (cfg / "config.yaml").write_text(yaml.safe_dump({"workers": 2, "direct": {"listen": "127.0.0.1"}}))
    os.environ["SKYFN_HOME"] = str(home)
    t0 = time.perf_counter()
    runtime.up(home, detach=True, echo=lambda *_: None)
    startup = time.perf_counter() - t0
    try:
        with Client() as client:
            endpoint_id = client.endpoint_id("local")
            fid = client.register_function(noop)
            for i in range(20):  # warm connections, caches and workers
                client.get_result(client.run(fid, i, endpoint_id=endpoint_id), timeout=30)
            poll_rtts = []
            for i in range(rtt_n):
                t = time.perf_counter()
                assert client.get_result(client.run(fid, i, endpoint_id=endpoint_id), timeout=30) == i
                poll_rtts.append((time.perf_counter() - t) * 1000)
        with Executor(endpoint="local", push=True) as ex:  # the results push
            rtts = executor_rtts(ex, rtt_n)
            push_stats = ex.push_stats
        with Executor(endpoint="local", direct=True) as ex:  # a direct session with the agent
            direct_rtts = executor_rtts(ex, rtt_n)
            direct_stats = ex.direct_stats
        assert direct_stats.get("active") and not direct_stats.get("to_service"), direct_stats
        requests, result_requests, batch = {}, {}, 0.0
        batch_direct = 0.0
        for mode in ("push", "poll", "direct"):
            with Client() as c, Executor(endpoint="local", client=c, push=mode == "push", direct=mode == "direct") as ex:
                batch_run(ex, 200)  # warm-up
                counter = count_requests(c)
                connects = ex.push_stats.get("connects", 0)
                elapsed = batch_run(ex, tasks)
                ws = ex.push_stats.get("connects", 0) - connects
                requests[mode] = round((counter[0] + ws) * 10_000 / tasks, 1)
                result_requests[mode] = round((counter[1] + ws) * 10_000 / tasks, 1)
                if mode == "push":
                    batch = elapsed
                elif mode == "direct":
                    batch_direct = elapsed
        big_result = {}
        if big:
            st = runtime.status(home)
            pids = {name: st["processes"][name]["pid"] for name in ("service", "agent", "redis")}
            with Executor(endpoint="local", push=True) as ex, PeakRss(pids) as rss:
                batch_run(ex, 1000)
                elapsed = batch_run(ex, big)
                big_push = ex.push_stats
            big_result = {"tasks_per_s": big / elapsed, "s": elapsed, "push_stats": big_push,
                          "peak_rss_mb": {k: round(v / 2**20, 1) for k, v in rss.peak.items()}}
            with Executor(endpoint="local", direct=True) as ex, PeakRss(pids) as rss:
                batch_run(ex, 1000)
                elapsed = batch_run(ex, big)
                stats = ex.direct_stats
            assert stats["active"] and not stats["to_service"], stats
            big_result["direct"] = {"tasks_per_s": big / elapsed, "s": elapsed,
                                    "peak_rss_mb": {k: round(v / 2**20, 1) for k, v in rss.peak.items()}}
    finally:
        runtime.down(home, echo=lambda *_: None)
    return {"batch_s": batch, "rtt_p50_ms": statistics.median(rtts), "rtt_p99_ms": percentile(rtts, 0.99),
            "rtt_poll_p50_ms": statistics.median(poll_rtts), "rtt_poll_p99_ms": percentile(poll_rtts, 0.99),
            "startup_s": startup, "requests": requests, "result_requests": result_requests, "big": big_result, "push_stats": push_stats,
            "rtt_direct_p50_ms": statistics.median(direct_rtts), "rtt_direct_p99_ms": percentile(direct_rtts, 0.99),
            "batch_direct_s": batch_direct, "direct_stats": direct_stats}


def bench_pool(tasks: int, rtt_n: int) -> dict:
    with ProcessPoolExecutor(2) as pool:
        list(pool.map(noop, range(200)))
        t = time.perf_counter()
        futures = [pool.submit(noop, i) for i in range(tasks)]
        assert [f.result() for f in futures] == list(range(tasks))
        batch = time.perf_counter() - t
        rtts = []
        for i in range(rtt_n):
            t = time.perf_counter()
            pool.submit(noop, i).result()
            rtts.append((time.perf_counter() - t) * 1000)
    return {"batch_s": batch, "rtt_p50_ms": statistics.median(rtts), "rtt_p99_ms": percentile(rtts, 0.99)}


def bench_parsl(tasks: int, rtt_n: int) -> dict | None:
    from benchmarks import parsl_htex

    t0 = time.perf_counter()
    dfk = parsl_htex.load(2, "parsl-bench-")
    if dfk is None:
        return None
    import parsl

    app = parsl.python_app(noop)
    try:
        [app(i).result() for i in range(20)]
        startup = time.perf_counter() - t0
        t = time.perf_counter()
        futures = [app(i) for i in range(tasks)]
        assert [f.result() for f in futures] == list(range(tasks))
        batch = time.perf_counter() - t
        rtts = []
        for i in range(rtt_n):
            t = time.perf_counter()
            app(i).result()
            rtts.append((time.perf_counter() - t) * 1000)
    finally:
        dfk.cleanup()
        parsl.clear()
    return {"batch_s": batch, "rtt_p50_ms": statistics.median(rtts), "rtt_p99_ms": percentile(rtts, 0.99),
            "startup_s": startup}


def main() -> None:
    parser = argparse.ArgumentParser(description="skyfn end-to-end benchmark")
    parser.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--rtt", type=int, default=300, help="sequential single-task round trips")
    parser.add_argument("--big", type=int, default=100_000, help="tasks of the sustained batch (0: skip it)")
    parser.add_argument("--peers", default="pool,parsl", help="comma-separated: pool, parsl, or none")
    args = parser.parse_args()
    peers = {p for p in args.peers.split(",") if p and p != "none"}

    results = {"skyfn": bench_skyfn(args.tasks, args.rtt, args.big)}
    if "pool" in peers:
        results["process_pool"] = bench_pool(args.tasks, args.rtt)
    if "parsl" in peers:
        parsl_result = bench_parsl(args.tasks, args.rtt)
        if parsl_result is None:
            print("parsl not installed: pip install -r requirements-bench.txt to include it", file=sys.stderr)
        else:
            results["parsl_htex"] = parsl_result

    sky = results["skyfn"]
    extra = {k: sky.pop(k) for k in ("requests", "result_requests", "big", "push_stats", "rtt_poll_p50_ms", "rtt_poll_p99_ms",
                                     "rtt_direct_p50_ms", "rtt_direct_p99_ms", "batch_direct_s", "direct_stats")}
    print(f"{'system':<14} {args.tasks:>6} tasks (s) {'tasks/s':>9} {'rtt p50 ms':>11} {'rtt p99 ms':>11}")
    for name, r in results.items():
        print(f"{name:<14} {r['batch_s']:>16.2f} {args.tasks / r['batch_s']:>9.0f} {r['rtt_p50_ms']:>11.2f} "
              f"{r['rtt_p99_ms']:>11.2f}")
    ratios = {}
    for name, r in results.items():
        if name != "skyfn":
            ratios[f"{name}_batch_over_skyfn"] = r["batch_s"] / sky["batch_s"]
            ratios[f"{name}_rtt_p50_over_skyfn"] = r["rtt_p50_ms"] / sky["rtt_p50_ms"]
            print(f"{name}: batch takes {ratios[f'{name}_batch_over_skyfn']:.2f}x skyfn's time, "
                  f"rtt p50 {ratios[f'{name}_rtt_p50_over_skyfn']:.2f}x")
    summary = {
        "tasks": args.tasks, "workers": 2,
        "batch_10k_s" if args.tasks == 10_000 else "batch_s": round(sky["batch_s"], 3),
        "rtt_p50_ms": round(sky["rtt_p50_ms"], 3), "rtt_p99_ms": round(sky["rtt_p99_ms"], 3),
        "startup_s": round(sky["startup_s"], 2),
        "peers": {k: {kk: round(vv, 3) for kk, vv in v.items()} for k, v in results.items() if k != "skyfn"},
        "ratios": {k: round(v, 2) for k, v in ratios.items()},
    }
    summary["rtt_poll_p50_ms"] = round(extra["rtt_poll_p50_ms"], 3)
    summary["rtt_poll_p99_ms"] = round(extra["rtt_poll_p99_ms"], 3)
    summary["rtt_direct_p50_ms"] = round(extra["rtt_direct_p50_ms"], 3)
    summary["rtt_direct_p99_ms"] = round(extra["rtt_direct_p99_ms"], 3)
    summary[f"batch_direct_{args.tasks // 1000}k_s" if args.tasks % 1000 == 0 else "batch_direct_s"] = \
        round(extra["batch_direct_s"], 3)
    if "parsl_htex" in results:
        summary["rtt_p50_over_htex"] = round(sky["rtt_p50_ms"] / results["parsl_htex"]["rtt_p50_ms"], 2)
        summary["rtt_direct_over_htex"] = round(extra["rtt_direct_p50_ms"] / results["parsl_htex"]["rtt_p50_ms"], 2)
    summary["api_requests_per_10k"] = extra["requests"]
    # of those, the ones that fetch results (status calls + WebSocket connections)
    summary["result_requests_per_10k"] = extra["result_requests"]
    if extra["requests"].get("push"):
        summary["api_requests_poll_over_push"] = round(extra["requests"]["poll"] / extra["requests"]["push"], 1)
    if extra["big"]:
        summary[f"batch_{args.big // 1000}k_tasks_per_s" if args.big % 1000 == 0 else "batch_big_tasks_per_s"] = \
            round(extra["big"]["tasks_per_s"])
        summary["batch_big_s"] = round(extra["big"]["s"], 2)
        summary["peak_rss_mb"] = extra["big"]["peak_rss_mb"]
        summary["batch_big_push_stats"] = extra["big"]["push_stats"]
        summary["batch_big_direct_tasks_per_s"] = round(extra["big"]["direct"]["tasks_per_s"])
        summary["peak_rss_mb_direct"] = extra["big"]["direct"]["peak_rss_mb"]
    summary["push_stats"] = extra["push_stats"]
    summary["direct_stats"] = extra["direct_stats"]
    print(f"round trip p50 with push {sky['rtt_p50_ms']:.2f} ms, with long-poll {extra['rtt_poll_p50_ms']:.2f} ms; "
          f"in a direct session {extra['rtt_direct_p50_ms']:.2f} ms; API requests per 10k tasks: {extra['requests']}")
    if extra["big"]:
        print(f"{args.big} tasks: {extra['big']['tasks_per_s']:.0f} tasks/s, peak RSS (MiB) {extra['big']['peak_rss_mb']}")
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
