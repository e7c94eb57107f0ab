"""The hot store's (Redis's) cost per task and per idle endpoint, measured on the embedded
runtime: the figures docs/deploy.md ("A fleet's limits") takes for the one ElastiCache
primary, and benchmarks/cost.py for the idle fleet's Redis memory.

    python -m benchmarks.hot_store --json [--tasks 20000] [--endpoints 200] [--workers 2]

Starts a private embedded runtime (benchmarks/embedded.py: redis-server, moto, the service,
the endpoint `local`), then:

- **per task**: `--tasks` no-op tasks through one Executor (batched POST /tasks, results
  pushed), after a warm-up; INFO cpu and INFO commandstats are read before and after, with
  the idle rate of redis-server's CPU over `--idle-s` seconds just before subtracted. The
  commands are split into the task queues' (stream commands: the embedded runtime's queues
  are Redis streams, SQS on AWS) and the rest (the hot store proper: records, indexes,
  outbox, push, the drain). `redis_cpu_us_per_task` is redis-server's main-thread CPU per
  task (commands, parsing, replies, network), `store_share` the hot store's part of the
  commands' own time; their product estimates an ElastiCache primary's CPU per task, whose
  queues are on SQS.
- **per idle endpoint**: `--endpoints` endpoints registered and heartbeating the way an
  agent does (endpoint_agent.service.link.ServiceLink: POST /endpoints, then the
  endpoint's credential, POST /endpoints/<id>/heartbeat with the stats the real agent
  `local` last reported), then redis-server's used_memory and the MEMORY USAGE of every
  key before and after, per endpoint, split the same way (the queues' streams, which SQS
  deployments do not hold, against the rest; used_memory also holds the queues' ACL
  logins, Redis queues only); then the commands and main-thread CPU of 5 more heartbeats
  of each (the steady state), less what the runtime does over the same time without them
  (measured over `--idle-s` with the fleet registered: the reaper's walk over every
  endpoint, the drain), which is reported too.

The figures depend on this machine's cores (ElastiCache's Graviton cores are assumed
comparable, docs/deploy.md says so) and on the embedded runtime's Redis version.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

QUEUE_COMMANDS = frozenset({"xadd", "xreadgroup", "xread", "xack", "xautoclaim", "xclaim", "xdel", "xpending",
                            "xlen", "xinfo", "xtrim", "xrange", "xrevrange", "xgroup", "xsetid"})


def noop(x):
    return x


# --- pure helpers (tests/unit/test_hot_store_measure.py) ------------------------------
def main_thread_cpu(info: dict[str, Any]) -> float:
    """redis-server's CPU seconds that count against its one command thread: the main
    thread's when Redis reports it (7.0+), else the process's."""
    if "used_cpu_sys_main_thread" in info:
        return float(info["used_cpu_sys_main_thread"]) + float(info["used_cpu_user_main_thread"])
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def commandstats_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, float]]:
    """{command: {calls, usec}} executed between two INFO commandstats answers (redis-py
    parses them as {"cmdstat_<name>": {"calls": .., "usec": ..}})."""
    out = {}
    for key, stat in after.items():
        if not key.startswith("cmdstat_"):
            continue
        prev = before.get(key, {"calls": 0, "usec": 0})
        calls, usec = stat["calls"] - prev["calls"], stat["usec"] - prev["usec"]
        if calls > 0:
            out[key[len("cmdstat_"):]] = {"calls": calls, "usec": usec}
    return out


def is_queue_command(name: str) -> bool:
    return name.split("|")[0].lower() in QUEUE_COMMANDS


def split_commands(delta: dict[str, dict[str, float]]) -> dict[str, float]:
    """Calls and command microseconds of the queues (streams) and of the rest, and the
    rest's share of the command time."""
    q_calls = sum(v["calls"] for k, v in delta.items() if is_queue_command(k))
    q_usec = sum(v["usec"] for k, v in delta.items() if is_queue_command(k))
    calls = sum(v["calls"] for v in delta.values())
    usec = sum(v["usec"] for v in delta.values())
    return {"queue_calls": q_calls, "queue_usec": q_usec, "store_calls": calls - q_calls,
            "store_usec": usec - q_usec, "store_share": (usec - q_usec) / usec if usec else 0.0}


def per_task(cpu_s: float, idle_cpu_per_s: float, seconds: float, tasks: int, store_share: float) -> dict[str, float]:
    """Redis main-thread CPU per task (the idle rate over the run subtracted), the hot
    store's share of it, and the tasks/s at which each fills one core (the whole: an upper
    bound of the CPU an ElastiCache primary spends; the share: an estimate)."""
    net = max(0.0, cpu_s - idle_cpu_per_s * seconds)
    us = net / tasks * 1e6
    store_us = us * store_share
    return {"redis_cpu_us_per_task": round(us, 2), "store_cpu_us_per_task": round(store_us, 2),
            "saturation_tasks_per_s": round(1e6 / us) if us else None,
            "saturation_tasks_per_s_store": round(1e6 / store_us) if store_us else None}


def key_class(key: str, key_type: str) -> str:
    """'queue' for the task and control queues' streams (SQS on AWS), else 'store'. (The
    queues' logins are ACL users, not keys: in used_memory only.)"""
    return "queue" if key_type == "stream" else "store"


def memory_by_class(r, pattern: str = "*") -> dict[str, int]:
    """MEMORY USAGE of every key, summed by key_class."""
    out = {"queue": 0, "store": 0, "keys": 0}
    for key in r.scan_iter(match=pattern, count=1000):
        name = key.decode() if isinstance(key, bytes) else key
        t = r.type(key)
        t = t.decode() if isinstance(t, bytes) else t
        out[key_class(name, t)] += r.memory_usage(key, samples=0) or 0
        out["keys"] += 1
    return out


# --- the runs -----------------------------------------------------------------------------
def _redis(home):
    import redis

    from infra.local.state import StateDir

    return redis.Redis.from_url(StateDir.at(home).read_runtime()["redis_url"], socket_timeout=10)


def measure_tasks(home, tasks: int, idle_s: float) -> dict[str, Any]:
    from skyfn import Client, Executor

    r = _redis(home)
    client = Client()
    endpoint_id = client.endpoint_id("local")
    fid = client.register_function(noop)
    with Executor(endpoint_id=endpoint_id, client=client, data_store=None, push=True) as ex:
        for f in [ex.submit(fid, i) for i in range(500)]:  # warm: workers, connections, the push
            f.result(timeout=120)
        time.sleep(2)
        c0, t0 = main_thread_cpu(r.info("cpu")), time.monotonic()
        time.sleep(idle_s)
        idle_rate = (main_thread_cpu(r.info("cpu")) - c0) / (time.monotonic() - t0)
        stats0, cpu0, t0 = r.info("commandstats"), main_thread_cpu(r.info("cpu")), time.monotonic()
        futures = [ex.submit(fid, i) for i in range(tasks)]
        bad = sum(1 for i, f in enumerate(futures) if f.result(timeout=600) != i)
        elapsed = time.monotonic() - t0
        cpu1, stats1 = main_thread_cpu(r.info("cpu")), r.info("commandstats")
    split = split_commands(commandstats_delta(stats0, stats1))
    out = per_task(cpu1 - cpu0, idle_rate, elapsed, tasks, split["store_share"])
    out.update({"tasks": tasks, "wrong_results": bad, "seconds": round(elapsed, 2),
                "tasks_per_s": round(tasks / elapsed), "idle_cpu_percent": round(idle_rate * 100, 2),
                "redis_cpu_percent": round((cpu1 - cpu0) / elapsed * 100, 1),
                "commands_per_task": round((split["queue_calls"] + split["store_calls"]) / tasks, 2),
                "store_commands_per_task": round(split["store_calls"] / tasks, 2),
                "store_share": round(split["store_share"], 3), "redis_version": r.info("server")["redis_version"]})
    client.close()
    return out


def measure_idle_endpoints(home, endpoints: int, beats: int = 5, idle_s: float = 10.0) -> dict[str, Any]:
    from endpoint_agent.service.link import ServiceLink
    from skyfn.config import load_config
    from skyfn.protocol.dataflow import PARK_FEATURE

    r = _redis(home)
    cfg = load_config(None, None)
    local = next(e for e in ServiceLink(cfg.service_url, cfg.token)._call("GET", "/endpoints", None)["endpoints"]
                 if e["name"] == "local")
    stats = local.get("stats") or {}
    time.sleep(1)
    mem0, keys0 = r.info("memory")["used_memory"], memory_by_class(r)
    links = []
    for i in range(endpoints):
        link = ServiceLink(cfg.service_url, cfg.token)
        reg = link.register(f"idle-{i:05d}", {"hostname": f"node{i}", "workers": 1, "provider": "local"})
        if reg.agent_credential:
            link.use_token(reg.agent_credential)
        links.append((link, reg.endpoint_id))
    for link, eid in links:  # the first heartbeat as the agent sends it (features as `local` reports)
        link.heartbeat(eid, stats, None, None, [PARK_FEATURE])
    time.sleep(1)
    mem1, keys1 = r.info("memory")["used_memory"], memory_by_class(r)
    # the steady state: every endpoint heartbeats again, as an idle agent does each period
    # ... less what the runtime does meanwhile without them (the reaper's and the drain's
    # periodic work over every endpoint), measured over `idle_s` with the fleet registered
    stats0, cpu0, t0 = r.info("commandstats"), main_thread_cpu(r.info("cpu")), time.monotonic()
    time.sleep(idle_s)
    idle_s = time.monotonic() - t0
    idle_cpu, idle = main_thread_cpu(r.info("cpu")) - cpu0, commandstats_delta(stats0, r.info("commandstats"))
    stats0, cpu0 = r.info("commandstats"), main_thread_cpu(r.info("cpu"))
    conns0, t0 = r.info("stats")["total_connections_received"], time.monotonic()
    for _ in range(beats):
        for link, eid in links:
            link.heartbeat(eid, stats, None, None, [PARK_FEATURE])
    elapsed = time.monotonic() - t0
    cpu1, delta = main_thread_cpu(r.info("cpu")), commandstats_delta(stats0, r.info("commandstats"))
    conns = r.info("stats")["total_connections_received"] - conns0
    k = elapsed / idle_s
    own = {c: {"calls": v["calls"] - k * idle.get(c, {}).get("calls", 0), "usec": v["usec"] - k * idle.get(c, {}).get("usec", 0)}
           for c, v in delta.items()}
    for link, _ in links:
        link.close()
    eid = links[-1][1]
    sample = {}
    for key in r.scan_iter(match=f"*{eid}*", count=1000):
        name = key.decode()
        t = r.type(key).decode()
        sample[name.replace(eid, "<id>")] = [t, r.memory_usage(key, samples=0)]
    n = endpoints
    return {"endpoints": n, "heartbeat_stats_bytes": len(json.dumps(stats)),
            "used_memory_bytes_per_endpoint": round((mem1 - mem0) / n),
            "store_bytes_per_endpoint": round((keys1["store"] - keys0["store"]) / n),
            "queue_bytes_per_endpoint": round((keys1["queue"] - keys0["queue"]) / n),
            "keys_per_endpoint": round((keys1["keys"] - keys0["keys"]) / n, 2),
            # per heartbeat, the runtime's own periodic work over the same time subtracted
            "redis_cpu_us_per_heartbeat": round((cpu1 - cpu0 - k * idle_cpu) / (n * beats) * 1e6, 2),
            "redis_commands_per_heartbeat": round(sum(v["calls"] for v in own.values()) / (n * beats), 2),
            "heartbeats_per_s": round(n * beats / elapsed, 1),
            "redis_connections_per_heartbeat": round(conns / (n * beats), 3),
            "heartbeat_commands": {c: [round(v["calls"] / (n * beats), 2), round(v["usec"] / (n * beats), 2)]
                                   for c, v in sorted(own.items()) if abs(v["calls"]) / (n * beats) >= 0.05},
            # the runtime's periodic work with the fleet registered (the reaper walks every endpoint)
            "idle_fleet_redis_cpu_percent": round(idle_cpu / idle_s * 100, 2),
            "idle_fleet_commands_per_s": round(sum(v["calls"] for v in idle.values()) / idle_s, 1),
            "keys_of_one": sample}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.hot_store", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=20_000, help="0: the idle endpoints only")
    ap.add_argument("--endpoints", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--idle-s", type=float, default=10.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from benchmarks.embedded import embedded_runtime

    with embedded_runtime("skyfn-hot-store-", {"workers": args.workers, "log_level": "WARNING"}) as home:
        result = {"per_task": measure_tasks(home, args.tasks, args.idle_s) if args.tasks else None,
                  "idle_endpoint": measure_idle_endpoints(home, args.endpoints, idle_s=args.idle_s)}
    t, e = result["per_task"], result["idle_endpoint"]
    if t:
        print(f"redis {t['redis_version']}: {t['tasks']:,} tasks at {t['tasks_per_s']:,}/s, redis main thread "
              f"{t['redis_cpu_percent']} % of a core (idle {t['idle_cpu_percent']} %): {t['redis_cpu_us_per_task']} us/task, "
              f"{t['commands_per_task']} commands/task ({t['store_commands_per_task']} hot store), store share "
              f"{t['store_share']} -> {t['store_cpu_us_per_task']} us/task; one core at "
              f"{t['saturation_tasks_per_s']} tasks/s (hot store alone: {t['saturation_tasks_per_s_store']})")
    print(f"idle endpoint ({e['endpoints']} registered + heartbeat): used_memory {e['used_memory_bytes_per_endpoint']} B, "
          f"hot-store keys {e['store_bytes_per_endpoint']} B, queue keys {e['queue_bytes_per_endpoint']} B, "
          f"{e['keys_per_endpoint']} keys; a heartbeat: {e['redis_commands_per_heartbeat']} commands, "
          f"{e['redis_cpu_us_per_heartbeat']} us of redis CPU, {e['redis_connections_per_heartbeat']} new connections "
          f"({e['heartbeats_per_s']}/s)")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
