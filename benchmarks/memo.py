"""Memoization benchmark: a 10,000-task map over the same arguments, run twice through the
embedded runtime with ``Executor(memoize=True)``.

    python -m benchmarks.memo [--json] [--tasks 10000] [--work-ms 5]

The function does ``--work-ms`` of CPU work per call (a scientist memoizes calls that cost
something; a no-op is measured too, to show the floor: the second run's time is the
submission path alone). The second run must dispatch nothing: every task's events are read
back and those with a DISPATCHED event are counted. Starts and stops its own embedded
runtime (2 workers) in a private SKYFN_HOME. The last line is one JSON object (--json):
``memo_speedup_10k`` = first run / second run for the working function.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import yaml


def work(x, ms):
    import time

    end = time.perf_counter() + ms / 1000.0
    acc = 0
    while time.perf_counter() < end:
        acc += 1
    return x * x


def timed_map(fn, args, ms):
    from skyfn import Executor

    with Executor(endpoint="local", memoize=True) as ex:
        t = time.perf_counter()
        futures = [ex.submit(fn, a, ms) for a in args]
        out = [f.result(timeout=3600) for f in futures]
        elapsed = time.perf_counter() - t
    assert out == [a * a for a in args]
    return elapsed, [f.task_id for f in futures]


def dispatched(client, task_ids) -> tuple[int, int]:
    """(tasks with a DISPATCHED event, tasks answered from the cache)."""
    n_dispatched = n_hits = 0
    for i in range(0, len(task_ids), 5000):
        for st in client.status(task_ids[i:i + 5000], include_events=True)["tasks"].values():
            names = {e[0] for e in st["events"]}
            n_dispatched += "DISPATCHED" in names
            n_hits += "MEMO_HIT" in names
    return n_dispatched, n_hits


def main() -> None:
    parser = argparse.ArgumentParser(description="skyfn memoization benchmark")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--work-ms", type=float, default=5.0, help="CPU time of one call")
    args = parser.parse_args()

    from infra.local import runtime
    from skyfn import Client

    home = Path(tempfile.mkdtemp(prefix="skyfn-bench-memo-"))
    (home / "endpoints" / "local").mkdir(parents=True)
    (home / "endpoints" / "local" / "config.yaml").write_text(yaml.safe_dump({"workers": 2}))
    os.environ["SKYFN_HOME"] = str(home)
    runtime.up(home, detach=True, echo=lambda *_: None)
    rows = {}
    try:
        with Client() as client:
            timed_map(work, [-1, -2], 0)  # warm-up: workers, connections, registration path
            for label, ms, offset in (("work", args.work_ms, 0), ("noop", 0.0, 10 ** 9)):
                values = [offset + i for i in range(args.tasks)]
                first, first_ids = timed_map(work, values, ms)
                second, second_ids = timed_map(work, values, ms)
                d1, _ = dispatched(client, first_ids)
                d2, hits = dispatched(client, second_ids)
                rows[label] = {"work_ms": ms, "first_s": round(first, 3), "second_s": round(second, 3),
                               "speedup": round(first / second, 1), "first_dispatched": d1,
                               "second_dispatched": d2, "second_memo_hits": hits}
    finally:
        runtime.down(home, echo=lambda *_: None)

    print(f"{'function':<10} {'first run s':>12} {'second run s':>13} {'speedup':>8} {'dispatched 2nd':>15}")
    for label, r in rows.items():
        print(f"{label + ' ' + str(r['work_ms']) + 'ms':<10} {r['first_s']:>12.3f} {r['second_s']:>13.3f} "
              f"{r['speedup']:>7.1f}x {r['second_dispatched']:>15}")
    summary = {"tasks": args.tasks, "workers": 2, "memo_speedup_10k" if args.tasks == 10_000 else "memo_speedup":
               rows["work"]["speedup"], "second_run_dispatched": rows["work"]["second_dispatched"], "runs": rows}
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
