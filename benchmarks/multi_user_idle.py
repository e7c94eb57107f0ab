"""Many users on one multi-user endpoint, most of them idle (issue 39): user agents stopped
when idle and started again by their user's next task, lanes unbound after an idle time and
bound again, and what the privileged process costs meanwhile.

    sudo .venv/bin/python benchmarks/multi_user.py --idle --users 200 [--json] [--idle-timeout 5]
        [--lane-idle 600] [--window 20] [--running 50] [--workers 1] [--logs DIR]

It runs as root like benchmarks/multi_user.py (same site: benchmarks/multi_user_site.py, with
`--users` fresh accounts made with useradd and removed at the end, also on error), without the
single-user endpoint. The endpoint's config sets `idle_timeout: --idle-timeout` and
`lane_idle_timeout: --lane-idle`; each user agent runs the site's default template: `--workers`
local workers and its own data redis-server. Tasks are `return x`, submitted with
Client.run and waited for with Client.get_result (a long poll), one user at a time where a
latency is timed. Phases:

1. start: every user's first task (four users at a time): each user agent started, its lane
   bound. Then all are left idle until every agent has stopped (`idle_timeout`), their lanes
   still bound.
2. `router_idle_cpu_percent` (goal <= 2): the privileged process's CPU (utime + stime of all its
   threads, from /proc/<pid>/stat) over `--window` seconds while all users are idle and their
   agents stopped, in % of one core; `router_redis_idle_cpu_percent` the same for the router's
   redis-server, `router_rss_mb` the privileged process's memory.
3. restart: each user's next task, one user after another: the service sends it to the user's
   lane, the lane reader sees it and wakes supervision, which starts the agent.
   `cold_start_restart_s` (goal: p50 and p95 <= 1.5): submit -> result. `routed_during_restart`:
   packs the router routed itself meanwhile (0: every task went through its lane).
4. unbound: every agent stops again; once idle for `--lane-idle` its lane is unbound at the
   service and the agent forgotten (`lanes_unbound_idle`, `user_agents_known` in the
   endpoint's status). `router_idle_cpu_percent_unbound` over another window.
5. rebind: each user's next task, one user after another: it comes through the endpoint's own
   queue; the router maps the user, binds the lane again and starts the agent.
   `cold_start_rebind_s` (p50, p95); `routed_during_rebind` (one pack per user).
   `restart_submit_to_spawn_ms` / `rebind_submit_to_spawn_ms`: how long after the submit the
   privileged process started the agent (its log): the endpoint's part of a cold start; the
   rest is the agent's boot and the task's way back, which other load on the machine slows.
6. running (`--running R`, 0 skips it): R users at once each run a task that holds until the
   window is over, so R agents are up and nothing flows: `router_running_cpu_percent` with
   `running_agents` (R < --users where R agents at once do not fit the machine's memory: the
   figure is per running agent, `router_running_cpu_percent_per_agent`).

`tasks_submitted`, `tasks_lost` (submitted minus those whose result came back right):
nothing may be lost. `--lane-idle` must exceed how long phases 1-3 keep a user's lane idle
(about 2.6 s per user at 200 users on 2 cores): the benchmark checks that no lane was unbound
before phase 4 and says so if one was.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from benchmarks.multi_user_site import MU, Site

GOALS = {"router_idle_cpu_percent": "<= 2", "cold_start_restart_s.p50": "<= 1.5",
         "cold_start_restart_s.p95": "<= 1.5", "tasks_lost": "== 0"}
TICK = os.sysconf("SC_CLK_TCK")


def echo_value(x):
    return x


def hold(path, x, limit_s):
    """Run until `path` exists (the benchmark's window is over), at most limit_s."""
    import os
    import time

    deadline = time.monotonic() + limit_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.2)
    return x


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of the process so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # fields 14 and 15 of stat(5)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_percent(pids: dict[str, int], window: float) -> dict[str, float]:
    """% of one core each process used over `window` seconds from now."""
    before = {k: cpu_seconds(p) for k, p in pids.items()}
    t0 = time.monotonic()
    time.sleep(window)
    elapsed = time.monotonic() - t0
    return {k: round(100 * (cpu_seconds(p) - before[k]) / elapsed, 3) for k, p in pids.items()}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(samples: list[float]) -> dict:
    return {"p50": round(statistics.median(samples), 3), "p95": round(pct(samples, 0.95), 3),
            "max": round(max(samples), 3), "n": len(samples)}


class Tally:
    """Every task submitted and whether its result came back right."""

    def __init__(self):
        self.lock = threading.Lock()
        self.submitted = self.right = 0
        self.wrong: list[str] = []
        self.last_submit = 0.0

    def one(self, client, fid: str, endpoint_id: str, value, timeout: float = 300) -> float:
        """Seconds from submitting echo_value(value) to its result."""
        with self.lock:
            self.submitted += 1
        self.last_submit = time.time()
        t0 = time.perf_counter()
        task_id = client.run(fid, value, endpoint_id=endpoint_id)
        got = client.get_result(task_id, timeout=timeout)
        elapsed = time.perf_counter() - t0
        with self.lock:
            if got == value:
                self.right += 1
            else:
                self.wrong.append(task_id)
        return elapsed


def spawned_at(site: Site, account: str, after: float) -> float | None:
    """When the privileged process logged starting `account`'s user agent, at or after `after` (epoch)."""
    for line in (site.endpoint_dir(MU) / "agent-foreground.log").read_text(errors="replace").splitlines():
        if f" as {account} (" not in line or "started user agent" not in line:
            continue
        try:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        if stamp >= after - 0.01:
            return stamp
    return None


def sequential(site: Site, clients: list, fids: list, mu_id: str, tally: Tally, base: int) -> tuple[list, list]:
    """Each user's next task, one user after another: (submit -> result seconds, submit -> the
    privileged process started the user's agent, in ms, where its log says so)."""
    rtts, submits = [], []
    for i, (c, fid) in enumerate(zip(clients, fids)):
        rtts.append(tally.one(c, fid, mu_id, base + i))
        submits.append(tally.last_submit)
    spawns = []
    for i, submitted in enumerate(submits):
        at = spawned_at(site, site.accounts[i], submitted)
        if at is not None:
            spawns.append(round((at - submitted) * 1000, 1))
    return rtts, spawns


def stats(site: Site) -> dict:
    return site.status(MU)


def wait_until(predicate, timeout: float, what: str, site: Site) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = stats(site)
        if st and predicate(st):
            return st
        if site.procs[MU].poll() is not None:
            raise RuntimeError(f"the multi-user endpoint exited: {site.log_tail(MU)}")
        time.sleep(0.5)
    raise RuntimeError(f"{what}: not within {timeout:.0f} s; status: "
                       f"{ {k: v for k, v in stats(site).items() if k != 'user_agents'} }")


def measure_idle(site: Site, args, echo) -> dict:
    n = site.n_users
    mu_id = site.endpoint_ids[MU]
    clients = [site.user_client(i) for i in range(n)]
    echo(f"registering the function for {n} users")
    fids = [c.register_function(echo_value) for c in clients]
    tally = Tally()
    out: dict = {}

    def pids() -> dict[str, int]:
        import json

        router = json.loads((site.endpoint_dir(MU) / "router" / "redis.json").read_text())["pid"]
        return {"router": stats(site)["pid"], "router_redis": router}

    # 1. every user's first task
    echo(f"phase 1: the first task of each of {n} users (4 at a time)")
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        first = list(pool.map(lambda i: tally.one(clients[i], fids[i], mu_id, i), range(n)))
    out["start_phase_s"] = round(time.monotonic() - t0, 1)
    out["cold_start_first_s"] = summary(first)
    echo(f"  {n} user agents started in {out['start_phase_s']} s; first task {out['cold_start_first_s']}")
    st = wait_until(lambda s: s["user_agents_running"] == 0 and s["lanes_bound"] == n,
                    args.idle_timeout + 300, "every user agent stopped idle, its lane bound", site)
    out["stopped_idle_after_start"] = st["user_agents_stopped_idle"]

    # 2. all idle, agents stopped, lanes bound
    echo(f"phase 2: all {n} users idle, their agents stopped: the privileged process's CPU over {args.window:g} s")
    got = cpu_percent(pids(), args.window)
    out["router_idle_cpu_percent"] = got["router"]
    out["router_redis_idle_cpu_percent"] = got["router_redis"]
    out["router_rss_mb"] = round(rss_mb(pids()["router"]), 1)
    echo(f"  privileged process {got['router']} % of a core, router redis-server {got['router_redis']} %, "
         f"RSS {out['router_rss_mb']} MB")

    # 3. each user's next task starts the agent again (through its lane)
    echo(f"phase 3: each user's next task, one after another (agents stopped, lanes bound)")
    routed = stats(site)["routed"]
    restart, spawns = sequential(site, clients, fids, mu_id, tally, n)
    st = stats(site)
    out["cold_start_restart_s"] = summary(restart)
    out["restart_submit_to_spawn_ms"] = summary(spawns) if spawns else None
    out["routed_during_restart"] = st["routed"] - routed
    out["lanes_unbound_before_phase_4"] = st["lanes_unbound_idle"]
    echo(f"  restart {out['cold_start_restart_s']}; submit -> agent spawned {out['restart_submit_to_spawn_ms']} ms; "
         f"routed by the router meanwhile: {out['routed_during_restart']}")

    # 4. idle past lane_idle_timeout: lanes unbound, agents forgotten
    echo(f"phase 4: waiting for every lane to be unbound (lane_idle_timeout {args.lane_idle:g} s)")
    t0 = time.monotonic()
    st = wait_until(lambda s: s["user_agents_known"] == 0 and s["lanes_unbound_idle"] >= n,
                    args.lane_idle + args.idle_timeout + 600, "every lane unbound", site)
    out["unbind_wait_s"] = round(time.monotonic() - t0, 1)
    out["lanes_unbound_idle"] = st["lanes_unbound_idle"]
    got = cpu_percent(pids(), args.window)
    out["router_idle_cpu_percent_unbound"] = got["router"]
    out["router_redis_idle_cpu_percent_unbound"] = got["router_redis"]
    echo(f"  all unbound; privileged process {got['router']} % of a core, router redis-server "
         f"{got['router_redis']} %")

    # 5. each user's next task binds the lane again
    echo("phase 5: each user's next task, one after another (lanes unbound)")
    routed = stats(site)["routed"]
    rebind, spawns = sequential(site, clients, fids, mu_id, tally, 2 * n)
    st = stats(site)
    out["cold_start_rebind_s"] = summary(rebind)
    out["rebind_submit_to_spawn_ms"] = summary(spawns) if spawns else None
    out["routed_during_rebind"] = st["routed"] - routed
    echo(f"  rebind {out['cold_start_rebind_s']}; submit -> agent spawned {out['rebind_submit_to_spawn_ms']} ms; "
         f"routed by the router: {out['routed_during_rebind']}")

    # 6. R agents up at once with nothing flowing
    r = min(args.running, n)
    if r:
        echo(f"phase 6: {r} users at once, each agent holding a task: the privileged process's CPU")
        out.update(running_window(site, clients[:r], mu_id, args, tally, pids, echo))

    out.update({"tasks_submitted": tally.submitted, "tasks_lost": tally.submitted - tally.right,
                "tasks_wrong": tally.wrong[:10]})
    for c in clients:
        c.close()
    return out


def running_window(site: Site, clients: list, mu_id: str, args, tally: Tally, pids, echo) -> dict:
    r = len(clients)
    gate = Path(tempfile.mkdtemp(prefix="skyfn-mub-gate-"))
    os.chmod(gate, 0o755)
    flag = gate / "go"
    limit = args.window + 900
    fids = [c.register_function(hold) for c in clients]
    ids = []
    with tally.lock:
        tally.submitted += r
    for c, fid, i in zip(clients, fids, range(r)):
        ids.append(c.run(fid, str(flag), i, limit, endpoint_id=mu_id))
    try:
        wait_until(lambda s: s["user_agents_running"] >= r, limit, f"{r} user agents running", site)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # every task taken by its agent
            states = [c.get_task(t)["state"] for c, t in zip(clients, ids)]
            if all(s == "RUNNING" for s in states):
                break
            time.sleep(1.0)
        got = cpu_percent(pids(), args.window)
    finally:
        flag.touch()
    right = sum(c.get_result(t, timeout=600) == i for c, t, i in zip(clients, ids, range(r)))
    with tally.lock:
        tally.right += right
    flag.unlink()
    gate.rmdir()
    echo(f"  {r} agents up: privileged process {got['router']} % of a core, router redis-server "
         f"{got['router_redis']} %")
    return {"running_agents": r, "router_running_cpu_percent": got["router"],
            "router_running_cpu_percent_per_agent": round(got["router"] / r, 4),
            "router_redis_running_cpu_percent": got["router_redis"]}


def run(args, echo) -> dict:
    """Set up the site, measure, clean up (also on error); the figures."""
    settings = {"idle_timeout": args.idle_timeout, "lane_idle_timeout": args.lane_idle}
    site = Site(args.users, args.workers, echo, single_user=False, settings=settings)
    started = time.monotonic()
    try:
        site.open()
        echo(f"set up in {time.monotonic() - started:.1f} s (load average {os.getloadavg()[0]:.2f})")
        out = measure_idle(site, args, echo)
    finally:
        if args.logs is not None:
            site.save_logs(args.logs)
        echo("cleaning up")
        site.close()
    out.update({"users": args.users, "idle_timeout": args.idle_timeout, "lane_idle_timeout": args.lane_idle,
                "window_s": args.window, "workers": args.workers, "goals": GOALS,
                "wall_s": round(time.monotonic() - started, 1)})
    out["goals_met"] = {"router_idle_cpu_percent": out["router_idle_cpu_percent"] <= 2,
                        "cold_start_restart_s.p50": out["cold_start_restart_s"]["p50"] <= 1.5,
                        "cold_start_restart_s.p95": out["cold_start_restart_s"]["p95"] <= 1.5,
                        "tasks_lost": out["tasks_lost"] == 0}
    return out
