"""A multi-user endpoint (issue 23) on the embedded runtime: cold start, warm round trip,
throughput of many users, and the memory of an idle user agent.

    sudo .venv/bin/python benchmarks/multi_user.py [--json] [--users 10] [--tasks 1000] [--rtt 200]
                                                   [--repeat 3] [--workers 2] [--idle-wait 5] [--quick]
                                                   [--logs DIR]

(also `python -m benchmarks.multi_user`). With `--idle` it measures many idle users instead
(agents stopped and started again, lanes unbound and bound again, the privileged process's
idle CPU): benchmarks/multi_user_idle.py, `--users 200 --idle`. It must run as root, as a
site's privileged process does, and needs useradd, redis-server and /usr/bin/python3 of the
venv's minor version; otherwise it refuses with the reason (exit code 2).

Setup (all made here, all removed at the end, also after an error or Ctrl-C/SIGTERM):

- the embedded runtime (`infra.local.runtime.up(home, detach=True, endpoint=False)`) in a
  private SKYFN_HOME;
- `--users` fresh local accounts (tests/multiuser.py LocalAccounts: `useradd -m`, removed
  with `userdel -r`) and a shared interpreter (tests/multiuser.py shared_python_copy:
  /usr/bin/python3 with a PYTHONPATH every account can read; the venv lives under /root);
- one multi-user endpoint `mu` (write_multi_user_files, then: the shared interpreter as
  user_agent_python, an expression rule mapping `<account>@users.example.org` to the
  account, a user config template of `workers: --workers` and a data Redis started by each
  user agent; every other setting is the default), its privileged process started as root
  with `python -m endpoint_agent start mu --foreground`, shared with `all-users`;
- one ordinary single-user endpoint `su` with the same agent config (the same worker count
  and data Redis) and the same interpreter and PYTHONPATH as the user agents, started as
  root with `python -m endpoint_agent start su --foreground`, owned by the first user.

Every skyfn user has a token with the email of its account. Tasks are a no-op
(`return x`), registered once per user before anything is timed, and submitted with the
SDK's Executor (results push on), one Executor per user and endpoint.

Figures (JSON keys; goals from issue 23's "What must be shown"):

- `cold_start_first_result_s` (goal <= 1.5): the median over the users of the time from
  submitting a user's first task to its result while no user agent of theirs runs: the
  router maps the identity, renders the config, starts the user agent as the account,
  which starts its data redis-server, its interchange, its manager and workers, takes the
  task and returns the result through the router. Users are started one after another,
  each after one task of theirs on the single-user endpoint (so the service's side of
  every user is warm: what is timed is the endpoint's cold start, plus the Executor's
  first connection). `cold_start_samples_s`: each; `cold_start_service_s`: the median of
  CREATED -> STORED from the tasks' events (the Executor's part left out);
  `cold_start_breakdown_ms`: the median of where the time went, read from the logs of the
  privileged process, of the user agent (router/agents/<key>.log) and of its data
  redis-server: `spawn` (submit -> the router has started the user agent process: the
  service, the router's receive, mapping, account checks, working directory, fork/exec),
  `boot` (-> the agent executes redis-server: the interpreter, its imports, the config),
  `data_redis` (-> the agent has seen its data redis-server answer), `to_running` (->
  `endpoint ... running`: outbox, interchange, managers started), `first_result` (-> the
  result is back here: the manager and its workers start, the task runs, the result
  travels back through the router and the service).
- `warm_rtt_over_single_user` (goal <= 1.1): the median round trip of one task
  (submit -> result, one at a time, `--rtt` samples after a warm-up) through the
  multi-user endpoint with the user agent warm, over the same through the single-user
  endpoint. The samples alternate between the two endpoints, so load from elsewhere on
  the machine falls on both alike. `warm_rtt_mu_ms` / `warm_rtt_su_ms`: p50 and p99.
- `ten_users_over_one_user` (goal >= 0.8): throughput (tasks/s, first submit to last
  result) of `--users` users x `--tasks` tasks submitted concurrently (one thread and one
  Executor per user, each user with a user agent of `--workers` workers) over that of
  one user x users*tasks tasks on the same endpoint (one user agent). After one untimed
  round of the many-user batch (the embedded service starts a Lambda environment when all
  are busy, infra/local/standins/lambda_pool.py: 10 concurrent users need more of them, and the
  first round paid for starting them), `--repeat` rounds alternate
  the two batches and the ratio is of their medians (`many_users_batch_s`,
  `one_user_batch_s`: each round).
- `idle_user_agent_rss_mb`: the median over the users' agents of the RSS summed over the
  user agent's process tree (the agent, its manager and workers, its data redis-server),
  `--idle-wait` seconds after its first task; `idle_user_agent_pss_mb` the same as PSS
  (shared pages counted once across the tree: what the tree really costs).

`--logs DIR` keeps the endpoints' and user agents' logs. `--quick` (3 users x 200 tasks,
40 round trips) runs in under a minute: tests/mu_endpoint/test_multi_user_benchmark.py.

`load_average` gives the machine's 1-minute load before and after: other work on the
machine (tests, builds) weighs on every figure here. With --json the last line printed
is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python benchmarks/multi_user.py`
    sys.path.insert(0, str(ROOT))

from benchmarks.multi_user_site import MU, SU, Site, problem  # noqa: E402

QUICK = {"users": 3, "tasks": 200, "rtt": 40, "idle_wait": 3.0}
GOALS = {"cold_start_first_result_s": "<= 1.5", "warm_rtt_over_single_user": "<= 1.1",
         "ten_users_over_one_user": ">= 0.8"}


def noop(x):
    return x


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# --- measurements -------------------------------------------------------------------------

def tree_memory(pid: int) -> tuple[float, float, int, dict[str, float]]:
    """(RSS MB, PSS MB, processes, RSS MB by kind of process) summed over the process tree of pid."""
    import psutil

    root = psutil.Process(pid)
    rss = pss = 0
    kinds: dict[str, float] = {}
    procs = [root] + root.children(recursive=True)
    for p in procs:
        try:
            info = p.memory_full_info()
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
        kind = ("agent" if p.pid == pid else "redis-server" if "redis-server" in cmd else
                "workers" if "endpoint_agent.manager.worker" in cmd else
                "manager" if "endpoint_agent.manager" in cmd else "other")
        kinds[kind] = kinds.get(kind, 0.0) + info.rss / 2**20
    return rss / 2**20, pss / 2**20, len(procs), {k: round(v, 1) for k, v in sorted(kinds.items())}


def _log_times(path: Path) -> list[tuple[float, str]]:
    """(epoch, line) of each timestamped line of an agent log (`%(asctime)s` with ms)."""
    out = []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        out.append((stamp, line))
    return out


def cold_breakdown(site: Site, ua: dict, submitted: float, done: float) -> dict[str, float]:
    """Where one cold start's time went (ms), from the privileged process's log and the user agent's."""
    marks = {"submitted": submitted}
    for stamp, line in _log_times(site.endpoint_dir(MU) / "agent-foreground.log"):
        if f"started user agent {ua['key']} " in line and stamp >= submitted - 0.01:
            marks["spawned"] = stamp
            break
    lines = _log_times(site.endpoint_dir(MU) / "router" / "agents" / f"{ua['key']}.log")
    redis_log = Path(os.path.expanduser(f"~{ua['account']}")) / ".skyfn" / "work" / "endpoints" / \
        f"{MU}.{ua['key']}" / "data" / "redis.log"
    try:
        for line in redis_log.read_text(errors="replace").splitlines():
            if "Redis is starting" in line or "Redis version" in line:  # `PID:C 26 Nov 2026 17:24:49.987 # ...`
                marks["redis_exec"] = datetime.strptime(" ".join(line.split()[1:5]), "%d %b %Y %H:%M:%S.%f").timestamp()
                break
    except (OSError, ValueError):
        pass
    for stamp, line in lines:
        if "data_redis" not in marks and "redis-server for the endpoint's data" in line:
            marks["data_redis"] = stamp
        if "running" not in marks and " running: " in line:
            marks["running"] = stamp
    marks["result"] = done
    order = [("spawn", "spawned"), ("boot", "redis_exec"), ("data_redis", "data_redis"), ("to_running", "running"),
             ("first_result", "result")]
    out, previous = {}, submitted
    for label, mark in order:
        if mark in marks:
            out[label] = round((marks[mark] - previous) * 1000, 1)
            previous = marks[mark]
    return out


def run_batch(executors: list, fids: list[str], n_each: int, timeout: float = 1800) -> float:
    """Seconds from the first submit to the last result of n_each tasks on each executor (a
    thread each, submitting fids[i] on executors[i])."""
    barrier = threading.Barrier(len(executors) + 1)
    errors: list[BaseException] = []

    def one(ex, fid):
        try:
            barrier.wait()
            futures = [ex.submit(fid, i) for i in range(n_each)]
            for f in futures:
                f.result(timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=pair, daemon=True) for pair in zip(executors, fids)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(executors)} submitters failed: {errors[0]!r}") from errors[0]
    return elapsed


def rtt_ms(ex, fid: str, ids: list[str] | None = None) -> float:
    t0 = time.perf_counter()
    fut = ex.submit(fid, 1)
    fut.result(timeout=120)
    elapsed = (time.perf_counter() - t0) * 1000
    if ids is not None:
        ids.append(fut.task_id)
    return elapsed


def stages_ms(client, task_ids: list[str], rtts: list[float]) -> dict[str, float]:
    """Median of each stage of these tasks' round trips (ms), from their events: service
    (CREATED -> QUEUED), queue_wait (-> DISPATCHED by an agent's interchange: for the
    multi-user endpoint this includes the router), dispatch (-> RUNNING), run (-> DONE),
    return (-> STORED by the service: the router's forwarder too), and `client`: what is
    left of the round trip (the submit, the push of the result to the Executor)."""
    got = client.stage_latencies(task_ids)
    out = {k: round(statistics.median(v) * 1000, 3) for k, v in got.items() if v}
    out["client"] = round(statistics.median(rtts) - sum(out.values()), 3)
    return out


def measure(site: Site, args, echo) -> dict:
    from skyfn import Executor

    users = range(site.n_users)
    mu_id, su_id = site.endpoint_ids[MU], site.endpoint_ids[SU]
    clients = [site.user_client(i) for i in users]
    fids = [c.register_function(noop) for c in clients]
    executors = [Executor(endpoint_id=mu_id, client=c) for c in clients]
    su_client = site.user_client(0)
    su_fid = su_client.register_function(noop)
    su_ex = Executor(endpoint_id=su_id, client=su_client)
    try:
        # 1. cold starts, one user after another
        # the service's side warm for every user first: one task each on the single-user endpoint
        clients[0].share("endpoints", su_id, "all-users", "run")
        for i in users:
            assert clients[i].get_result(clients[i].run(fids[i], i, endpoint_id=su_id), timeout=120) == i
        echo("cold starts: the first task of each user on the multi-user endpoint")
        cold, cold_service, breakdowns, agents = [], [], [], []
        for i in users:
            submitted = time.time()
            t0 = time.perf_counter()
            fut = executors[i].submit(fids[i], i)
            value = fut.result(timeout=180)
            elapsed = time.perf_counter() - t0
            done = time.time()
            assert value == i, value
            stages = clients[i].stage_latencies([fut.task_id])
            cold_service.append(sum(v[0] for v in stages.values() if v))
            ua = site.user_agent(site.accounts[i])
            agents.append(ua)
            cold.append(elapsed)
            breakdowns.append(cold_breakdown(site, ua, submitted, done))
            echo(f"  user {i} ({site.accounts[i]}): {elapsed:.3f} s  {breakdowns[-1]}")
        idle_since = time.monotonic()

        # 2. idle user agents' memory
        time.sleep(max(0.0, args.idle_wait - (time.monotonic() - idle_since)))
        mems = [tree_memory(ua["pid"]) for ua in agents]
        echo(f"idle user agents (after >= {args.idle_wait:g} s idle): RSS "
             f"{', '.join(f'{m[0]:.0f}' for m in mems)} MB; PSS {', '.join(f'{m[1]:.0f}' for m in mems)} MB; "
             f"{mems[0][2]} processes each; RSS by process of the first: {mems[0][3]}")

        # 3. warm round trips, alternating between the endpoints
        echo(f"warm round trips: {args.rtt} on each endpoint, alternating")
        for _ in range(20):
            rtt_ms(executors[0], fids[0])
            rtt_ms(su_ex, su_fid)
        mu_rtt, su_rtt, mu_ids, su_ids = [], [], [], []
        for _ in range(args.rtt):
            mu_rtt.append(rtt_ms(executors[0], fids[0], mu_ids))
            su_rtt.append(rtt_ms(su_ex, su_fid, su_ids))
        mu_p50, su_p50 = statistics.median(mu_rtt), statistics.median(su_rtt)
        mu_stages, su_stages = stages_ms(clients[0], mu_ids, mu_rtt), stages_ms(su_client, su_ids, su_rtt)
        echo(f"  multi-user p50 {mu_p50:.2f} ms p99 {percentile(mu_rtt, 0.99):.2f} ms  stages {mu_stages}")
        echo(f"  single-user p50 {su_p50:.2f} ms p99 {percentile(su_rtt, 0.99):.2f} ms  stages {su_stages}")

        # 4. throughput: users x tasks at once, against one user x users*tasks
        total = site.n_users * args.tasks
        echo(f"warm-up: one untimed round of {site.n_users} users x {args.tasks} tasks")
        run_batch(executors, fids, args.tasks)
        many, one = [], []
        for r in range(args.repeat):
            many.append(run_batch(executors, fids, args.tasks))
            one.append(run_batch(executors[:1], fids[:1], total))
            echo(f"  round {r + 1}: {site.n_users} users x {args.tasks} tasks {many[-1]:.2f} s "
                 f"({total / many[-1]:.0f} tasks/s); 1 user x {total} tasks {one[-1]:.2f} s "
                 f"({total / one[-1]:.0f} tasks/s)")
        many_s, one_s = statistics.median(many), statistics.median(one)
    finally:
        for ex in executors + [su_ex]:
            try:
                ex.shutdown(wait=True, cancel_futures=True)
            except Exception:  # noqa: BLE001
                pass

    return {
        "cold_start_first_result_s": round(statistics.median(cold), 3),
        "cold_start_samples_s": [round(c, 3) for c in cold],
        "cold_start_service_s": round(statistics.median(cold_service), 3),
        "cold_start_breakdown_ms": {k: round(statistics.median([b[k] for b in breakdowns if k in b]), 1)
                                    for k in breakdowns[0]},
        "warm_rtt_over_single_user": round(mu_p50 / su_p50, 3),
        "warm_rtt_mu_ms": {"p50": round(mu_p50, 3), "p99": round(percentile(mu_rtt, 0.99), 3)},
        "warm_rtt_su_ms": {"p50": round(su_p50, 3), "p99": round(percentile(su_rtt, 0.99), 3)},
        "warm_rtt_stages_ms": {"multi_user": mu_stages, "single_user": su_stages},
        "ten_users_over_one_user": round((total / many_s) / (total / one_s), 3),
        "many_users_tasks_per_s": round(total / many_s),
        "one_user_tasks_per_s": round(total / one_s),
        "many_users_batch_s": [round(x, 3) for x in many],
        "one_user_batch_s": [round(x, 3) for x in one],
        "idle_user_agent_rss_mb": round(statistics.median(m[0] for m in mems), 1),
        "idle_user_agent_pss_mb": round(statistics.median(m[1] for m in mems), 1),
        "idle_user_agent_rss_samples_mb": [round(m[0], 1) for m in mems],
        "idle_user_agent_processes": mems[0][2],
        "idle_user_agent_rss_by_process_mb": mems[0][3],
    }


def idle_main(args, echo, load_before: float) -> int:
    from benchmarks.multi_user_idle import run

    out = run(args, echo)
    out.update({"cpus": os.cpu_count(),
                "load_average": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}})
    echo(f"privileged process, all {args.users} idle and stopped: {out['router_idle_cpu_percent']} % of a core "
         "(goal <= 2)")
    echo(f"restart by the next task: p50 {out['cold_start_restart_s']['p50']} s, p95 "
         f"{out['cold_start_restart_s']['p95']} s (goal <= 1.5); after the lane was unbound: p50 "
         f"{out['cold_start_rebind_s']['p50']} s, p95 {out['cold_start_rebind_s']['p95']} s")
    echo(f"tasks lost: {out['tasks_lost']} of {out['tasks_submitted']}")
    if args.json:
        print(json.dumps(out), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--users", type=int, default=10, help="users (accounts, user agents) of the throughput run")
    ap.add_argument("--tasks", type=int, default=1000, help="tasks per user in the throughput run")
    ap.add_argument("--rtt", type=int, default=200, help="round trips timed on each endpoint")
    ap.add_argument("--workers", type=int, default=None,
                    help="workers of each user agent and of the single-user endpoint (default 2; 1 with --idle)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="rounds of the throughput pair (many users, then one user); medians are reported")
    ap.add_argument("--idle-wait", type=float, default=5.0,
                    help="seconds a user agent idles before its memory is read")
    idle = ap.add_argument_group("--idle: many users, most idle (benchmarks/multi_user_idle.py)")
    idle.add_argument("--idle", action="store_true",
                      help="measure idle users instead: agents stopped and started again, lanes unbound and bound "
                           "again, the privileged process's idle CPU (use with --users 200)")
    idle.add_argument("--idle-timeout", type=float, default=5.0, help="the endpoint's idle_timeout in --idle")
    idle.add_argument("--lane-idle", type=float, default=600.0,
                      help="the endpoint's lane_idle_timeout in --idle (longer than phases 1-3 take)")
    idle.add_argument("--window", type=float, default=20.0, help="seconds each CPU figure of --idle is taken over")
    idle.add_argument("--running", type=int, default=50,
                      help="users whose agents are up at once for the running-CPU figure of --idle (0: skip)")
    ap.add_argument("--logs", type=Path, default=None,
                    help="copy the endpoints' and the user agents' logs into this directory before cleaning up")
    ap.add_argument("--quick", action="store_true",
                    help=f"a small run for tests: {QUICK['users']} users x {QUICK['tasks']} tasks, "
                         f"{QUICK['rtt']} round trips")
    args = ap.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if args.workers is None:
        args.workers = 1 if args.idle else 2
    if args.idle and (args.lane_idle < args.idle_timeout or min(args.idle_timeout, args.window) <= 0):
        ap.error("--idle needs --idle-timeout and --window above 0 and --lane-idle at least --idle-timeout")
    if min(args.users, args.tasks, args.rtt, args.repeat, args.workers) < 1:
        ap.error("--users, --tasks, --rtt, --repeat and --workers must be at least 1")
    why = problem()
    if why:
        print(why, file=sys.stderr)
        return 2

    def echo(line: str) -> None:
        print(line, flush=True)

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    load_before = os.getloadavg()[0]
    if args.idle:
        return idle_main(args, echo, load_before)
    site = Site(args.users, args.workers, echo)
    started = time.monotonic()
    try:
        site.open()
        echo(f"set up in {time.monotonic() - started:.1f} s (load average {os.getloadavg()[0]:.2f})")
        out = measure(site, args, echo)
    finally:
        if args.logs is not None:
            site.save_logs(args.logs)
        echo("cleaning up")
        site.close()
    out.update({"users": args.users, "tasks_per_user": args.tasks, "rtt_samples": args.rtt, "workers": args.workers,
                "repeat": args.repeat, "quick": args.quick, "goals": GOALS, "cpus": os.cpu_count(),
                "load_average": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
                "user_agent_python": "/usr/bin/python3 (shared copy of the venv's packages)",
                "wall_s": round(time.monotonic() - started, 1)})
    met = {"cold_start_first_result_s": out["cold_start_first_result_s"] <= 1.5,
           "warm_rtt_over_single_user": out["warm_rtt_over_single_user"] <= 1.1,
           "ten_users_over_one_user": out["ten_users_over_one_user"] >= 0.8}
    out["goals_met"] = met
    echo(f"cold start, first result:       {out['cold_start_first_result_s']:.3f} s "
         f"(median of {args.users}; goal <= 1.5)")
    echo(f"warm RTT multi/single user:     {out['warm_rtt_over_single_user']:.3f} "
         f"({out['warm_rtt_mu_ms']['p50']:.2f} / {out['warm_rtt_su_ms']['p50']:.2f} ms; goal <= 1.1)")
    echo(f"{args.users} users over 1 user throughput: {out['ten_users_over_one_user']:.3f} "
         f"({out['many_users_tasks_per_s']} / {out['one_user_tasks_per_s']} tasks/s; goal >= 0.8)")
    echo(f"idle user agent RSS:            {out['idle_user_agent_rss_mb']:.1f} MB "
         f"(PSS {out['idle_user_agent_pss_mb']:.1f} MB, {out['idle_user_agent_processes']} processes)")
    echo(f"load average before/after: {out['load_average']['before']} / {out['load_average']['after']} "
         f"on {out['cpus']} CPUs")
    if args.json:
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted (everything made was removed)", file=sys.stderr)
        sys.exit(130)
