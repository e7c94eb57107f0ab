"""Multi-site placement on the embedded runtime: endpoint groups and aAPP policies with
three real endpoint agents (issue 6).

    .venv/bin/python -m benchmarks.placement_sites [--json] [--scenario all|stream|affinity]
        [--rate 28] [--seconds 20] [--divides 100]

Starts the embedded service (redis-server, moto, gateway; no endpoint 'local') in a private
SKYFN_HOME and three endpoint agents, `fast`, `medium` and `slow`, each with 2 workers.
Each agent (and so its workers) gets its own site directory in SKYFN_BENCH_SITE_DIR and a
slowdown in SKYFN_BENCH_SLOWDOWN (1, 2, 4): a task that sleeps 0.1 s on `fast` sleeps
0.4 s on `slow`. The scheduler is told nothing about speeds; it sees backlog only.

stream (Balsam's multi-site distribution): a steady stream of `--rate` tasks/s for
`--seconds` s goes to an endpoint group whose policy is `round_robin` in one run and
`shortest_backlog` in the other (a fresh group each, same stream). Reported per site:
tasks received, throughput while the stream ran (completions in the window / window),
and overall makespan and mean/p95 latency (CREATED -> DONE, from the task events).

affinity (the aAPP paper's divide/impera/heavy scenario, emulated): sites of equal speed.
`heavy` holds its site's node lock (SKYFN_BENCH_SITE_DIR/node.lock) while it runs;
`impera` publishes a 4 MiB dataset in its site directory while it runs; `divide` needs
that dataset: where an `impera` runs it reads it from local disk, elsewhere it must
rebuild it (~0.1-0.2 s of CPU: what fetching and preparing it costs without co-location).
One `heavy` and one `impera` are started through the group (heavy keeps away from
divide/impera, impera from heavy), then `--divides` divide tasks at 5/s:
  - anti-affinity only:  divide: [{workers: *, affinity: !heavy}]
  - with affinity:       divide: [{workers: *, affinity: [impera, !heavy]}, {workers: *, affinity: !heavy}]
Reported: mean, median and p95 latency of divide (CREATED -> DONE) and how many found
the data local. The paper reports -40% mean latency with affinity.

The last line printed with --json is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

SITES = {"fast": 1, "medium": 2, "slow": 4}   # name -> slowdown
WORKERS = 2
FINAL = {"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED"}


# --- the functions (sent by value; they import what they use) ---------------------------
def stream_task(base: float) -> str:
    import os
    import time

    time.sleep(base * float(os.environ.get("SKYFN_BENCH_SLOWDOWN", "1")))
    return os.environ.get("SKYFN_BENCH_SITE", "?")


def heavy(seconds: float) -> str:
    import fcntl
    import os
    import time

    site = os.environ["SKYFN_BENCH_SITE_DIR"]
    with open(os.path.join(site, "node.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        end = time.time() + seconds
        while time.time() < end and not os.path.exists(os.path.join(site, "stop")):
            time.sleep(0.05)
    return os.environ.get("SKYFN_BENCH_SITE", "?")


def impera(seconds: float) -> str:
    import os
    import time
    import uuid

    site = os.environ["SKYFN_BENCH_SITE_DIR"]
    path = os.path.join(site, f"impera-{uuid.uuid4().hex}.bin")
    with open(path + ".tmp", "wb") as f:
        f.write(os.urandom(4 << 20))
    os.replace(path + ".tmp", path)
    try:
        end = time.time() + seconds
        while time.time() < end and not os.path.exists(os.path.join(site, "stop")):
            time.sleep(0.05)
    finally:
        os.unlink(path)
    return os.environ.get("SKYFN_BENCH_SITE", "?")


def divide(rounds: int) -> tuple:
    import fcntl
    import glob
    import hashlib
    import os

    site = os.environ["SKYFN_BENCH_SITE_DIR"]
    with open(os.path.join(site, "node.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # waits while a heavy function holds the node
        local = sorted(glob.glob(os.path.join(site, "impera-*.bin")))
        data = None
        if local:
            try:
                with open(local[0], "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                data = None
        found = data is not None
        if data is None:  # not co-located: rebuild the dataset
            h = hashlib.sha256(b"seed")
            chunks = []
            for i in range(rounds):
                h.update(i.to_bytes(4, "little"))
                chunks.append(h.digest())
            data = b"".join(chunks)
        return os.environ.get("SKYFN_BENCH_SITE", "?"), found, hashlib.sha256(data).hexdigest()[:8]


# --- runtime ----------------------------------------------------------------------------
class Sites:
    """The embedded service plus one endpoint agent per site, in a private SKYFN_HOME."""

    def __init__(self, sites: dict[str, int]):
        self.sites = sites
        self.home = Path(tempfile.mkdtemp(prefix="skyfn-sites-"))
        self.dirs = {name: self.home / "site-data" / name for name in sites}

    def __enter__(self) -> "Sites":
        from infra.local import runtime
        from infra.local.agent import endpoint_command
        from infra.local.standins.lambda_pool import REPO_ROOT, child_env

        os.environ["SKYFN_HOME"] = str(self.home)
        runtime.up(self.home, detach=True, endpoint=False, echo=lambda *_: None)
        for name, slowdown in self.sites.items():
            cfg = self.home / "endpoints" / name
            cfg.mkdir(parents=True, exist_ok=True)
            (cfg / "config.yaml").write_text(yaml.safe_dump({"workers": WORKERS, "heartbeat_period": 0.5}))
            self.dirs[name].mkdir(parents=True, exist_ok=True)
            env = child_env({"SKYFN_HOME": str(self.home), "SKYFN_BENCH_SITE": name,
                             "SKYFN_BENCH_SITE_DIR": str(self.dirs[name]), "SKYFN_BENCH_SLOWDOWN": str(slowdown)})
            out = subprocess.run(endpoint_command() + ["start", name], env=env, cwd=str(REPO_ROOT),
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
            if out.returncode != 0:
                raise RuntimeError(f"agent {name} did not start: {(out.stderr or out.stdout).strip()[-500:]}")
        return self

    def wait_online(self, client, timeout: float = 60.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            eps = {e["name"]: e for e in client.list_endpoints()}
            if all(eps.get(n, {}).get("status") == "online" for n in self.sites):
                return {n: eps[n]["endpoint_id"] for n in self.sites}
            if time.monotonic() > deadline:
                raise RuntimeError(f"endpoints not online after {timeout} s: "
                                   f"{ {n: eps.get(n, {}).get('status') for n in self.sites} }")
            time.sleep(0.3)

    def __exit__(self, *exc) -> None:
        from infra.local import agent, runtime

        for name in self.sites:
            (self.dirs[name] / "stop").touch()
            agent.stop(name, self.home)
        runtime.down(self.home, echo=lambda *_: None)


def wait_final(client, ids: list[str], timeout: float = 600.0) -> dict[str, dict]:
    done: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    while len(done) < len(ids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(ids) - len(done)} tasks not final after {timeout} s")
        pending = [t for t in ids if t not in done]
        for i in range(0, len(pending), 5000):
            answer = client.status(pending[i:i + 5000], wait=1.0, include_events=True)
            for tid, st in answer["tasks"].items():
                if st["state"] in FINAL:
                    done[tid] = st
    return done


def event(st: dict, name: str) -> float:
    for n, ts in st.get("events") or []:
        if n == name:
            return ts
    raise KeyError(f"no {name} event in {st.get('events')}")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def result_of(st: dict):
    from skyfn.protocol import deserialize

    return deserialize(st["result"])


# --- scenario 1: steady stream, round-robin vs shortest-backlog ---------------------------
def run_stream(client, eps: dict[str, str], strategy: str, rate: float, seconds: float, echo) -> dict:
    members = [{"endpoint_id": eps[n], "name": n} for n in SITES]
    group = client.create_group(f"stream-{strategy}", members,
                                policy=f"default:\n  - workers: \"*\"\n    strategy: {strategy}\n")
    fid = client.register_function(stream_task)
    from skyfn.protocol import pack_args

    payload = pack_args((0.1,), {})
    ids: list[str] = []
    t0 = time.time()
    due = 0.0
    tick = 0.1
    n_total = int(rate * seconds)
    while len(ids) < n_total:
        elapsed = time.time() - t0
        due = min(n_total, int(rate * (elapsed + tick)))
        n = due - len(ids)
        if n > 0:
            ids += client.submit_tasks([{"function_id": fid, "payload": payload}] * n, group_id=group["group_id"])
        time.sleep(max(0.0, t0 + (elapsed + tick) - time.time()))
    t_end = t0 + seconds
    final = wait_final(client, ids)
    by_site: dict[str, list[dict]] = {n: [] for n in SITES}
    for tid in ids:
        st = final[tid]
        if st["state"] != "SUCCEEDED":
            raise RuntimeError(f"task {tid} ended {st['state']}: {st.get('reason')}")
        by_site[result_of(st)].append(st)
    done_all = max(event(st, "DONE") for st in final.values())
    lat = [event(st, "DONE") - event(st, "CREATED") for st in final.values()]
    out = {"strategy": strategy, "tasks": len(ids), "makespan_s": round(done_all - t0, 2),
           "latency_mean_s": round(statistics.mean(lat), 3), "latency_p95_s": round(pct(lat, 0.95), 3)}
    for name, sts in by_site.items():
        in_window = sum(1 for st in sts if event(st, "DONE") <= t_end)
        out[f"{name}_tasks"] = len(sts)
        out[f"{name}_throughput_per_s"] = round(in_window / seconds, 2)
    out["total_throughput_per_s"] = round(sum(out[f"{n}_throughput_per_s"] for n in SITES), 2)
    echo(f"  {strategy:<16} makespan {out['makespan_s']:6.1f} s  latency mean {out['latency_mean_s']:.2f} s "
         f"p95 {out['latency_p95_s']:.2f} s  | " + "  ".join(
             f"{n}: {out[f'{n}_tasks']} tasks, {out[f'{n}_throughput_per_s']:.1f}/s" for n in SITES))
    return out


# --- scenario 2: divide / impera / heavy ---------------------------------------------------
AFFINITY_POLICIES = {
    "anti_affinity_only": """
divide:
  - workers: *
    affinity: !heavy
""",
    "affinity": """
divide:
  - workers: *
    affinity: impera, !heavy
  - workers: *
    affinity: !heavy
""",
}
COMMON = """
impera:
  - workers: *
    strategy: best_first
    affinity: !heavy, !impera
heavy:
  - workers: *
    strategy: best_first
    affinity: !divide, !impera, !heavy
"""


def run_affinity(client, eps: dict[str, str], sites: Sites, variant: str, divides: int, rounds: int, echo) -> dict:
    members = [{"endpoint_id": eps[n], "name": n} for n in SITES]
    group = client.create_group(f"dih-{variant}", members, policy=AFFINITY_POLICIES[variant] + COMMON)
    gid = group["group_id"]
    f_heavy = client.register_function(heavy, tag="heavy")
    f_impera = client.register_function(impera, tag="impera")
    f_divide = client.register_function(divide, tag="divide")
    for d in sites.dirs.values():
        (d / "stop").unlink(missing_ok=True)
    t_heavy = client.run(f_heavy, 600.0, group_id=gid)
    t_impera = client.run(f_impera, 600.0, group_id=gid)
    # both must be running (their sites known to the group's load) before divides arrive
    deadline = time.monotonic() + 60
    while True:
        info = client.get_group(gid)
        states = [client.get_task(t)["state"] for t in (t_heavy, t_impera)]
        if states == ["RUNNING", "RUNNING"] and any(sites.dirs[n].glob("impera-*.bin") for n in SITES):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"heavy/impera not running: {states}")
        time.sleep(0.2)
    placed = {m["name"]: m["tags"] for m in info["members"]}
    ids = []
    for _ in range(divides):
        ids.append(client.run(f_divide, rounds, group_id=gid))
        time.sleep(0.2)
    final = wait_final(client, ids)
    lat, found, where = [], 0, {}
    for tid in ids:
        st = final[tid]
        if st["state"] != "SUCCEEDED":
            raise RuntimeError(f"divide {tid} ended {st['state']}: {st.get('reason')}")
        site, local, _ = result_of(st)
        found += bool(local)
        where[site] = where.get(site, 0) + 1
        lat.append(event(st, "DONE") - event(st, "CREATED"))
    for d in sites.dirs.values():
        (d / "stop").touch()
    wait_final(client, [t_heavy, t_impera], timeout=60)
    out = {"variant": variant, "divides": divides, "mean_ms": round(1000 * statistics.mean(lat), 1),
           "median_ms": round(1000 * statistics.median(lat), 1), "p95_ms": round(1000 * pct(lat, 0.95), 1),
           "data_local": found, "divide_sites": where,
           "heavy_site": next((n for n, t in placed.items() if "heavy" in t), None),
           "impera_site": next((n for n, t in placed.items() if "impera" in t), None)}
    echo(f"  {variant:<19} divide latency mean {out['mean_ms']:7.1f} ms  median {out['median_ms']:7.1f} ms  "
         f"p95 {out['p95_ms']:7.1f} ms  data local {found}/{divides}  sites {where}  "
         f"(heavy on {out['heavy_site']}, impera on {out['impera_site']})")
    return out


def calibrate_rounds(target_s: float = 0.15) -> int:
    """Rounds of divide's rebuild that take about target_s here."""
    import hashlib

    n, t = 20000, 0.0
    while True:
        t0 = time.perf_counter()
        h = hashlib.sha256(b"seed")
        for i in range(n):
            h.update(i.to_bytes(4, "little"))
            h.digest()
        t = time.perf_counter() - t0
        if t > 0.02:
            return max(1000, int(n * target_s / t))
        n *= 2


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--scenario", choices=("all", "stream", "affinity"), default="all")
    ap.add_argument("--rate", type=float, default=28.0, help="stream: tasks per second (capacity is 35/s)")
    ap.add_argument("--seconds", type=float, default=20.0, help="stream: duration")
    ap.add_argument("--divides", type=int, default=100)
    args = ap.parse_args(argv)
    from skyfn import Client

    result: dict = {"sites": SITES, "workers_per_site": WORKERS}
    with Sites(SITES) as sites:
        with Client() as client:
            eps = sites.wait_online(client)
            if args.scenario in ("all", "stream"):
                print(f"stream: {args.rate:g} tasks/s for {args.seconds:g} s; task = 0.1 s x slowdown "
                      f"{SITES} on {WORKERS} workers per site (capacity 20 + 10 + 5 = 35/s)")
                rr = run_stream(client, eps, "round_robin", args.rate, args.seconds, print)
                time.sleep(2)
                sb = run_stream(client, eps, "shortest_backlog", args.rate, args.seconds, print)
                result["stream"] = {"round_robin": rr, "shortest_backlog": sb,
                                    "fastest_site_throughput_gain": round(
                                        sb["fast_throughput_per_s"] / rr["fast_throughput_per_s"] - 1, 3),
                                    "makespan_reduction": round(1 - sb["makespan_s"] / rr["makespan_s"], 3)}
                print(f"  shortest_backlog vs round_robin: fastest site throughput "
                      f"{100 * result['stream']['fastest_site_throughput_gain']:+.0f}% (Balsam: +16%), makespan "
                      f"{-100 * result['stream']['makespan_reduction']:+.0f}%")
            if args.scenario in ("all", "affinity"):
                rounds = calibrate_rounds()
                print(f"affinity: divide/impera/heavy, {args.divides} divides at 5/s; rebuild = {rounds} rounds")
                anti = run_affinity(client, eps, sites, "anti_affinity_only", args.divides, rounds, print)
                aff = run_affinity(client, eps, sites, "affinity", args.divides, rounds, print)
                result["affinity"] = {"anti_affinity_only": anti, "affinity": aff,
                                      "mean_change": round(aff["mean_ms"] / anti["mean_ms"] - 1, 3),
                                      "median_change": round(aff["median_ms"] / anti["median_ms"] - 1, 3),
                                      "p95_change": round(aff["p95_ms"] / anti["p95_ms"] - 1, 3)}
                print(f"  affinity vs anti-affinity only: mean {100 * result['affinity']['mean_change']:+.0f}% "
                      f"(paper: -40%), median {100 * result['affinity']['median_change']:+.0f}%, p95 "
                      f"{100 * result['affinity']['p95_change']:+.0f}%")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
