"""funcX's container-warming experiment (section 6.2), scaled to this machine.

    .venv/bin/python -m benchmarks.warming [--json] [--runtime podman|bubblewrap]
        [--slots 4] [--types 10] [--batches 25,50,100] [--durations 0,0.1,0.5] [--seed 1]

10 functions each need their own container type; a batch of tasks is drawn uniformly at
random over the types; there are fewer worker slots (default 4) than types, so not every
type can stay warm. Each (batch size, duration) is run twice on the same batch, each time
from a cold pool:
- warming-aware routing: endpoint_agent.containers.warm_pool (a task goes to an idle worker
  warm for its type; else an empty slot; else the least-recently-used idle worker of
  another type is replaced; queued tasks with a warm worker go first);
- random routing: each task goes to a slot drawn at random and waits for it; if the slot
  is warm for another type its container is replaced (a cold start).
Reported: completion time of the batch (submit to last result), cold starts, and the
reduction of completion time (funcX reported up to 61%).

Containers are real: every worker is `endpoint_agent.worker` inside a container started
by the runtime (default podman: `podman run --rm --rootfs <skeleton> --network host`,
the host's /usr and Python bound read-only; a cold start is container creation +
interpreter start + imports until the worker's READY). podman is the default because its
cold start (~0.25-0.4 s here: an OCI container created by conmon/crun, mounts, namespaces,
cgroups) is the realistic one; bubblewrap's (~0.1 s) is little more than a Python start.
The cold-start time of each real runtime (and of a plain process) is measured first.

This runs on the process-level harness (endpoint_agent.containers.harness.ContainerPool:
this process plays the manager). Once the agent's manager uses the WarmPool and the
runtimes (colleague A's integration), the same experiment can drive the agent instead:
submit the batch through the interchange with per-task `container` set.

The last line printed with --json is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time

from endpoint_agent.containers.config import ContainerConfig
from endpoint_agent.containers.harness import ContainerPool
from endpoint_agent.containers.runtime import make_runtime


def work(d):
    if d:
        import time as _t

        _t.sleep(d)
    return d


def runtime_for(name: str, types: int):
    cfg = ContainerConfig(runtime=name, types={f"fn{i}": {"image": "host"} for i in range(types)})
    rt = make_runtime(cfg)
    problems = rt.problems()
    if problems and name == "podman" and os.geteuid() == 0:
        from endpoint_agent.containers.hostprep import fix_cgroup_hybrid

        fix_cgroup_hybrid()
        problems = rt.problems()
    return rt, problems


def measure_cold_start(name: str, n: int) -> dict:
    """n cold starts one after the other: container start until the worker says READY."""
    rt, problems = runtime_for(name, n)
    if problems:
        return {"runtime": name, "error": "; ".join(problems)}
    with ContainerPool(rt, 1, routing="warm") as pool:
        t0 = time.monotonic()
        pool.run([(f"fn{i}", work, (0,)) for i in range(n)], timeout=300)
        wall = time.monotonic() - t0
        cs = sorted(pool.cold_start_s)
    return {"runtime": name, "n": len(cs), "p50_ms": round(1000 * cs[len(cs) // 2], 1),
            "mean_ms": round(1000 * statistics.mean(cs), 1), "min_ms": round(1000 * cs[0], 1),
            "max_ms": round(1000 * cs[-1], 1), "per_task_wall_ms": round(1000 * wall / n, 1)}


def run_once(rt, slots: int, routing: str, batch: list, seed: int) -> dict:
    with ContainerPool(rt, slots, routing=routing, seed=seed) as pool:
        t0 = time.monotonic()
        out = pool.run(batch, timeout=1800)
        elapsed = time.monotonic() - t0
        st = pool.stats()
    bad = [o for o in out if o.state != "SUCCEEDED"]
    if bad:
        raise RuntimeError(f"{len(bad)} task(s) failed: {bad[0].error}")
    return {"completion_s": round(elapsed, 3), "cold_starts": st["cold_starts"], "warm_hits": st["warm_hits"],
            "evictions": st["evictions"],
            "cold_start_p50_ms": round(1000 * st["cold_start_s"]["p50"], 1) if st["cold_start_s"]["p50"] else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks.warming")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--runtime", default="podman", choices=["podman", "bubblewrap", "none"])
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--types", type=int, default=10)
    ap.add_argument("--batches", default="25,50,100")
    ap.add_argument("--durations", default="0,0.1,0.5")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cold-samples", type=int, default=8)
    args = ap.parse_args(argv)
    batches = [int(x) for x in args.batches.split(",") if x]
    durations = [float(x) for x in args.durations.split(",") if x]

    cold = {}
    for name, exe in (("none", None), ("bubblewrap", "bwrap"), ("podman", "podman")):
        if exe and shutil.which(exe) is None:
            cold[name] = {"runtime": name, "error": f"{exe} not installed"}
            continue
        cold[name] = measure_cold_start(name, args.cold_samples)
        c = cold[name]
        print(f"cold start {name:>10}: " + (c.get("error") or
              f"p50 {c['p50_ms']} ms, mean {c['mean_ms']} ms, min {c['min_ms']} ms, max {c['max_ms']} ms "
              f"(start to READY, {c['n']} samples)"), flush=True)

    rt, problems = runtime_for(args.runtime, args.types)
    if problems:
        print(json.dumps({"error": "; ".join(problems), "runtime": args.runtime}))
        return 1
    rows = []
    print(f"\nruntime {args.runtime}, {args.slots} worker slots, {args.types} container types (one per function)")
    print(f"{'tasks':>6} {'dur s':>6} | {'warm s':>8} {'cold':>5} | {'random s':>9} {'cold':>5} | {'reduction':>9}")
    for dur in durations:
        for n in batches:
            rng = random.Random(args.seed * 1000003 + n)
            types = [f"fn{rng.randrange(args.types)}" for _ in range(n)]
            batch = [(t, work, (dur,)) for t in types]
            w = run_once(rt, args.slots, "warm", batch, args.seed)
            r = run_once(rt, args.slots, "random", batch, args.seed)
            red = 100.0 * (1 - w["completion_s"] / r["completion_s"]) if r["completion_s"] else None
            rows.append({"tasks": n, "duration_s": dur, "warm": w, "random": r,
                         "reduction_pct": round(red, 1) if red is not None else None})
            print(f"{n:>6} {dur:>6g} | {w['completion_s']:>8.2f} {w['cold_starts']:>5} | "
                  f"{r['completion_s']:>9.2f} {r['cold_starts']:>5} | {red:>8.1f}%", flush=True)
    reds = [row["reduction_pct"] for row in rows if row["reduction_pct"] is not None]
    summary = {
        "benchmark": "warming", "runtime": args.runtime, "slots": args.slots, "types": args.types,
        "batches": batches, "durations_s": durations, "seed": args.seed,
        "cold_start": cold, "results": rows,
        "max_reduction_pct": max(reds) if reds else None,
        "min_reduction_pct": min(reds) if reds else None,
        "mean_reduction_pct": round(statistics.mean(reds), 1) if reds else None,
        "warm_cold_starts_total": sum(row["warm"]["cold_starts"] for row in rows),
        "random_cold_starts_total": sum(row["random"]["cold_starts"] for row in rows),
        "funcx_reported_max_reduction_pct": 61,
    }
    print(f"\ncompletion time reduction, warming-aware vs random: max {summary['max_reduction_pct']}%, "
          f"mean {summary['mean_reduction_pct']}%, min {summary['min_reduction_pct']}% (funcX: up to 61%)")
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
