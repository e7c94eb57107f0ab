"""Dataflow benchmark (issue 26): futures as arguments on skyfn, Parsl and Dask in one run.

    python benchmarks/dataflow.py [--json] [--chain 1000] [--fanin 10000] [--workers 2]
        [--peers parsl,dask | none] [--timeout 600]

Starts a private embedded runtime (benchmarks/embedded.py: redis-server, moto, the service,
the endpoint `local` with `--workers` workers) and, after it is stopped, each peer in turn
with the same number of workers: Parsl's DataFlowKernel over a HighThroughputExecutor
(LocalProvider, one block of `--workers` workers) and a Dask distributed LocalCluster
(`--workers` worker processes of one thread each). One system runs at a time. On each:

- a chain of `--chain` tasks, each `inc(x)` taking the previous task's future
  (skyfn: `ex.submit(inc, fut)`; Parsl: a python_app called with the AppFuture; Dask:
  `client.submit(inc, fut)`), timed from the first submit to the last result;
  `chain_edge_ms` is that time over the chain's length (one hop per task);
- a fan-in: `--fanin` no-op mappers (`noop(i)`) and one reduce taking all their futures
  (skyfn and Dask: one list argument; Parsl: `inputs=[...]`, the only list its
  DataFlowKernel resolves; the mappers through `ex.submit`, Parsl app calls and Dask's
  `client.map`, each system's fastest way to submit many), timed from the first submit to
  the reduce's result
  (`fanin_10k_s` at 10,000, else `fanin_s`);
- each system first runs a chain of 20 and a fan-in of 50 to start its workers.

Every result is checked (the chain ends at `--chain`, the reduce returns the sum of
0..fanin-1): `checks` in the JSON.

`chain_edge_breakdown_ms` (skyfn): where an edge of the chain goes, median ms per stage over
its edges from the tasks' timestamped events (read after the run, one POST /tasks/status
with events per 1,000 tasks): `release` (the input DONE on its worker -> the dependent
QUEUED: released by the agent, which holds it parked; or, when the service releases it, the
result's trip back, settled, released and sent), `queue` (-> DISPATCHED), `dispatch` (->
RUNNING on a worker), `run` (-> DONE); their sum is the edge. `return` (DONE -> STORED: the
result back through the results queue and function) is off the edge's path when the agent
releases the dependent, and is reported beside it, with `released_by_agent` (edges whose
dependent was QUEUED before its input was STORED).

`client_requests_during_graph` (skyfn): the HTTP requests the SDK sends between the
submission of a graph (the last POST /tasks answered) and the final result in hand, summed
over the chain and the fan-in. They are counted by wrapping the Client's HttpClient.request
(skyfn/http.py: every call of the SDK goes through it), so the results push's WebSocket
frames are not requests; `requests_detail` lists them by method and path, with the
submission's own requests.

The JSON (last line with --json): `chain_edge_ms`, `chain_s`, `fanin_10k_s` (or `fanin_s`),
`client_requests_during_graph`, `chain_edge_breakdown_ms`, and for each peer present `peers.<name>` with its figures,
`chain_edge_over_parsl`, `chain_edge_over_dask`, `fanin_over_parsl`, `fanin_over_dask`
(skyfn / peer: below 1 means skyfn is faster), `goals` (issue 26: chain <= 0.5x Parsl's and
<= Dask's, fan-in <= 1.0x Parsl's, 0 client requests), `checks`, `startup_s`.
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/dataflow.py`
    sys.path.insert(0, str(ROOT))

WARM_CHAIN = 20
WARM_FANIN = 50


def inc(x):
    return x + 1


def noop(i):
    return i


def total(values):
    return sum(values)


def total_inputs(inputs=()):
    """Parsl's reduce: its DataFlowKernel resolves futures in `inputs`, not inside a list."""
    return sum(inputs)


def fanin_key(n: int) -> str:
    return "fanin_10k_s" if n == 10_000 else "fanin_s"


# -- skyfn ------------------------------------------------------------------------------

class RequestLog:
    """Every call of the SDK's HttpClient (skyfn/http.py), with when it started and ended."""

    def __init__(self, http):
        self.lock = threading.Lock()
        self.calls: list[tuple[float, float, str, str]] = []  # (start, end, method, path)
        send = http.request

        def logged(method, path, *args, **kwargs):
            start = time.perf_counter()
            try:
                return send(method, path, *args, **kwargs)
            finally:
                with self.lock:
                    self.calls.append((start, time.perf_counter(), method, path.split("?")[0]))

        http.request = logged

    def mark(self) -> int:
        with self.lock:
            return len(self.calls)

    def during_graph(self, since: int, until: float) -> dict:
        """The calls from index `since` on: the graph's POST /tasks, then what started after
        the last of them was answered and before `until` (the final result in hand)."""
        with self.lock:
            calls = self.calls[since:]
        posts = [c for c in calls if c[2] == "POST" and c[3] == "/tasks"]
        submitted = max((c[1] for c in posts), default=None)
        after, before = {}, {}
        for start, _end, method, path in calls:
            if method == "POST" and path == "/tasks":
                continue
            key = f"{method} {'/tasks/{id}' if path.startswith('/tasks/') and path != '/tasks/status' else path}"
            into = after if submitted is not None and submitted <= start <= until else before
            into[key] = into.get(key, 0) + 1
        return {"task_posts": len(posts), "after_submission": after, "during_submission": before,
                "count": sum(after.values())}


def skyfn_chain(ex, n: int, timeout: float, keep: list | None = None):
    t = time.perf_counter()
    fut = ex.submit(inc, 0)
    futures = [fut]
    for _ in range(n - 1):
        fut = ex.submit(inc, fut)
        futures.append(fut)
    value = fut.result(timeout=timeout)
    elapsed = time.perf_counter() - t
    if keep is not None:
        keep.extend(futures)
    return elapsed, value == n


# One edge of the chain, from the tasks' timestamped events (read after the run): the input
# DONE -> the dependent QUEUED (released) -> DISPATCHED -> RUNNING -> DONE; `return` (DONE ->
# STORED) is measured beside it.
EDGE_STAGES = (("release", "input DONE", "QUEUED"), ("queue", "QUEUED", "DISPATCHED"),
               ("dispatch", "DISPATCHED", "RUNNING"), ("run", "RUNNING", "DONE"))
RETURN_STAGE = ("return", "DONE", "STORED")


def edge_breakdown(client, task_ids: list[str]) -> dict:
    """Median milliseconds per stage of an edge over the chain (tasks 2..n), and their sum."""
    from skyfn.protocol.states import parse_events

    stamps: dict[str, dict[str, float]] = {}
    for i in range(0, len(task_ids), 1000):
        answer = client.status(task_ids[i:i + 1000], include_events=True)
        for tid, st in (answer.get("tasks") or {}).items():
            events = st.get("events") or []
            first: dict[str, float] = {}
            for state, ts in parse_events(events) if isinstance(events, str) else events:
                first.setdefault(state, float(ts))
            stamps[tid] = first
    spans: dict[str, list[float]] = {name: [] for name, _, _ in (*EDGE_STAGES, RETURN_STAGE)}
    by_agent = 0
    for prev, tid in zip(task_ids, task_ids[1:]):
        a, b = stamps.get(prev, {}), stamps.get(tid, {})
        at = {"input DONE": a.get("DONE"), **{k: b.get(k) for k in ("QUEUED", "DISPATCHED", "RUNNING", "DONE",
                                                                      "STORED")}}
        for name, start, end in (*EDGE_STAGES, RETURN_STAGE):
            if at.get(start) is not None and at.get(end) is not None:
                spans[name].append((at[end] - at[start]) * 1000)
        if a.get("STORED") is not None and b.get("QUEUED") is not None and b["QUEUED"] < a["STORED"]:
            by_agent += 1
    medians = {name: round(statistics.median(v), 3) for name, v in spans.items() if v}
    out = {name: medians[name] for name, _, _ in EDGE_STAGES if name in medians}
    out["sum_of_medians"] = round(sum(out.values()), 3)
    if RETURN_STAGE[0] in medians:
        out[RETURN_STAGE[0]] = medians[RETURN_STAGE[0]]
    out["edges_measured"] = min((len(spans[name]) for name, _, _ in EDGE_STAGES), default=0)
    out["released_by_agent"] = by_agent
    return out


def skyfn_fanin(ex, n: int, timeout: float):
    t = time.perf_counter()
    mappers = [ex.submit(noop, i) for i in range(n)]
    value = ex.submit(total, mappers).result(timeout=timeout)
    return time.perf_counter() - t, value == n * (n - 1) // 2


def node(*inputs):
    """A task of the big graph: 1 + the sum of its inputs' values."""
    return 1 + sum(inputs)


# Blocks of five, a -> (b, c) -> d -> e (as the chaos run's graphs): offset -> inputs' offsets.
BLOCK = {0: (), 1: (0,), 2: (0,), 3: (1, 2), 4: (3,)}
BLOCK_VALUES = (1, 2, 2, 5, 6)


def skyfn_graph(ex, n: int, timeout: float) -> dict:
    """`n` tasks in blocks of five with edges, submitted at once; every value checked."""
    t = time.perf_counter()
    futures: list = []
    for i in range(n):
        base = i - i % 5
        futures.append(ex.submit(node, *[futures[base + k] for k in BLOCK[i % 5]]))
    submitted = time.perf_counter() - t
    deadline = time.monotonic() + timeout
    wrong = sum(1 for i, f in enumerate(futures)
                if f.result(timeout=max(0.0, deadline - time.monotonic())) != BLOCK_VALUES[i % 5])
    seconds = time.perf_counter() - t
    edges = sum(len(BLOCK[i % 5]) for i in range(n))
    return {"tasks": n, "edges": edges, "seconds": seconds, "submit_s": submitted, "wrong": wrong}


def bench_skyfn(args) -> dict:
    from benchmarks.embedded import embedded_runtime
    from skyfn import Client, Executor

    t0 = time.perf_counter()
    with embedded_runtime("skyfn-dataflow-", {"workers": args.workers, "log_level": "WARNING"}):
        startup = time.perf_counter() - t0
        with Client() as client, Executor(endpoint="local", client=client) as ex:
            skyfn_chain(ex, WARM_CHAIN, args.timeout)  # registers the functions, starts the push
            skyfn_fanin(ex, WARM_FANIN, args.timeout)
            log = RequestLog(client._http)
            mark = log.mark()
            chain_futures: list = []
            chain_s, chain_ok = skyfn_chain(ex, args.chain, args.timeout, keep=chain_futures)
            chain_req = log.during_graph(mark, time.perf_counter())
            mark = log.mark()
            fanin_s, fanin_ok = skyfn_fanin(ex, args.fanin, args.timeout)
            fanin_req = log.during_graph(mark, time.perf_counter())
            push = ex.push_stats
            breakdown = edge_breakdown(client, [f.task_id for f in chain_futures])
            graph = skyfn_graph(ex, args.graph, args.timeout) if args.graph else None
    checks = {"chain": chain_ok, "fanin": fanin_ok}
    if graph is not None:
        checks["graph"] = graph["wrong"] == 0
    return {"chain_s": chain_s, "fanin_s": fanin_s, "startup_s": startup, "graph": graph,
            "checks": checks,
            "requests": {"chain": chain_req, "fanin": fanin_req}, "push_stats": push, "edge_breakdown": breakdown}


# -- Parsl ------------------------------------------------------------------------------

def bench_parsl(args) -> dict | None:
    from benchmarks import parsl_htex

    t0 = time.perf_counter()
    dfk = parsl_htex.load(args.workers, "parsl-dataflow-")
    if dfk is None:
        return None
    import parsl

    inc_app, noop_app, total_app = (parsl.python_app(f) for f in (inc, noop, total_inputs))

    def chain(n):
        t = time.perf_counter()
        fut = inc_app(0)
        for _ in range(n - 1):
            fut = inc_app(fut)
        value = fut.result(timeout=args.timeout)
        return time.perf_counter() - t, value == n

    def fanin(n):
        t = time.perf_counter()
        mappers = [noop_app(i) for i in range(n)]
        value = total_app(inputs=mappers).result(timeout=args.timeout)
        return time.perf_counter() - t, value == n * (n - 1) // 2

    try:
        chain(WARM_CHAIN)
        fanin(WARM_FANIN)
        startup = time.perf_counter() - t0
        chain_s, chain_ok = chain(args.chain)
        fanin_s, fanin_ok = fanin(args.fanin)
    finally:
        dfk.cleanup()
        parsl.clear()
    return {"chain_s": chain_s, "fanin_s": fanin_s, "startup_s": startup,
            "checks": {"chain": chain_ok, "fanin": fanin_ok}}


# -- Dask -------------------------------------------------------------------------------

def bench_dask(args) -> dict | None:
    try:
        from distributed import Client as DaskClient, LocalCluster
    except ImportError:
        return None
    for name in ("distributed", "tornado", "bokeh"):
        logging.getLogger(name).setLevel(logging.ERROR)
    t0 = time.perf_counter()
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.ERROR) as cluster, DaskClient(cluster) as client:

        def chain(n):
            t = time.perf_counter()
            fut = client.submit(inc, 0, pure=False)
            for _ in range(n - 1):
                fut = client.submit(inc, fut, pure=False)
            value = fut.result(timeout=args.timeout)
            return time.perf_counter() - t, value == n

        def fanin(n):
            t = time.perf_counter()
            mappers = client.map(noop, range(n), pure=False)  # one message for all (submit: one each)
            value = client.submit(total, mappers, pure=False).result(timeout=args.timeout)
            return time.perf_counter() - t, value == n * (n - 1) // 2

        chain(WARM_CHAIN)
        fanin(WARM_FANIN)
        startup = time.perf_counter() - t0
        chain_s, chain_ok = chain(args.chain)
        fanin_s, fanin_ok = fanin(args.fanin)
    return {"chain_s": chain_s, "fanin_s": fanin_s, "startup_s": startup,
            "checks": {"chain": chain_ok, "fanin": fanin_ok}}


# -- the run ----------------------------------------------------------------------------

PEERS = {"parsl": ("parsl_htex", bench_parsl, "pip install -r requirements-bench.txt (parsl)"),
         "dask": ("dask_distributed", bench_dask, "pip install -r requirements-bench.txt (dask[distributed])")}


def summarize(args, results: dict) -> dict:
    sky = results["skyfn"]
    edge = lambda r: r["chain_s"] * 1000 / args.chain  # noqa: E731
    requests = sum(sky["requests"][g]["count"] for g in ("chain", "fanin"))
    summary = {"chain": args.chain, "fanin": args.fanin, "workers": args.workers,
               "chain_edge_ms": round(edge(sky), 3), "chain_s": round(sky["chain_s"], 3),
               fanin_key(args.fanin): round(sky["fanin_s"], 3),
               "client_requests_during_graph": requests,
               "chain_edge_breakdown_ms": sky["edge_breakdown"],
               "requests_detail": sky["requests"], "push_stats": sky["push_stats"],
               "startup_s": round(sky["startup_s"], 2), "peers": {},
               "checks": {name: r["checks"] for name, r in results.items()}}
    graph = sky.get("graph")
    if graph is not None:
        summary["graph"] = {"tasks": graph["tasks"], "edges": graph["edges"], "seconds": round(graph["seconds"], 2),
                            "submit_s": round(graph["submit_s"], 2), "wrong": graph["wrong"],
                            "tasks_per_s": round(graph["tasks"] / graph["seconds"], 1)}
    goals = {"client_requests_during_graph == 0": requests == 0}
    for short, (name, _fn, _hint) in PEERS.items():
        if name not in results:
            continue
        r = results[name]
        summary["peers"][name] = {"chain_edge_ms": round(edge(r), 3), "chain_s": round(r["chain_s"], 3),
                                  fanin_key(args.fanin): round(r["fanin_s"], 3), "startup_s": round(r["startup_s"], 2)}
        summary[f"chain_edge_over_{short}"] = round(sky["chain_s"] / r["chain_s"], 3)
        summary[f"fanin_over_{short}"] = round(sky["fanin_s"] / r["fanin_s"], 3)
    if "chain_edge_over_parsl" in summary:
        goals["chain_edge_over_parsl <= 0.5"] = summary["chain_edge_over_parsl"] <= 0.5
        goals["fanin_over_parsl <= 1.0"] = summary["fanin_over_parsl"] <= 1.0
    if "chain_edge_over_dask" in summary:
        goals["chain_edge_over_dask <= 1.0"] = summary["chain_edge_over_dask"] <= 1.0
    summary["goals"] = goals
    return summary


def print_table(args, results: dict, summary: dict) -> None:
    fanin = f"fan-in {args.fanin} s"
    print(f"{'system':<18} {'chain edge ms':>14} {'chain s':>9} {fanin:>15} {'startup s':>10}")
    for name, r in results.items():
        print(f"{name:<18} {r['chain_s'] * 1000 / args.chain:>14.2f} {r['chain_s']:>9.2f} {r['fanin_s']:>15.2f} "
              f"{r['startup_s']:>10.1f}")
    for short in PEERS:
        if f"chain_edge_over_{short}" in summary:
            print(f"skyfn / {short}: chain edge {summary[f'chain_edge_over_{short}']:.2f}x, "
                  f"fan-in {summary[f'fanin_over_{short}']:.2f}x")
    print(f"client requests during the graphs (after submission, before the result): "
          f"{summary['client_requests_during_graph']} "
          f"(chain {summary['requests_detail']['chain']['after_submission']}, "
          f"fan-in {summary['requests_detail']['fanin']['after_submission']})")
    print(f"skyfn chain edge, median ms per stage: {summary['chain_edge_breakdown_ms']}")
    if "graph" in summary:
        g = summary["graph"]
        print(f"skyfn graph of {g['tasks']} tasks ({g['edges']} edges): {g['seconds']} s, {g['tasks_per_s']} tasks/s, "
              f"{g['wrong']} wrong")
    missed = [goal for goal, met in summary["goals"].items() if not met]
    print(f"goals (issue 26) checked: {len(summary['goals'])}; "
          + ("all met" if not missed else "missed: " + ", ".join(missed)))
    bad = [f"{name}.{what}" for name, c in summary["checks"].items() for what, ok in c.items() if not ok]
    if bad:
        print(f"WRONG RESULTS: {bad}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="skyfn dataflow benchmark (issue 26): chains and fan-in of futures")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.add_argument("--chain", type=int, default=1000, help="tasks of the chain (default 1,000)")
    p.add_argument("--fanin", type=int, default=10_000, help="mappers into the one reduce (default 10,000)")
    p.add_argument("--graph", type=int, default=100_000,
                   help="skyfn only: tasks of one big graph in blocks of five with edges (default 100,000; 0: none)")
    p.add_argument("--workers", type=int, default=2, help="workers of each system (default 2)")
    p.add_argument("--peers", default="parsl,dask", help="comma-separated: parsl, dask, or none")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a graph's result")
    args = p.parse_args(argv)
    if args.chain < 1 or args.fanin < 1:
        p.error("--chain and --fanin take at least 1")
    peers = [x for x in args.peers.split(",") if x and x != "none"]
    unknown = [x for x in peers if x not in PEERS]
    if unknown:
        p.error(f"unknown peers {unknown}: parsl, dask or none")

    results = {"skyfn": bench_skyfn(args)}
    for short in peers:
        name, fn, hint = PEERS[short]
        result = fn(args)
        if result is None:
            print(f"{short} not installed: {hint}", file=sys.stderr)
        else:
            results[name] = result
    summary = summarize(args, results)
    print_table(args, results, summary)
    if args.json:
        print(json.dumps(summary))
    return 0 if all(ok for c in summary["checks"].values() for ok in c.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
