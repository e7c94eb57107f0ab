"""What the fleet benchmark reads of the runtime, and the figures of a window between two reads.

`Probe.snapshot()` reads, in a few milliseconds: redis-server's INFO (main-thread CPU,
used_memory, mem_clients_normal, connected_clients, total_commands_processed) and INFO
commandstats; CPU seconds and RSS of the runtime's process trees (the service process
with its Lambda environments, redis-server, moto; benchmarks/soak.py tree_usage) and of
the fleet hosts; the gateway's TCP connections (ESTABLISHED on its port, the service
process's side: HTTP keep-alive and WebSocket alike); the fleet hosts' agents' HTTP
requests by path (benchmarks/fleet_agents.py). `window(a, b)` turns two snapshots into
rates: CPU per second per tree, Redis commands per second (split into the queues'
stream commands, SQS on AWS, and the hot store's), requests per second. The benchmark's
own commands (INFO, MEMORY USAGE, SCAN, TYPE, DBSIZE) are left out of the counts.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

from benchmarks.hot_store import commandstats_delta, is_queue_command, main_thread_cpu
from benchmarks.soak import process_trees, tree_usage

OWN_COMMANDS = frozenset({"info", "memory|usage", "memory", "scan", "type", "dbsize", "client|list", "ping",
                          "config|get", "hello", "client|setinfo"})


def redis_of(home):
    import redis

    from infra.local.state import StateDir

    return redis.Redis.from_url(StateDir.at(home).read_runtime()["redis_url"], socket_timeout=10)


def gateway_connections(service_pid: Optional[int], port: Optional[int]) -> Optional[int]:
    """ESTABLISHED TCP connections the service process holds on the gateway's port."""
    if not service_pid or not port:
        return None
    import psutil

    try:
        conns = psutil.Process(service_pid).net_connections(kind="tcp")
    except psutil.Error:
        return None
    return sum(1 for c in conns if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)


class Probe:
    def __init__(self, home, extra_pids: Callable[[], dict[str, int]] = dict,
                 requests: Callable[[], dict[str, int]] = dict):
        from infra.local.state import StateDir

        self.home = home
        self.r = redis_of(home)
        self.gateway_port = StateDir.at(home).read_runtime().get("gateway_port")
        self.extra_pids, self.requests = extra_pids, requests

    def snapshot(self) -> dict[str, Any]:
        info = self.r.info()
        stats = self.r.info("commandstats")
        pids = process_trees(self.home)
        pids.pop("agent", None)
        hosts = self.extra_pids()
        usage = tree_usage({**pids, **hosts})
        host_cpu = sum(usage[n][1] for n in hosts if n in usage)
        host_rss = sum(usage[n][0] for n in hosts if n in usage)
        return {"t": time.monotonic(), "redis_cpu": main_thread_cpu(info), "used_memory": info["used_memory"],
                "mem_clients_normal": info.get("mem_clients_normal"), "connected_clients": info["connected_clients"],
                "commandstats": stats, "cpu": {n: usage[n][1] for n in pids if n in usage} | {"hosts": host_cpu},
                "rss_mb": {n: round(usage[n][0], 1) for n in pids if n in usage} | {"hosts": round(host_rss, 1)},
                "gateway_connections": gateway_connections(pids.get("service"), self.gateway_port),
                "requests": self.requests()}

    def memory_by_class(self) -> dict[str, int]:
        """MEMORY USAGE of every key, summed: the queues' streams and the rest (hot store)."""
        from benchmarks.hot_store import memory_by_class

        return memory_by_class(self.r)


# what the queues' receive function (skyfn/protocol/queues/redis_lib.py) runs inside each FCALL
# on an empty queue besides its stream commands: TIME, ZRANGEBYSCORE (leases due), ZRANGE
# (the next lease's expiry)
RECEIVE_INNER = ("time", "zrangebyscore", "zrange")


def queue_calls(delta: dict[str, dict[str, float]]) -> float:
    """The queues' share of the commands (SQS on AWS): every stream command (XREAD BLOCK,
    XREADGROUP, XINFO, XADD, XACK, ...), every FCALL (the queues' functions: the hot store
    runs EVALSHA scripts), and of TIME, ZRANGEBYSCORE and ZRANGE as many as there were
    FCALLs (each empty receive runs one of each; the store's own few, e.g. the reaper's
    sweep, are counted to it only beyond that)."""
    calls = {k.lower(): v["calls"] for k, v in delta.items()}
    fcalls = calls.get("fcall", 0) + calls.get("fcall_ro", 0)
    streams = sum(n for k, n in calls.items() if is_queue_command(k))
    return streams + fcalls + sum(min(calls.get(k, 0), fcalls) for k in RECEIVE_INNER)


def window(a: dict, b: dict) -> dict[str, Any]:
    """Rates between snapshots a and b (per second)."""
    dt = max(1e-6, b["t"] - a["t"])
    delta = {k: v for k, v in commandstats_delta(a["commandstats"], b["commandstats"]).items()
             if k.lower() not in OWN_COMMANDS}
    q = queue_calls(delta)
    total = sum(v["calls"] for v in delta.values())
    reads = delta.get("xreadgroup", {}).get("calls", 0)
    req_a, req_b = a.get("requests") or {}, b.get("requests") or {}
    requests = {k: (v - req_a.get(k, 0)) / dt for k, v in req_b.items() if v - req_a.get(k, 0) > 0}
    return {"seconds": dt,
            "cpu_per_s": {n: (b["cpu"].get(n, 0.0) - a["cpu"].get(n, 0.0)) / dt for n in b["cpu"] if n in a["cpu"]},
            "redis_cpu_per_s": (b["redis_cpu"] - a["redis_cpu"]) / dt,
            "redis_ops_per_s": total / dt, "redis_queue_ops_per_s": q / dt, "redis_store_ops_per_s": (total - q) / dt,
            "queue_receives_per_s": reads / dt,
            "commands_per_s": {k: round(v["calls"] / dt, 2) for k, v in sorted(delta.items(), key=lambda kv: -kv[1]["calls"])},
            "http_requests_per_s": sum(requests.values()), "http_requests_by_path_per_s": requests}
