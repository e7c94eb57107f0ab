"""A fleet's worth (issue 39): N endpoints and M users on one embedded runtime, as a ladder.

    python -m benchmarks.fleet --json [--rungs 10,100,1000] [--users 10,30,100] [--minutes 2]
        [--rate 100] [--zipf 1.5] [--churn [--churn-minutes 10] [--churn-rate 10]]

Each rung (N endpoints, M users; default N = 10, 100, 1,000 with M = 10, 30, 100) runs on a
fresh private embedded runtime, step by step as benchmarks/fleet_rung.py describes: a base
window with no endpoint, the fleet started (light agents, endpoint_agent/light, N/250
per fleet host process: benchmarks/fleet_hosts.py, benchmarks/fleet_agents.py), registered
and online, a settle period, an idle window (nothing submitted), then a load window with M
users submitting at a fixed total rate to Zipf-drawn endpoints (benchmarks/fleet_load.py)
while two probes time round trips on the busiest endpoint and on an endpoint no load goes
to, and a few other unloaded endpoints are stopped and restarted for the heartbeat-to-online
lag. What is read and how each figure is derived: benchmarks/fleet_sample.py and
benchmarks/fleet_rung.py.

The rate: 100 tasks/s by default, half no-op and half 10 ms (`sleep10`), at every rung: what
one fleet host's shared thread pool and the service on 2 cores carry at N = 1,000 with
room to spare, so the rungs differ in N and M only. Agents use the agent's defaults
(heartbeat_period 10 s, lease_seconds 60, a 20 s long poll: receive_wait, SQS's
longest, the agent's default since 2026-12-07): an idle agent's queues then cost the fleet host,
Redis and (on AWS) SQS a twentieth of what they do at 1 s, and a new task still wakes the
poll at once (XREAD BLOCK returns on the entry). `--receive-wait 1` measures the default:
at 1 s an idle endpoint's two queues make ~24 Redis commands/s on the embedded runtime
(2 FCALL receives and one XREAD BLOCK per queue per second, the commands inside counted)
and 1,000 such agents take more than one of this machine's 2 cores in their hosts alone.

The last line with --json holds
- `p99_rtt_over_n10_busy`, `p99_rtt_over_n10_idle`: the probes' p99 at the largest rung
  (N = 1,000) over the smallest (N = 10) (`ratio_rungs` names the two);
- `cpu_per_task_over_n10`: service CPU per task, the same two rungs;
- `idle_endpoint_redis_ops_per_s`: Redis commands per second one more idle endpoint adds
  (the idle windows' rates, largest rung less smallest over their N difference: the
  runtime's fixed work cancels out), every command, the commands inside Lua functions
  included (INFO commandstats counts them) and the queues' long polls too (Redis streams
  here, SQS on AWS); `idle_endpoint_store_ops_per_s` the hot store's alone and
  `idle_endpoint_queue_ops_per_s` the queues' (fleet_sample.queue_calls says how they are
  told apart); `idle_endpoint_service_cpu_ms_per_min` the same for the service's CPU;
- `idle_endpoint_redis_bytes`: the hot store's bytes per idle endpoint (MEMORY USAGE of the
  keys, the queues' streams left out as on AWS) at the largest rung;
  `idle_endpoint_queue_bytes` the streams';
- `redis_mb_per_1000_endpoints`: the least-squares slope of Redis used_memory growth
  (idle fleet over no fleet) against N over the rungs, per 1,000 endpoints;
- `rungs`: every figure per rung; with --churn `churn_lost`, `churn_duplicates`,
  `churn_unresolved` and `churn` (benchmarks/fleet_churn.py).
`--rungs ""` with --churn runs the churn alone. A rung that cannot start carries `error`.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/fleet.py`
    sys.path.insert(0, str(ROOT))

from benchmarks.fleet_churn import run_churn  # noqa: E402
from benchmarks.fleet_rung import run_rung  # noqa: E402

DEFAULT_USERS = {10: 10, 100: 30, 1000: 100}
GOALS = {"p99_rtt_over_n10_busy": "<= 1.5", "p99_rtt_over_n10_idle": "<= 1.5", "cpu_per_task_over_n10": "<= 1.2",
         "idle_endpoint_redis_ops_per_s": "<= 2", "idle_endpoint_redis_bytes": "<= 2048"}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.replace("_", "").split(",") if x.strip()]


def users_for(n: int, given: list[int], k: int) -> int:
    if given:
        return given[min(k, len(given) - 1)]
    if n in DEFAULT_USERS:
        return DEFAULT_USERS[n]
    return max(1, min(100, round(10 * (n / 10) ** 0.5)))  # 10, 30ish, 100 along the default ladder


def ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def slope_mb_per_1000(rungs: list[dict]) -> float | None:
    pts = [(r["n"], r["redis_used_mb_idle"] - r["redis_used_mb_base"]) for r in rungs
           if r.get("redis_used_mb_idle") is not None]
    if not pts:
        return None
    if len(pts) == 1:
        return round(pts[0][1] / pts[0][0] * 1000, 2)
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return round(sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx * 1000, 2) if sxx else None


def marginal(rungs: list[dict], key: str) -> float | None:
    """What one more idle endpoint adds to a whole-runtime rate: (rate at the largest rung
    - at the smallest) / (N difference); with one rung, (rate - the no-fleet rate) / N."""
    if not rungs:
        return None
    lo, hi = min(rungs, key=lambda r: r["n"]), max(rungs, key=lambda r: r["n"])
    if hi["n"] == lo["n"]:
        return hi.get(key.replace("_per_s", "_per_endpoint_s"))
    return round((hi[key] - lo[key]) / (hi["n"] - lo["n"]), 3)


def cpu_marginal(rungs: list[dict]) -> float | None:
    """Service CPU ms per minute that one more idle endpoint adds (as `marginal`)."""
    if len(rungs) < 2:
        return rungs[0].get("idle_service_cpu_ms_per_endpoint_min") if rungs else None
    lo, hi = min(rungs, key=lambda r: r["n"]), max(rungs, key=lambda r: r["n"])
    d = hi["service_cpu_percent_idle"] - lo["service_cpu_percent_idle"]
    return round(d / 100 * 60e3 / (hi["n"] - lo["n"]), 3)


def summary(rungs: list[dict]) -> dict:
    ok = [r for r in rungs if "error" not in r]
    out: dict = {"ratio_rungs": None, "p99_rtt_over_n10_busy": None, "p99_rtt_over_n10_idle": None,
                 "cpu_per_task_over_n10": None}
    if len(ok) >= 2:
        lo, hi = min(ok, key=lambda r: r["n"]), max(ok, key=lambda r: r["n"])
        out.update({"ratio_rungs": [lo["n"], hi["n"]],
                    "p99_rtt_over_n10_busy": ratio(hi["busy"]["p99_ms"], lo["busy"]["p99_ms"]),
                    "p99_rtt_over_n10_idle": ratio(hi["idle"]["p99_ms"], lo["idle"]["p99_ms"]),
                    "cpu_per_task_over_n10": ratio(hi.get("service_cpu_us_per_task"), lo.get("service_cpu_us_per_task"))})
    top = max(ok, key=lambda r: r["n"]) if ok else {}
    out.update({"idle_endpoint_redis_ops_per_s": marginal(ok, "idle_redis_ops_per_s"),
                "idle_endpoint_store_ops_per_s": marginal(ok, "idle_redis_store_ops_per_s"),
                "idle_endpoint_queue_ops_per_s": marginal(ok, "idle_redis_queue_ops_per_s"),
                "idle_endpoint_service_cpu_ms_per_min": cpu_marginal(ok),
                "idle_endpoint_redis_bytes": top.get("idle_store_bytes_per_endpoint"),
                "idle_endpoint_queue_bytes": top.get("idle_queue_bytes_per_endpoint"),
                "redis_mb_per_1000_endpoints": slope_mb_per_1000(ok)})
    return out


def parse(argv: list[str] | None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.fleet", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print the JSON summary as the last line")
    p.add_argument("--rungs", default="10,100,1000", help="endpoints per rung, comma-separated ('' with --churn: none)")
    p.add_argument("--users", default="", help="users per rung (default 10, 30, 100 for N = 10, 100, 1,000)")
    p.add_argument("--minutes", type=float, default=2.0, help="length of each rung's idle and load windows")
    p.add_argument("--base-s", type=float, default=None, help="the no-fleet window (default: a third of a window, 10-40 s)")
    p.add_argument("--settle", type=float, default=None, help="seconds after the fleet is online (default 2 heartbeats + 5)")
    p.add_argument("--warm", type=float, default=None, help="seconds of load before its window (default 10, less if short)")
    p.add_argument("--rate", type=float, default=100.0, help="total tasks/s of the load (default 100)")
    p.add_argument("--zipf", type=float, default=1.5, help="the Zipf exponent of the endpoints' draw (default 1.5)")
    p.add_argument("--batch", type=int, default=10, help="tasks per user submission (sets the users' tick)")
    p.add_argument("--probe-period", type=float, default=1.0)
    p.add_argument("--per-host", type=int, default=250, help="agents per fleet host process (default 250)")
    p.add_argument("--threads", type=int, default=8, help="each host's shared pool threads")
    p.add_argument("--concurrency", type=int, default=8, help="agents of a host registering at once")
    p.add_argument("--heartbeat-period", type=float, default=10.0, help="the agents' (default 10 s, the agent's)")
    p.add_argument("--receive-wait", type=float, default=20.0,
                   help="the agents' long poll (default 20 s, SQS's longest; the agent's default is 1 s)")
    p.add_argument("--lease-seconds", type=float, default=60.0)
    p.add_argument("--heartbeat-timeout", type=float, default=None,
                   help="the service's SKYFN_HEARTBEAT_TIMEOUT (default: the runtime's, 30 s)")
    p.add_argument("--lag-endpoints", type=int, default=3, help="endpoints stopped and restarted for the online lag")
    p.add_argument("--lag-timeout", type=float, default=150.0)
    p.add_argument("--start-timeout", type=float, default=900.0, help="for a rung's fleet to be up and online")
    p.add_argument("--drain-timeout", type=float, default=180.0)
    p.add_argument("--churn", action="store_true", help="also run the churn (benchmarks/fleet_churn.py)")
    p.add_argument("--churn-minutes", type=float, default=10.0)
    p.add_argument("--churn-rate", type=float, default=10.0, help="endpoints SIGKILLed and restarted per minute")
    p.add_argument("--churn-endpoints", type=int, default=50)
    p.add_argument("--churn-batch", type=int, default=5, help="agents per churn host (killed together)")
    p.add_argument("--churn-users", type=int, default=10)
    p.add_argument("--churn-drain-timeout", type=float, default=300.0)
    p.add_argument("--keep-home", action="store_true", help="keep each runtime's SKYFN_HOME (logs)")
    args = p.parse_args(argv)
    args.window_s = args.minutes * 60.0
    if args.base_s is None:
        args.base_s = min(40.0, max(5.0, args.window_s / 3))
    if args.settle is None:
        args.settle = min(2 * args.heartbeat_period + 5, max(3.0, args.window_s / 2))
    if args.warm is None:
        args.warm = min(10.0, max(2.0, args.window_s / 4))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a rung's clean-up (runtime, hosts) still runs
    if args.heartbeat_timeout is not None:
        import os

        os.environ["SKYFN_HEARTBEAT_TIMEOUT"] = str(args.heartbeat_timeout)

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    started = datetime.now(timezone.utc)
    rungs = []
    for k, n in enumerate(_ints(args.rungs)):
        m = users_for(n, _ints(args.users), k)
        log(f"rung N={n} M={m}")
        rungs.append(run_rung(args, n, m, log))
        if "error" in rungs[-1]:
            log(f"rung N={n} failed: {rungs[-1]['error']}")
    result = {"benchmark": "fleet", "date": started.strftime("%Y-%m-%d %H:%M UTC"), **summary(rungs),
              "goals": GOALS, "rate": args.rate, "zipf": args.zipf, "minutes": args.minutes,
              "agent": {"heartbeat_period": args.heartbeat_period, "receive_wait": args.receive_wait,
                        "lease_seconds": args.lease_seconds, "per_host": args.per_host, "threads": args.threads}}
    if args.churn:
        churn = run_churn(args, log)
        result.update({k: churn.get(k) for k in ("churn_lost", "churn_duplicates", "churn_unresolved")})
        result["churn"] = churn
    result["rungs"] = rungs
    for r in rungs:
        if "error" in r:
            print(f"N={r['n']}: error: {r['error']}")
            continue
        print(f"N={r['n']} M={r['m']}: service CPU {r['service_cpu_us_per_task']} us/task, idle endpoint "
              f"{r['idle_service_cpu_ms_per_endpoint_min']} ms CPU/min, {r['idle_redis_ops_per_endpoint_s']} redis ops/s "
              f"({r['idle_redis_store_ops_per_endpoint_s']} store), {r['idle_store_bytes_per_endpoint']} B; "
              f"redis {r['redis_used_mb_idle']} MiB, {r['redis_connected_clients']} clients, "
              f"{r['gateway_connections_idle']} gateway conns; busy p50/p99 {r['busy']['p50_ms']}/{r['busy']['p99_ms']} ms, "
              f"idle {r['idle']['p50_ms']}/{r['idle']['p99_ms']} ms; lag {r['lag'].get('lag_p50_ms')} ms")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
