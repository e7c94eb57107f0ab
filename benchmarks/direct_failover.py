"""How long a direct session takes to hand its tasks to the service when the agent is killed.

    python -m benchmarks.direct_failover [--json] [--reps 3] [--tasks 3000]

Starts its own embedded runtime (private SKYFN_HOME, 2 workers, direct sessions on). Each
repetition opens a direct session (``Executor(direct=True)``, ``direct_timeout`` 5 s), starts
a map of ``--tasks`` 2 ms tasks, and once 200 have finished SIGKILLs the agent and every
process under it. It measures the time from the kill to the session's loss (its tasks in
flight handed to the service: ``direct_stats["lost"]``), then restarts the agent and checks
that every task resolved once with its value. Before the socket monitor (skyfn/executor/direct.py)
the loss was seen only after ``direct_timeout`` of silence.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import time
from pathlib import Path


def slow(x):
    import time as _t

    _t.sleep(0.002)
    return x


def failover_once(home: Path, tasks: int) -> tuple[float, str]:
    import psutil

    from infra.local import agent
    from skyfn import Executor

    with Executor(endpoint="local", direct=True, direct_timeout=5.0) as ex:
        deadline = time.monotonic() + 60
        while True:  # a session on the running agent (after a restart: once it published its socket)
            ex.submit(slow, 0).result(timeout=60)
            if ex.direct_stats["results"]:
                break
            assert time.monotonic() < deadline, ex.direct_stats
            time.sleep(0.5)
        futures = [ex.submit(slow, i) for i in range(tasks)]
        while sum(f.done() for f in futures) < 200:
            time.sleep(0.005)
        pid = int(agent.pidfile(home, "local").read_text().split()[0])
        family = [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        while ex.direct_stats["lost"] == 0:
            time.sleep(0.002)
        seen = time.monotonic() - t0
        psutil.wait_procs([psutil.Process(p) for p in family if psutil.pid_exists(p)], timeout=15)
        agent.start("local", home)
        assert [f.result(timeout=120) for f in futures] == list(range(tasks))
        return seen, ex.direct_stats.get("last_loss") or "silence"


def main() -> None:
    from benchmarks.embedded import embedded_runtime

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=3000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    seen = []
    with embedded_runtime("skyfn-failover-", {"workers": 2, "direct": {"listen": "127.0.0.1"}}) as home:
        for _ in range(args.reps):
            s, why = failover_once(home, args.tasks)
            seen.append(s)
            print(f"SIGKILL -> tasks in flight handed to the service: {s:.3f} s ({why})", flush=True)
    result = {"reps": args.reps, "failover_s": [round(s, 3) for s in seen],
              "failover_p50_s": round(statistics.median(seen), 3)}
    print(f"median {result['failover_p50_s']:.3f} s")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
