"""Where one task's round trip goes on this machine, part by part, with Parsl HTEX's in the
same run: the floor under ``rtt_p50_ms`` (benchmarks/e2e.py).

    python -m benchmarks.rtt_floor [--json] [--n 300] [--no-parsl]

Each figure is the p50 of ``--n`` calls made one after another, as the round-trip
benchmark makes them: every process on the path is idle when its turn comes. "hot" rows
are the same calls back to back with nothing else running, "idle" rows with 3 ms of
pause between calls (the pause a 3-8 ms round trip leaves each process).

- ``hop``: one message between two processes (ZeroMQ over ipc, half a ping-pong): the
  least a process boundary costs here, before any work;
- ``lambda_env``: one invocation of a trivial handler in the embedded runtime's Lambda
  environment (infra/local/standins/lambda_pool.py: the gateway's hand-over to a handler process);
- ``gateway_static`` / ``gateway_whoami``: GET /ui/ answered by the local gateway itself,
  and GET /whoami through it and the API function (token check, rate limit, routing):
  the cost of any request before it does anything;
- ``push_stages``: a single task with the results push (``Executor.submit().result()``),
  stage by stage from its own events: SDK -> CREATED (the request through the gateway to
  the API function), -> QUEUED, -> DISPATCHED (Redis stream -> agent), -> RUNNING
  (interchange -> manager -> worker), -> DONE, -> SUCCEEDED (worker -> manager ->
  interchange -> results stream -> results function), -> future resolved (push hub ->
  WebSocket -> the Executor's thread);
- ``direct``: the same call in a direct session (SDK -> interchange -> manager -> worker);
- ``parsl_htex``: Parsl HighThroughputExecutor's round trip (2 workers), same run.

Starts its own embedded runtime (private SKYFN_HOME) and stops it. The last line printed
is one JSON object (with --json).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

IDLE_PAUSE_S = 0.003


def trivial_handler(event, context):
    """The handler of the lambda_env row (imported by the Lambda environment process)."""
    return {"statusCode": 200, "body": "{}"}


def noop(x):
    return x


def p50_ms(call, n: int, pause: float = 0.0) -> float:
    for _ in range(min(20, n)):
        call()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1000)
        if pause:
            time.sleep(pause)
    return round(statistics.median(times), 3)


def zmq_hop(n: int) -> dict:
    """Half a ping-pong between this process and a child over ZeroMQ ipc."""
    import zmq

    address = f"ipc://@skyfn-rtt-floor-{os.getpid()}"
    pid = os.fork()
    if pid == 0:  # the echo process
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PAIR)
        sock.connect(address)
        while (msg := sock.recv()) != b"stop":
            sock.send(msg)
        os._exit(0)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.bind(address)

    def once():
        sock.send(b"x")
        sock.recv()

    try:
        return {"hot": round(p50_ms(once, n) / 2, 3), "idle": round(p50_ms(once, n, IDLE_PAUSE_S) / 2, 3)}
    finally:
        sock.send(b"stop")
        os.waitpid(pid, 0)
        sock.close(0)
        ctx.term()


def lambda_env(n: int) -> dict:
    from infra.local.standins.lambda_pool import LambdaPool

    pool = LambdaPool("benchmarks.rtt_floor:trivial_handler", min_workers=1, max_workers=1).start()
    event = {"httpMethod": "GET", "path": "/", "headers": {"Authorization": "Bearer " + "x" * 600}, "body": None}
    try:
        def once():
            pool.invoke(event, "floor", 30, "r")
        return {"hot": p50_ms(once, n), "idle": p50_ms(once, n, IDLE_PAUSE_S)}
    finally:
        pool.close()


def gateway(client, n: int) -> dict:
    http = client._http
    out = {}
    for name, path in (("gateway_static", "/ui/"), ("gateway_whoami", "/whoami")):
        def once(path=path):
            resp = http.pool.request("GET", http.base_url + path, headers=http.headers)
            assert resp.status == 200, (path, resp.status)
        out[name] = {"hot": p50_ms(once, n), "idle": p50_ms(once, n, IDLE_PAUSE_S)}
    return out


def push_stages(n: int) -> dict:
    """Per-stage p50 (ms) of single pushed round trips, from each task's events."""
    from skyfn import Client, Executor
    from skyfn.report.analysis import stamps

    order = ("CREATED", "QUEUED", "DISPATCHED", "RUNNING", "DONE", "SUCCEEDED")
    rows = []
    with Executor(endpoint="local", push=True) as ex:
        for i in range(20):
            ex.submit(noop, i).result(timeout=30)
        for i in range(n):
            t0 = time.time()
            fut = ex.submit(noop, i)
            assert fut.result(timeout=30) == i
            rows.append((fut.task_id, t0, time.time()))
    stages: dict[str, list[float]] = {}
    with Client() as client:
        for tid, t0, t1 in rows:
            s = stamps(client.get_task(tid, peek=True).get("events") or [])
            points = [("SDK", t0)] + [(k, s[k]) for k in order if k in s] + [("resolved", t1)]
            for (a, ta), (b, tb) in zip(points, points[1:]):
                stages.setdefault(f"{a}->{b}", []).append((tb - ta) * 1000)
    out = {k: round(statistics.median(v), 3) for k, v in stages.items()}
    out["total"] = round(statistics.median([(t1 - t0) * 1000 for _, t0, t1 in rows]), 3)
    return out


def direct_rtt(n: int) -> float:
    from skyfn import Executor

    with Executor(endpoint="local", direct=True) as ex:
        def once():
            ex.submit(noop, 1).result(timeout=30)
        rtt = p50_ms(once, n)
        assert ex.direct_stats["results"] >= n, ex.direct_stats
    return rtt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300, help="calls per figure")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-parsl", action="store_true", help="skip Parsl HTEX")
    args = ap.parse_args()
    from benchmarks.embedded import embedded_runtime
    from skyfn import Client

    result: dict = {"n": args.n, "hop": zmq_hop(args.n), "lambda_env": lambda_env(args.n)}
    with embedded_runtime("skyfn-rtt-floor-", {"workers": 2, "direct": {"listen": "127.0.0.1"}}):
        with Client() as client:
            result.update(gateway(client, args.n))
        result["push_stages"] = push_stages(args.n)
        result["direct"] = direct_rtt(args.n)
    if not args.no_parsl:
        from benchmarks.e2e import bench_parsl

        # HTEX's workers unpickle benchmarks.e2e.noop by reference: they must import this checkout
        root = str(Path(__file__).resolve().parents[1])
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)

        htex = bench_parsl(200, args.n)
        result["parsl_htex"] = round(htex["rtt_p50_ms"], 3) if htex else None
        if htex:
            result["push_over_htex"] = round(result["push_stages"]["total"] / htex["rtt_p50_ms"], 2)
            result["direct_over_htex"] = round(result["direct"] / htex["rtt_p50_ms"], 2)
    print(f"one process hop (ZeroMQ ipc)        hot {result['hop']['hot']:6.3f} ms   idle {result['hop']['idle']:6.3f} ms")
    print(f"one Lambda environment invocation   hot {result['lambda_env']['hot']:6.3f} ms   "
          f"idle {result['lambda_env']['idle']:6.3f} ms")
    for key in ("gateway_static", "gateway_whoami"):
        print(f"{key:<35} hot {result[key]['hot']:6.3f} ms   idle {result[key]['idle']:6.3f} ms")
    print("push round trip, stage by stage (p50):")
    for key, value in result["push_stages"].items():
        print(f"  {key:<33} {value:7.3f} ms")
    print(f"direct session round trip           {result['direct']:7.3f} ms")
    if result.get("parsl_htex") is not None:
        print(f"Parsl HTEX round trip               {result['parsl_htex']:7.3f} ms   "
              f"(push {result['push_over_htex']}x, direct {result['direct_over_htex']}x)")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
