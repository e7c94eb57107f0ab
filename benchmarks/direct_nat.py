"""Direct sessions from behind a NAT to an agent behind another: what each path costs.

    python -m benchmarks.direct_nat [--json] [--samples 300] [--tasks 2000]     (root)

Builds the network-namespace NAT lab itself (tests/comm/netns.py) and removes it at the
end: the rendezvous server on the public side, an agent (a real interchange, two worker
processes; tests/comm/direct_nat_peer.py) behind one NAT with `direct: {reach: auto}`
and its port forwarded by its router (as a user would open one), and two SDK hosts behind
NATs of their own, one of them symmetric. In the same run, with the same agent:

- tcp: the session connects to the agent's forwarded address (`direct_via="address"`);
- punched: through the rendezvous server, punched (`direct_via="rendezvous"`);
- relayed: from the symmetric NAT, where punching cannot work: relayed by the server.

For each: `path_setup_s` (the session opened to its first result, path included), the
round trip p50 of one task at a time over `--samples` tasks (in rounds of 50, the three
paths' rounds interleaved: a slow spell of a shared machine hits them all alike), and a
batch of `--tasks`.
Reported: `punched_over_tcp_rtt_p50` and `relayed_over_tcp_rtt_p50` (ratios of round-trip
p50s, same run) and `relay_bytes_per_task` (bytes through the relay, both ways, per task,
the session's handshake included).
"""
from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.comm.natgroup import LineReader, start_rendezvous
from tests.comm.netns import NatTopology, namespaces_unavailable_reason

PORT = 7300
AGENT_PORT = 5601


PATHS = (("tcp", 0, "address"), ("punched", 0, "rendezvous"), ("relayed", 2, "rendezvous"))  # (path, site, via)


def start_sdk(topo: NatTopology, site, address: str, env: dict, info: dict, via: str, samples: int, rounds: int,
              tasks: int) -> LineReader:
    proc = topo.python(site.ns, ["-m", "tests.comm.direct_nat_peer", "sdk", address], env=env, stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdin.write(json.dumps({"agent": info, "via": via, "rtt_samples": samples, "rtt_rounds": rounds,
                                 "tasks": tasks}) + "\n")
    proc.stdin.flush()
    return LineReader(proc)


def turn(sdk: LineReader) -> list[float]:
    """One round of round trips of this SDK (the others wait): its samples."""
    sdk.proc.stdin.write("go\n")
    sdk.proc.stdin.flush()
    return sdk.json(300)["rtts"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=300, help="round trips timed per path")
    ap.add_argument("--tasks", type=int, default=2000, help="tasks of the batch per path")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    reason = namespaces_unavailable_reason()
    if reason:
        sys.exit(f"benchmarks.direct_nat needs network namespaces: {reason}")
    secret = secrets.token_hex(16)
    env = {"SKYFN_RENDEZVOUS_SECRET": secret}
    results = {}
    with NatTopology(3, symmetric=[False, False, True]) as topo, tempfile.TemporaryDirectory() as tmp:
        sdk, agent_site, sym_sdk = topo.sites
        start_rendezvous(topo, secret, PORT)
        address = f"{topo.public_ip}:{PORT}"
        topo.forward_port(agent_site, AGENT_PORT)
        agent = topo.python(agent_site.ns, ["-m", "tests.comm.direct_nat_peer", "agent", address,
                                            str(Path(tmp) / "agent"), "auto", str(AGENT_PORT), agent_site.public_ip],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        info = LineReader(agent).json(120)
        rounds = max(1, args.samples // 50)
        sdks, rtts, outs = {}, {name: [] for name, _, _ in PATHS}, {}
        for name, site, via in PATHS:  # one at a time: each session's setup alone, then its first round
            sdks[name] = start_sdk(topo, topo.sites[site], address, env, info, via, 50, rounds, args.tasks)
            rtts[name] += turn(sdks[name])
        for r in range(1, rounds):  # the rounds interleaved, the order turning: a slow spell hits every path
            order = PATHS[r % 3:] + PATHS[:r % 3]
            for name, _, _ in order:
                rtts[name] += turn(sdks[name])
        for name, _, _ in PATHS:  # the batches one after the other (each SDK's last step)
            outs[name] = out = sdks[name].json(600)
            if out.get("first") != 1 or not out.get("values_ok"):
                raise RuntimeError(f"the {name} session failed: {out}")
            if out["path"] != name:
                raise RuntimeError(f"expected the {name} path, the session took {out['path']}")
            n = 1 + rounds * 50 + args.tasks
            results[name] = {"path_setup_s": round(out["setup_s"], 4),
                             "rtt_p50_ms": round(statistics.median(rtts[name]) * 1e3, 3),
                             "batch_tasks_per_s": round(args.tasks / out["batch_s"]),
                             "relay_bytes_per_task": round(out["stats"].get("relay_bytes", 0) / n, 1)}
            print(f"{name:8s} setup {results[name]['path_setup_s']:.3f} s   rtt p50 {results[name]['rtt_p50_ms']:.3f} ms"
                  f"   batch {results[name]['batch_tasks_per_s']} tasks/s", flush=True)
        agent.stdin.write("quit\n")
        agent.stdin.flush()
        agent.wait(30)
    tcp = results["tcp"]["rtt_p50_ms"]
    summary = {
        "punched_over_tcp_rtt_p50": round(results["punched"]["rtt_p50_ms"] / tcp, 3),
        "relayed_over_tcp_rtt_p50": round(results["relayed"]["rtt_p50_ms"] / tcp, 3),
        "relay_bytes_per_task": results["relayed"]["relay_bytes_per_task"],
        "path_setup_s": {k: v["path_setup_s"] for k, v in results.items()},
        "paths": results, "samples": args.samples, "tasks": args.tasks,
    }
    print(f"punched/tcp rtt p50 {summary['punched_over_tcp_rtt_p50']:.3f}x   relayed/tcp "
          f"{summary['relayed_over_tcp_rtt_p50']:.3f}x   relay {summary['relay_bytes_per_task']:.0f} bytes/task")
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
