"""Throughput and latency of the endpoint agent alone, against a real redis-server.

    .venv/bin/python -m benchmarks.agent [--tasks 10000] [--workers 2] [--json]

Starts a redis-server and a real agent (`skyfn-endpoint start --foreground` with its
queues configured directly), pushes N no-op tasks as TaskPacks of 512 into the task
stream, and times until every result has come back on the results stream; then 100
single-task round trips. The last line of --json output is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from infra.local.processes import start_redis
from tests.agent import fns
from tests.agent.conftest import AgentProc, Queues


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rtt", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="skyfn-bench-") as tmp:
        tmp = Path(tmp)
        redis = start_redis(tmp / "redis", appendonly=False)
        agent = None
        try:
            q = Queues(redis.url, "bench")
            agent = AgentProc(tmp / "home", "bench", {
                "workers": args.workers, "endpoint_id": "ep", "task_queue": q.task_desc,
                "results_queue": q.results_desc, "log_level": "WARNING"})
            agent.start(wait_workers=args.workers)
            ids, bodies, groups = q.build(fns.noop, [(i,) for i in range(args.tasks)], prefix="b")
            t0 = time.perf_counter()
            q.send(bodies, groups)
            q.collect(ids, timeout=120)
            batch_s = time.perf_counter() - t0
            rtts = []
            for i in range(args.rtt):
                _, b, g = q.build(fns.noop, [(i,)], prefix=f"r{i}-")
                t1 = time.perf_counter()
                q.send(b, g)
                q.collect([f"r{i}-0"], timeout=10)
                rtts.append((time.perf_counter() - t1) * 1e3)
            rtts.sort()
            out = {"tasks": args.tasks, "workers": args.workers, "batch_s": round(batch_s, 3),
                   "tasks_per_s": round(args.tasks / batch_s), "rtt_p50_ms": round(statistics.median(rtts), 2),
                   "rtt_p99_ms": round(rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))], 2)}
            if not args.json:
                print(f"{args.tasks} no-ops with {args.workers} workers: {batch_s:.3f} s = {out['tasks_per_s']:,} tasks/s; "
                      f"single task p50 {out['rtt_p50_ms']} ms, p99 {out['rtt_p99_ms']} ms")
            print(json.dumps(out))
        finally:
            if agent is not None:
                agent.terminate()
            redis.stop()


if __name__ == "__main__":
    main()
