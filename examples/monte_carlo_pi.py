"""`make demo`: estimate pi with Monte Carlo tasks on the embedded default.

Starts the embedded service and the local endpoint when they are not running
(`skyfn local up --detach`), maps the sampling function over 1,000+ tasks through the
concurrent.futures Executor with a progress bar, then prints the estimate, the task
count, the wall time and the median latency of each stage read back from the task
events (service, queue wait, dispatch, run, return), then the round trip of interactive
calls through the service and in a direct session with the agent, and ends by writing the report of
the run (`--report DIR`, default ./skyfn-report: PNGs and report.html) and saying where.
"""
from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path


def sample(n: int, seed: int) -> int:
    """Points of the unit square (seeded) that fall inside the quarter circle."""
    import random

    rng = random.Random(seed)
    hits = 0
    for _ in range(n):
        x, y = rng.random(), rng.random()
        if x * x + y * y <= 1.0:
            hits += 1
    return hits


def ensure_local_service() -> bool:
    """Start the embedded runtime unless it is up; True when this call started it."""
    from skyfn.client import Client

    try:  # one quick try: a runtime left stopped must not cost the SDK's minute of retries
        with Client(retries=0, timeout=5) as client:
            client.endpoint_id("local")
        return False
    except Exception:
        pass
    print("starting the embedded service and the local endpoint (skyfn local up --detach) ...", flush=True)
    subprocess.run([sys.executable, "-m", "skyfn.cli", "local", "up", "--detach"], check=True)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=20_000, help="points per task")
    parser.add_argument("--keep", action="store_true", help="leave the service running afterwards")
    parser.add_argument("--report", default="skyfn-report", help="where the report of the run is written")
    args = parser.parse_args()

    started = ensure_local_service()
    from skyfn import Client, Executor

    client = Client()
    started_at = time.time()
    try:
        t0 = time.perf_counter()
        with Executor(endpoint="local", client=client, progress=True) as ex:
            futures = [ex.submit(sample, args.samples, seed) for seed in range(args.tasks)]
            hits = sum(f.result() for f in futures)
        wall = time.perf_counter() - t0
        points = args.tasks * args.samples
        estimate = 4.0 * hits / points
        print(f"\npi ~= {estimate:.6f}  (error {abs(estimate - math.pi):.6f}, {points:,} points)")
        print(f"tasks: {args.tasks}   wall time: {wall:.2f} s   throughput: {args.tasks / wall:.0f} tasks/s")
        stages = client.stage_latencies([f.task_id for f in futures])
        print("median latency per stage (ms), read back from task events:")
        for name, values in stages.items():
            if values:
                print(f"  {name:<11} {1000 * statistics.median(values):8.2f}")
        # interactive calls, one at a time: through the service, then in a direct session
        # with the agent (the service authorizes the session and records every task)
        rtts = {}
        for mode in ("service", "direct"):
            with Executor(endpoint="local", client=client, direct=mode == "direct") as ex:
                ex.submit(sample, 10, 0).result()  # connected and warm
                times = []
                for seed in range(50):
                    t = time.perf_counter()
                    ex.submit(sample, 10, seed).result()
                    times.append(1000 * (time.perf_counter() - t))
            rtts[mode] = statistics.median(times)
        print(f"\ninteractive round trip (median of 50): {rtts['service']:.2f} ms through the service, "
              f"{rtts['direct']:.2f} ms in a direct session (Executor(direct=True))")
        # the pictures of this run, from the same events (skyfn report; DESIGN.md 11)
        out = Path(args.report).resolve()
        report = client.report(since=started_at - 1, endpoint="local", html=out / "report.html", png_dir=out)
        print(f"\nreport of this run: {report.html}  (figures: {', '.join(p.name for p in report.pngs.values())} "
              f"in {out})")
    finally:
        if started and not args.keep:
            subprocess.run([sys.executable, "-m", "skyfn.cli", "local", "down"], check=False)


if __name__ == "__main__":
    main()
