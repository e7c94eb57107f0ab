"""The communicator through real NATs against its baselines, on one machine.

    .venv/bin/python -m benchmarks.comm [--json] [--repeats 3] [--ranks 2,4,8]
        [--iperf-seconds 4] [--pairing-seconds 3] [--coll-iters 20]

Needs root (network namespaces). Topology (tests/comm/netns.py): every rank in its own
namespace behind its own NAT router (iptables MASQUERADE, unsolicited inbound dropped);
the rendezvous server and a redis-server in the "public" namespace. Every figure between
two peers crosses the same path: peer A -> NAT router A -> public bridge -> NAT router B
-> peer B.

- bandwidth: the punched channel (24 messages of 64 MiB, timed to the receiver's ack)
  vs iperf3 (one TCP stream, 4 s). iperf3 cannot punch, so the server's port is
  forwarded on router B (iptables DNAT, what a user does on a home router): the client
  in A connects to router B's public address, so its packets take the same hops and the
  same conntrack/NAT translations as the punched connection (whose packets router B
  translates as replies of B's own outgoing SYN).
- latency: 1-byte round trips through the Python API (send + recv), vs a plain C TCP
  socket ping-pong (benchmarks/pingpong.c, compiled here with cc -O2, TCP_NODELAY, port
  forwarded the same way); medians of 20,000 round trips after 1,000 warm-up rounds.
- transfers of 1 MiB and 64 MiB from rank 0 to rank 1 and a 1-byte ack back, direct vs
  with Redis as the only medium, as functions that cannot reach each other exchange
  data: rank 0 SETs the value and LPUSHes a notice (one pipelined round trip), rank 1
  BRPOPs it, GETs the value and LPUSHes an ack that rank 0 BRPOPs. redis-server in the
  public namespace without persistence (the most favourable to Redis), redis-py with
  hiredis; medians.
- for comparison, the same pair relayed by the rendezvous server (allow_direct=False):
  bandwidth, round trip, 1 MiB transfer.
- pairings per second of the rendezvous server (rendezvous.bench.pairings_per_second,
  load from the public namespace).
- allreduce (8 B and 8 MiB of float64) and alltoall (64 KiB and 1 MiB per destination)
  on 2, 4 and 8 ranks, each rank behind its own NAT: median of the slowest rank.

Best of --repeats runs for iperf3, the C ping-pong and the communicator alike.
The last stdout line is one JSON object (keys below); a table is printed before it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rendezvous import make_token
from tests.comm.natgroup import spawn_ranks, start_rendezvous
from tests.comm.netns import NatTopology, namespaces_unavailable_reason, wait_listening

HERE = Path(__file__).resolve().parent
RDV_PORT = 7300
IPERF_PORT = 5201
PING_PORT = 7100
REDIS_PORT = 6379
TARGETS = {"bw_ratio_vs_iperf3": (">=", 0.9), "rtt_ratio_vs_socket": ("<=", 1.2),
           "speedup_vs_redis_1mib": (">=", 10.0), "pairings_per_s": (">=", 2000.0)}


def compile_pingpong(workdir: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc): run scripts/install-system.sh")
    out = workdir / "pingpong"
    subprocess.run([cc, "-O2", "-Wall", "-o", str(out), str(HERE / "pingpong.c")], check=True)
    return out


def iperf3_gbit(topo: NatTopology, seconds: float) -> float:
    a, b = topo.sites[0], topo.sites[1]
    server = topo.spawn(b.ns, ["iperf3", "-s", "-1", "-p", str(IPERF_PORT)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(topo, b.ns, IPERF_PORT, proc=server)
    out = topo.run(a.ns, ["iperf3", "-c", b.public_ip, "-p", str(IPERF_PORT), "-t", str(seconds), "-J"],
                   timeout=seconds + 30).stdout
    server.wait(10)
    return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e9


def c_pingpong(topo: NatTopology, binary: Path, iters: int = 20000) -> dict:
    a, b = topo.sites[0], topo.sites[1]
    server = topo.spawn(b.ns, [str(binary), "server", str(PING_PORT)])
    wait_listening(topo, b.ns, PING_PORT, proc=server)
    out = topo.run(a.ns, [str(binary), "client", b.public_ip, str(PING_PORT), str(iters)], timeout=120).stdout
    server.wait(10)
    return json.loads(out)


def start_redis(topo: NatTopology, workdir: Path) -> subprocess.Popen:
    from infra.local.processes import redis_server_binary

    proc = topo.spawn(topo.public_ns, [redis_server_binary(), "--bind", topo.public_ip, "--port", str(REDIS_PORT),
                                       "--save", "", "--appendonly", "no", "--protected-mode", "no",
                                       "--dir", str(workdir), "--logfile", str(workdir / "redis.log")],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(topo, topo.public_ns, REDIS_PORT, proc=proc)
    return proc


def _ranks(topo, sites, secret: str, group: str, args_for, timeout: float) -> dict:
    """Run benchmarks.comm_peer on `sites`; rank 0's JSON figures (any rank's error raises)."""
    env = {"SKYFN_BENCH_TOKEN": make_token(secret, group),
           "SKYFN_BENCH_RELAY_TOKEN": make_token(secret, group + ".relay")}
    readers = spawn_ranks(topo, sites, "benchmarks.comm_peer", args_for, env)
    deadline = time.monotonic() + timeout
    result = {}
    for r in readers:
        code = r.proc.wait(max(1.0, deadline - time.monotonic()))
        try:
            got = r.json(1)
        except RuntimeError:  # ended without a JSON line: a rank other than 0 that succeeded
            if code != 0:
                raise
            continue
        if "error" in got:
            raise RuntimeError(got["error"] + "\n" + got.get("trace", ""))
        result.update(got)
    return result


def comm_pair(topo: NatTopology, secret: str, repeats: int) -> dict:
    group = f"bench.pair.{time.time_ns()}"
    rdv = f"{topo.public_ip}:{RDV_PORT}"
    return _ranks(topo, topo.sites[:2], secret, group,
                  lambda s: ["pair", rdv, group, s.index, topo.public_ip, repeats], timeout=900)


def comm_collectives(topo: NatTopology, secret: str, n: int, iters: int) -> dict:
    group = f"bench.coll{n}.{time.time_ns()}"
    rdv = f"{topo.public_ip}:{RDV_PORT}"
    return _ranks(topo, topo.sites[:n], secret, group, lambda s: ["coll", rdv, group, n, iters], timeout=600)


def pairings(topo: NatTopology, secret: str, seconds: float) -> float:
    code = ("import sys; from rendezvous.bench import pairings_per_second as f; "
            f"print(f({topo.public_ip!r}, {RDV_PORT}, sys.stdin.readline().strip(), seconds={seconds}))")
    proc = topo.python(topo.public_ns, ["-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(secret + "\n", timeout=seconds + 120)
    if proc.returncode != 0:
        raise RuntimeError(f"pairing benchmark failed: {err[-2000:]}")
    return float(out.strip().splitlines()[-1])


def _meets(key: str, value: float) -> bool:
    op, target = TARGETS[key]
    return value >= target if op == ">=" else value <= target


def run(args) -> dict:
    ranks = sorted({int(x) for x in args.ranks.split(",")})
    secret = os.urandom(16).hex()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-comm-") as tmp, NatTopology(max([2] + ranks)) as topo:
        tmp = Path(tmp)
        binary = compile_pingpong(tmp)
        b = topo.sites[1]
        topo.forward_port(b, IPERF_PORT)
        topo.forward_port(b, PING_PORT)
        start_rendezvous(topo, secret, RDV_PORT, join_timeout_s=120)
        start_redis(topo, tmp)
        iperf = [iperf3_gbit(topo, args.iperf_seconds) for _ in range(args.repeats)]
        pings = [c_pingpong(topo, binary) for _ in range(args.repeats)]
        pair = comm_pair(topo, secret, args.repeats)
        pps = max(pairings(topo, secret, args.pairing_seconds) for _ in range(args.repeats))
        coll = {n: comm_collectives(topo, secret, n, args.coll_iters) for n in ranks}
    c_rtt = min(p["rtt_us_median"] for p in pings)
    out = {
        "bw_ratio_vs_iperf3": round(pair["bw_gbit"] / max(iperf), 3),
        "rtt_ratio_vs_socket": round(pair["rtt_us_median"] / c_rtt, 3),
        "speedup_vs_redis_1mib": round(pair["redis_1mib_ms"] / pair["direct_1mib_ms"], 2),
        "speedup_vs_redis_64mib": round(pair["redis_64mib_ms"] / pair["direct_64mib_ms"], 2),
        "pairings_per_s": round(pps, 1),
        "comm_bw_gbit": round(pair["bw_gbit"], 3), "iperf3_bw_gbit": round(max(iperf), 3),
        "comm_bw_gbit_runs": [round(x, 3) for x in pair["bw_gbit_runs"]],
        "iperf3_bw_gbit_runs": [round(x, 3) for x in iperf],
        "comm_rtt_us_median": round(pair["rtt_us_median"], 2), "comm_rtt_us_min": round(pair["rtt_us_min"], 2),
        "socket_rtt_us_median": round(c_rtt, 2), "socket_rtt_us_min": round(min(p["rtt_us_min"] for p in pings), 2),
        "comm_rtt_us_median_runs": [round(x, 2) for x in pair["rtt_us_median_runs"]],
        "socket_rtt_us_median_runs": [p["rtt_us_median"] for p in pings],
        **{k: round(pair[k], 3) for k in ("direct_1mib_ms", "redis_1mib_ms", "direct_64mib_ms", "redis_64mib_ms")},
        "pair_modes": sorted({s["mode"] for s in pair["stats"].values()}),
        "relay_bw_gbit": round(pair["relay_bw_gbit"], 3), "relay_rtt_us_median": round(pair["relay_rtt_us_median"], 2),
        "relay_1mib_ms": round(pair["relay_1mib_ms"], 3),
        "relay_modes": sorted({s["mode"] for s in pair["relay_stats"].values()}),
        "collectives": {str(n): {k: (round(v, 3) if isinstance(v, float) else v) for k, v in c.items()}
                        for n, c in coll.items()},
        "repeats": args.repeats, "load_avg_1m_at_start": round(load, 2),
    }
    out["targets_met"] = {k: _meets(k, out[k]) for k in TARGETS}
    return out


def table(r: dict) -> str:
    rows = [
        ("bandwidth, punched channel vs iperf3", f"{r['comm_bw_gbit']:.2f} vs {r['iperf3_bw_gbit']:.2f} Gbit/s",
         f"{r['bw_ratio_vs_iperf3']:.2f}x (target >= 0.9)"),
        ("1-byte round trip, comm vs C socket (median)",
         f"{r['comm_rtt_us_median']:.1f} vs {r['socket_rtt_us_median']:.1f} us",
         f"{r['rtt_ratio_vs_socket']:.2f}x (target <= 1.2)"),
        ("1 MiB transfer, direct vs Redis", f"{r['direct_1mib_ms']:.2f} vs {r['redis_1mib_ms']:.2f} ms",
         f"{r['speedup_vs_redis_1mib']:.1f}x faster (target >= 10)"),
        ("64 MiB transfer, direct vs Redis", f"{r['direct_64mib_ms']:.1f} vs {r['redis_64mib_ms']:.1f} ms",
         f"{r['speedup_vs_redis_64mib']:.1f}x faster"),
        ("rendezvous pairings", f"{r['pairings_per_s']:.0f} /s", "target >= 2000"),
        ("same pair relayed by the rendezvous server", f"{r['relay_bw_gbit']:.2f} Gbit/s",
         f"RTT {r['relay_rtt_us_median']:.1f} us, 1 MiB {r['relay_1mib_ms']:.2f} ms"),
    ]
    lines = [f"{a:<46} {b:<28} {c}" for a, b, c in rows]
    lines.append("")
    lines.append(f"{'ranks':<6} {'allreduce 8 B':>14} {'allreduce 8 MiB':>16} {'alltoall 64 KiB':>16} "
                 f"{'alltoall 1 MiB':>15}  (ms, median of slowest rank; modes)")
    for n, c in r["collectives"].items():
        lines.append(f"{n:<6} {c['allreduce_8b_ms']:>14.3f} {c['allreduce_8mib_ms']:>16.3f} "
                     f"{c['alltoall_64kib_ms']:>16.3f} {c['alltoall_1mib_ms']:>15.3f}  {','.join(c['modes'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks.comm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="end with one JSON line (always printed last)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--iperf-seconds", type=float, default=4.0)
    ap.add_argument("--pairing-seconds", type=float, default=3.0)
    ap.add_argument("--coll-iters", type=int, default=20)
    args = ap.parse_args(argv)
    reason = namespaces_unavailable_reason()
    if reason:
        print(json.dumps({"error": f"benchmarks.comm needs network namespaces: {reason}"}))
        return 1
    result = run(args)
    print(table(result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
