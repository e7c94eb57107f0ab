"""funcX's container-warming experiment (section 6.2), scaled to this machine, on the agent.

    .venv/bin/python -m benchmarks.warming [--json] [--mode agent|harness]
        [--runtime podman|bubblewrap] [--slots 4] [--types 10] [--batches 25,50,100]
        [--durations 0,0.1,0.5] [--seed 1] [--cold-samples 8]

10 functions each need their own container type; a batch of tasks is drawn uniformly at
random over the types; there are fewer worker slots (default 4) than types, so not every
type can stay warm. Each (batch size, duration) is run twice on the same batch, each time
from a cold pool, once per routing policy.

--mode agent (default): the real endpoint agent. A redis-server (infra.local.processes)
holds the endpoint's task/results streams; `python -m endpoint_agent start bench
--foreground` runs with its queues configured directly, `workers: <slots>`, and
`containers: {runtime, routing: warm|random, routing_seed, types: {fn0..fn9: {image: host}}}`
(a fresh agent per run: every run starts with plain workers and no warm container). The
batch is one TaskPack whose tasks name their type in `container`; the function is
sleep(duration). Completion time: from pushing the pack to the last result read back from
the results stream. Cold starts: the agent's status.json (the managers' heartbeat count).
- routing warm: the manager's warming-aware placement (an idle worker warm for the type;
  else an idle worker of another type is restarted, LRU and types over their share first);
- routing random: the manager binds each task to a slot drawn at random and it waits for
  that slot; a slot whose worker is of another type is restarted as the task's type.

--mode harness: the process-level harness (endpoint_agent.containers.harness.ContainerPool:
this process plays the manager, endpoint_agent.containers.warm_pool decides), as before.

Reported: completion time of the batch, cold starts, and the reduction of completion time
(funcX reported up to 61%). Containers are real: every worker is `endpoint_agent.manager.worker`
inside a container started by the runtime (default podman: `podman run --rm --rootfs
<skeleton> --network host`, the host's /usr and Python bound read-only; a cold start is
container creation + interpreter start + imports until the worker's READY). The cold-start
time of each real runtime (and of a plain process) is measured first (harness, one at a time).

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
import tempfile
import time
from pathlib import Path

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


class AgentBench:
    """A redis-server and the endpoint's queues; one fresh agent per run."""

    def __init__(self, runtime: str, slots: int, types: int, seed: int, prefetch: int | None = None):
        from infra.local.processes import start_redis
        from tests.agent.conftest import Queues

        self.tmp = tempfile.TemporaryDirectory(prefix="skyfn-warming-")
        self.dir = Path(self.tmp.name)
        self.redis = start_redis(self.dir / "redis", appendonly=False)
        self.q = Queues(self.redis.url, "warming")
        self.runtime, self.slots, self.types, self.seed, self.prefetch = runtime, slots, types, seed, prefetch
        self.runs = 0

    def close(self) -> None:
        for qq in (self.q.tasks, self.q.results, self.q.control):
            qq.close()
        self.redis.stop()
        self.tmp.cleanup()

    def __enter__(self) -> "AgentBench":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, routing: str, types: list[str], dur: float) -> dict:
        from skyfn.protocol.messages import TaskPack, TaskSpec
        from skyfn.protocol.serialize import pack_args, serialize_function
        from tests.agent.conftest import AgentProc

        self.runs += 1
        cfg = {"workers": self.slots, "endpoint_id": "ep", "task_queue": self.q.task_desc,
               "results_queue": self.q.results_desc, "control_queue": self.q.control_desc,
               "receive_wait": 0.5, "log_level": "INFO", "manager_heartbeat_period": 0.2,
               "containers": {"runtime": self.runtime, "routing": routing, "routing_seed": self.seed,
                              "idle_timeout": 600,
                              "types": {f"fn{i}": {"image": "host"} for i in range(self.types)}}}
        if self.prefetch is not None:
            cfg["manager_prefetch"] = self.prefetch
        agent = AgentProc(self.dir / f"home{self.runs}", "bench", cfg)
        agent.start(wait_workers=self.slots)
        try:
            prefix = f"r{self.runs}-"
            specs = [TaskSpec(task_id=f"{prefix}{i}", function_id="work", payload=pack_args((dur,), {}),
                              container=t) for i, t in enumerate(types)]
            pack = TaskPack(pack_id=f"{prefix}pack", endpoint_id="ep", functions={"work": serialize_function(work)},
                            tasks=specs)
            ids = [sp.task_id for sp in specs]
            t0 = time.monotonic()
            self.q.send([pack.model_dump_json().encode()], [ids])
            res = self.q.collect(ids, timeout=1800)
            elapsed = time.monotonic() - t0
            bad = [r[-1] for r in res.values() if r[-1]["state"] != "SUCCEEDED"]
            if bad:
                raise RuntimeError(f"{len(bad)} task(s) failed, e.g. {json.dumps(bad[0])[:600]}")
            done = time.time()   # status.json is rewritten every 2 s; the managers heartbeat every 0.2 s
            st = agent.wait_status(lambda s: s.get("updated", 0) > done + 0.5, timeout=30)
        finally:
            rc = agent.terminate(60)
        if rc != 0:
            raise RuntimeError(f"agent exited {rc}: {agent.tail()}")
        return {"completion_s": round(elapsed, 3), "cold_starts": st["cold_starts"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks.warming")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--mode", default="agent", choices=["agent", "harness"],
                    help="agent: the real endpoint agent (default); harness: this process as the manager")
    ap.add_argument("--prefetch", type=int, default=None, help="agent mode: manager_prefetch (default 2 * slots)")
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
    for name, exe in (() if args.cold_samples <= 0 else  (("none", None), ("bubblewrap", "bwrap"), ("podman", "podman"))):
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
    bench = AgentBench(args.runtime, args.slots, args.types, args.seed, args.prefetch) if args.mode == "agent" else None
    print(f"\n{args.mode}: runtime {args.runtime}, {args.slots} worker slots, {args.types} container types "
          f"(one per function)")
    print(f"{'tasks':>6} {'dur s':>6} | {'warm s':>8} {'cold':>5} | {'random s':>9} {'cold':>5} | {'reduction':>9}")
    t_start = time.monotonic()
    try:
        for dur in durations:
            for n in batches:
                rng = random.Random(args.seed * 1000003 + n)
                types = [f"fn{rng.randrange(args.types)}" for _ in range(n)]
                if bench is not None:
                    w = bench.run("warm", types, dur)
                    r = bench.run("random", types, dur)
                else:
                    batch = [(t, work, (dur,)) for t in types]
                    w = run_once(rt, args.slots, "warm", batch, args.seed)
                    r = run_once(rt, args.slots, "random", batch, args.seed)
                red = 100.0 * (1 - w["completion_s"] / r["completion_s"]) if r["completion_s"] else None
                rows.append({"tasks": n, "duration_s": dur, "warm": w, "random": r,
                             "reduction_pct": round(red, 1) if red is not None else None})
                print(f"{n:>6} {dur:>6g} | {w['completion_s']:>8.2f} {w['cold_starts']:>5} | "
                      f"{r['completion_s']:>9.2f} {r['cold_starts']:>5} | {red:>8.1f}%", flush=True)
    finally:
        if bench is not None:
            bench.close()
    reds = [row["reduction_pct"] for row in rows if row["reduction_pct"] is not None]
    summary = {
        "benchmark": "warming", "mode": args.mode, "runtime": args.runtime, "slots": args.slots, "types": args.types,
        "batches": batches, "durations_s": durations, "seed": args.seed,
        "cold_start": cold, "results": rows,
        "max_reduction_pct": max(reds) if reds else None,
        "min_reduction_pct": min(reds) if reds else None,
        "mean_reduction_pct": round(statistics.mean(reds), 1) if reds else None,
        "warm_cold_starts_total": sum(row["warm"]["cold_starts"] for row in rows),
        "random_cold_starts_total": sum(row["random"]["cold_starts"] for row in rows),
        "funcx_reported_max_reduction_pct": 61,
        "grid_wall_s": round(time.monotonic() - t_start, 1),
    }
    print(f"\ncompletion time reduction, warming-aware vs random: max {summary['max_reduction_pct']}%, "
          f"mean {summary['mean_reduction_pct']}%, min {summary['min_reduction_pct']}% (funcX: up to 61%)")
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
