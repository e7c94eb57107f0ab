"""One rung of the fleet ladder (benchmarks/fleet.py): N endpoints, M users, one fresh runtime.

The steps, in order (times from the options):

1. a private embedded runtime (`skyfn local up --detach` in a fresh SKYFN_HOME, no
   endpoint of its own): redis-server, moto, the service process;
2. **base** window (`base_s`): the runtime with no endpoint -- its own periodic work (the
   reaper every 5 s, the history drain), subtracted from the idle window's figures;
3. the fleet: `hosts` processes of benchmarks/fleet_agents.py (N/hosts light agents each,
   every one a real endpoint: registration, credential, heartbeats every
   `heartbeat_period`, task and control queue long polls of `receive_wait`, sealed result
   packs), started together; every endpoint shared with all-users; wait until the service
   lists all N online (`online_s`), then `settle` seconds;
4. **idle** window (`window_s`): nothing submitted. Per idle endpoint: the service tree's
   CPU (service process and its Lambda environments) and redis-server's main-thread CPU
   over the window, less the base window's rate, / N; Redis commands / s likewise
   (INFO commandstats; queue = the task and control streams' commands, SQS on AWS; store =
   the rest); bytes from MEMORY USAGE of every key (after the fleet settled, less before
   it started) / N, split the same way, and used_memory's growth / N (it also holds the
   agents' connections' buffers and the queues' ACL logins); agent -> service HTTP
   requests per endpoint per minute (counted in the fleet hosts) and queue receives
   (XREADGROUP calls) per endpoint per minute; Redis connected_clients and the gateway's
   established connections;
5. **load** window (`window_s`, after `warm` s of load): M users at `rate` tasks/s over
   the Zipf-drawn endpoints (benchmarks/fleet_load.py), two probes (one round trip a
   second each, own Clients) to the top-ranked (busiest) endpoint and to an endpoint
   no load goes to. Service CPU per task = (service tree CPU/s under load - its idle
   window's CPU/s) / tasks per s (load and probes): the idle fleet's own cost is not
   charged to the tasks. The same for redis-server;
6. meanwhile the **lag** probe: `lag_endpoints` endpoints no load goes to are stopped (the
   host's `stop NAME`), and once the service lists them offline (heartbeat timeout, then
   the reaper) started again (`start NAME`, their kept credentials): heartbeat-to-online
   lag = from the agent reporting itself up (FleetHost's on-ready, after its heartbeats
   started) to GET /endpoints/<id> answering online (polled every 20 ms), and from the
   start command;
7. drain: every task must resolve with its own value; then hosts and runtime stop.

A rung that cannot start (the runtime, a host, agents not coming online in time) returns
{"n": N, "error": why} and the ladder goes on.
"""
from __future__ import annotations

import math
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.fleet_hosts import HostError, Hosts
from benchmarks.fleet_load import Load, Prober, Tally, User, percentile
from benchmarks.fleet_sample import Probe, window


def _r(x, nd=3):
    return None if x is None else round(x, nd)


def quiet(*_):
    return None


def agent_config(args) -> dict:
    return {"heartbeat_period": args.heartbeat_period, "receive_wait": args.receive_wait,
            "lease_seconds": args.lease_seconds, "grace_period": 5, "log_level": "WARNING"}


def host_sizes(n: int, per_host: int) -> list[int]:
    hosts = max(1, math.ceil(n / per_host))
    return [n // hosts + (1 if i < n % hosts else 0) for i in range(hosts)]


class Runtime:
    """A fresh embedded runtime in its own home (no endpoint of its own); `close()` ends it."""

    def __init__(self, prefix: str):
        from infra.local import runtime
        from infra.local.access import client_token
        from infra.local.state import StateDir

        self.home = Path(tempfile.mkdtemp(prefix=prefix))
        os.environ["SKYFN_HOME"] = str(self.home)
        self.up = False
        t = time.monotonic()
        runtime.up(self.home, detach=True, endpoint=False, echo=quiet)
        self.up = True
        self.startup_s = time.monotonic() - t
        self.state = StateDir.at(self.home)
        self.url = self.state.read_runtime()["service_url"]
        self.owner_token = client_token(self.state)

    def close(self, keep: bool = False) -> None:
        from infra.local import runtime

        if self.up:
            runtime.down(self.home, echo=quiet)
        if not keep:
            shutil.rmtree(self.home, ignore_errors=True)


def wait_online(client, ids: list[str], timeout: float) -> float:
    t0 = time.monotonic()
    want = set(ids)
    while True:
        online = {e["endpoint_id"] for e in client.list_endpoints() if e.get("status") == "online"}
        if want <= online:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise HostError(f"{len(want - online)} of {len(want)} endpoints not online after {timeout:.0f} s")
        time.sleep(1.0)


def share_all(client, ids: list[str]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda ep: client.share("endpoints", ep, "all-users", "run"), ids))


def lag_probe(hosts: Hosts, client, names: list[str], ids: dict[str, str], timeout: float, out: dict,
              t0: float) -> None:
    """Stop `names`, wait until each is offline, start each again: its lag to online.
    `out` also gets when (s after t0) they were stopped, seen offline and restarted."""
    try:
        for name in names:
            h = hosts.host_of(name)
            h.command(f"stop {name}")
            h.wait_event("stopped", 60)
        out["stopped_at_s"] = round(time.monotonic() - t0, 1)
        deadline = time.monotonic() + timeout
        while any(client.get_endpoint(ids[n]).get("status") == "online" for n in names):
            if time.monotonic() > deadline:
                raise HostError(f"stopped endpoints still online after {timeout:.0f} s")
            time.sleep(1.0)
        out["offline_at_s"] = round(time.monotonic() - t0, 1)
        after_ready, after_start = [], []
        for name in names:
            h = hosts.host_of(name)
            t_cmd = time.time()
            h.command(f"start {name}")
            end = time.monotonic() + 60
            while client.get_endpoint(ids[name]).get("status") != "online":
                if time.monotonic() > end:
                    raise HostError(f"{name} not online 60 s after its start")
                time.sleep(0.02)
            t_online = time.time()
            h.wait_event("started", 60)
            time.sleep(1.1)  # the counts file is rewritten every second
            ready = (h.counts().get("ready_at") or {}).get(name)
            after_start.append((t_online - t_cmd) * 1000)
            if ready is not None and ready > t_cmd:
                after_ready.append(max(0.0, t_online - ready) * 1000)
        out["restarted_at_s"] = round(time.monotonic() - t0, 1)
        out.update({"online_after_ready_ms": [round(x, 1) for x in after_ready],
                    "online_after_start_ms": [round(x, 1) for x in after_start],
                    "lag_p50_ms": _r(percentile(after_ready, 0.5), 1), "lag_max_ms": _r(max(after_ready, default=None), 1)})
    except Exception as exc:  # noqa: BLE001 - reported in the rung
        out["error"] = f"{type(exc).__name__}: {exc}"[:400]


def run_rung(args, n: int, m: int, log) -> dict[str, Any]:
    rung: dict[str, Any] = {"n": n, "m": m}
    rt = hosts = None
    users: list[User] = []
    try:
        try:
            rt = Runtime(f"skyfn-fleet-{n}-")
        except Exception as exc:  # noqa: BLE001 - the rung says why
            return {**rung, "error": f"the embedded runtime did not start: {type(exc).__name__}: {exc}"[:600]}
        from skyfn import Client

        owner = Client(service_url=rt.url, token=rt.owner_token)
        hosts = Hosts(host_sizes(n, args.per_host), rt.home / "fleet", rt.url, rt.owner_token, agent_config(args),
                      args.threads, args.concurrency)
        probe = Probe(rt.home, extra_pids=hosts.pids, requests=hosts.requests)
        time.sleep(2.0)
        keys0, s0 = probe.memory_by_class(), probe.snapshot()
        time.sleep(args.base_s)
        s1 = probe.snapshot()
        base = window(s0, s1)
        log(f"N={n}: base window {base['seconds']:.0f} s; starting {len(hosts.hosts)} fleet host(s)")
        t = time.monotonic()
        try:
            ids = hosts.start(timeout=args.start_timeout)
            rung["register_s"] = round(time.monotonic() - t, 1)
            share_all(owner, list(ids.values()))
            rung["online_s"] = round(wait_online(owner, list(ids.values()), args.start_timeout) + rung["register_s"], 1)
        except HostError as exc:
            return {**rung, "error": f"the fleet did not come up: {exc}"[:800]}
        log(f"N={n}: {len(ids)} endpoints online after {rung['online_s']} s; settling {args.settle:.0f} s")
        time.sleep(args.settle)
        keys1 = probe.memory_by_class()
        a = probe.snapshot()
        time.sleep(args.window_s)
        b = probe.snapshot()
        idle = window(a, b)
        rung.update(idle_figures(n, base, idle, s1, b, keys0, keys1))
        log(f"N={n}: idle window done; {m} users, load {args.rate:.0f} tasks/s")
        # the load, its probes and the lag probe
        names = sorted(ids)
        order = names[:]
        random.Random(n).shuffle(order)
        k_lag = min(args.lag_endpoints, max(0, n - 2))
        idle_name, lag_names, busy_names = order[-1], order[-1 - k_lag:-1], order[:max(1, n - 1 - k_lag)]
        users = [User(rt.state, rt.url, i) for i in range(m)]
        tally = Tally()
        load = Load(users, [ids[x] for x in busy_names], args.rate, args.zipf, args.batch, tally)
        probes = {"busy": Prober(users[0], ids[busy_names[0]], args.probe_period, "busy"),
                  "idle": Prober(users[-1], ids[idle_name], args.probe_period, "idle")}
        lag: dict[str, Any] = {"endpoints": len(lag_names)}
        t_load = time.monotonic()  # the probes' and the lag probe's times count from here
        for p in probes.values():
            p.t0 = t_load
        lag_thread = threading.Thread(target=lag_probe, args=(hosts, owner, lag_names, ids, args.lag_timeout, lag,
                                                              t_load), name="fleet-lag", daemon=True)
        load.start()
        if lag_names:
            lag_thread.start()
        time.sleep(args.warm)
        for p in probes.values():
            p.start()
        with tally.lock:
            sub0 = tally.submitted
        a = probe.snapshot()
        n_probes0 = sum(len(p.rtts) for p in probes.values())
        time.sleep(args.window_s)
        b = probe.snapshot()
        with tally.lock:
            sub1 = tally.submitted
        n_probes1 = sum(len(p.rtts) for p in probes.values())
        for p in probes.values():
            p.halt.set()
        loaded = window(a, b)
        unresolved = load.drain(args.drain_timeout)
        for p in probes.values():
            p.join(70)
        if lag_names:
            lag_thread.join(args.lag_timeout + 120)
        rung.update(load_figures(n, idle, loaded, sub1 - sub0 + n_probes1 - n_probes0, b))
        rung.update({"tasks_submitted": tally.submitted, "tasks_resolved": tally.resolved, "wrong": tally.wrong,
                     "failed": tally.failed, "rejected": tally.rejected, "unresolved": unresolved,
                     "failures": dict(list(tally.failures.items())[:5]),
                     "endpoints_with_tasks": len(tally.per_endpoint),
                     "top_endpoint_share": _r(max(tally.per_endpoint.values(), default=0) / max(1, tally.submitted)),
                     "busy": probes["busy"].figures(), "idle": probes["idle"].figures(), "lag": lag,
                     "user_tick_s": _r(load.tick, 2)})
        log(f"N={n}: done: {tally.resolved}/{tally.submitted} resolved, busy p99 {rung['busy']['p99_ms']} ms, "
            f"idle p99 {rung['idle']['p99_ms']} ms, cpu/task {rung.get('service_cpu_us_per_task')} us")
        return rung
    except Exception as exc:  # noqa: BLE001 - the ladder goes on
        import traceback

        return {**rung, "error": f"{type(exc).__name__}: {exc}"[:600], "traceback": traceback.format_exc()[-1500:]}
    finally:
        for u in users:
            u.close()
        if hosts is not None:
            hosts.stop()
        if rt is not None:
            rt.close(keep=args.keep_home)
        os.environ.pop("SKYFN_HOME", None)


def idle_figures(n: int, base: dict, idle: dict, base_end: dict, idle_end: dict, keys0: dict, keys1: dict) -> dict:
    per = 1.0 / n
    cpu_b, cpu_i = base["cpu_per_s"], idle["cpu_per_s"]
    req = idle["http_requests_by_path_per_s"]
    return {
        "window_s": round(idle["seconds"], 1),
        "service_cpu_percent_idle": _r(100 * cpu_i.get("service", 0.0), 2),
        "service_cpu_percent_base": _r(100 * cpu_b.get("service", 0.0), 2),
        "idle_service_cpu_ms_per_endpoint_min": _r((cpu_i.get("service", 0) - cpu_b.get("service", 0)) * per * 60e3),
        "idle_redis_cpu_ms_per_endpoint_min": _r((idle["redis_cpu_per_s"] - base["redis_cpu_per_s"]) * per * 60e3),
        "idle_host_cpu_ms_per_endpoint_min": _r(cpu_i.get("hosts", 0) * per * 60e3),
        "idle_redis_ops_per_endpoint_s": _r((idle["redis_ops_per_s"] - base["redis_ops_per_s"]) * per),
        "idle_redis_store_ops_per_endpoint_s": _r((idle["redis_store_ops_per_s"] - base["redis_store_ops_per_s"]) * per),
        "idle_redis_queue_ops_per_endpoint_s": _r((idle["redis_queue_ops_per_s"] - base["redis_queue_ops_per_s"]) * per),
        "idle_redis_ops_per_s": _r(idle["redis_ops_per_s"], 1),
        "idle_redis_store_ops_per_s": _r(idle["redis_store_ops_per_s"], 1),
        "idle_redis_queue_ops_per_s": _r(idle["redis_queue_ops_per_s"], 1),
        "idle_redis_commands_per_s": {k: v for k, v in list(idle["commands_per_s"].items())[:12]},
        "idle_store_bytes_per_endpoint": round((keys1["store"] - keys0["store"]) * per),
        "idle_queue_bytes_per_endpoint": round((keys1["queue"] - keys0["queue"]) * per),
        "keys_per_endpoint": _r((keys1["keys"] - keys0["keys"]) * per, 2),
        "used_memory_bytes_per_endpoint": round((idle_end["used_memory"] - base_end["used_memory"]) * per),
        "client_buffer_bytes_per_endpoint": round(((idle_end["mem_clients_normal"] or 0) - (base_end["mem_clients_normal"] or 0)) * per),
        "redis_used_mb_base": _r(base_end["used_memory"] / 2**20, 2),
        "redis_used_mb_idle": _r(idle_end["used_memory"] / 2**20, 2),
        "redis_connected_clients": idle_end["connected_clients"],
        "redis_connections_per_endpoint": _r((idle_end["connected_clients"] - base_end["connected_clients"]) * per, 2),
        "gateway_connections_idle": idle_end["gateway_connections"],
        "agent_http_requests_per_endpoint_min": _r(idle["http_requests_per_s"] * per * 60, 2),
        "agent_http_requests_by_path_per_endpoint_min": {k: _r(v * per * 60, 2) for k, v in req.items()},
        "agent_queue_receives_per_endpoint_min": _r((idle["queue_receives_per_s"] - base["queue_receives_per_s"]) * per * 60, 1),
        "rss_mb_idle": idle_end["rss_mb"],
    }


def load_figures(n: int, idle: dict, loaded: dict, tasks: int, end: dict) -> dict:
    rate = tasks / loaded["seconds"]
    svc = loaded["cpu_per_s"].get("service", 0.0) - idle["cpu_per_s"].get("service", 0.0)
    red = loaded["redis_cpu_per_s"] - idle["redis_cpu_per_s"]
    return {
        "load_tasks_per_s": _r(rate, 1),
        "service_cpu_percent_load": _r(100 * loaded["cpu_per_s"].get("service", 0.0), 1),
        "service_cpu_us_per_task": _r(svc / rate * 1e6, 1) if rate else None,
        "redis_cpu_us_per_task": _r(red / rate * 1e6, 1) if rate else None,
        "redis_ops_per_task": _r((loaded["redis_ops_per_s"] - idle["redis_ops_per_s"]) / rate, 2) if rate else None,
        "redis_commands_per_task": top_per_task(loaded["commands_per_s"], idle["commands_per_s"], rate),
        "host_cpu_percent_load": _r(100 * loaded["cpu_per_s"].get("hosts", 0.0), 1),
        "gateway_connections_load": end["gateway_connections"],
        "redis_connected_clients_load": end["connected_clients"],
        "redis_used_mb_load": _r(end["used_memory"] / 2**20, 2),
    }


def top_per_task(loaded: dict[str, float], idle: dict[str, float], rate: float, k: int = 15) -> dict[str, float]:
    """The load window's commands per task, less the idle window's rate: which grow with N."""
    if not rate:
        return {}
    per = {c: (v - idle.get(c, 0.0)) / rate for c, v in loaded.items()}
    return {c: round(v, 2) for c, v in sorted(per.items(), key=lambda kv: -kv[1])[:k] if v >= 0.05}
