"""The benchmark gate (issue 37): the figures users feel, each a ratio against a peer or a
floor measured in the same run, checked against the limits in benchmarks/gate_limits.yaml.

    python -m benchmarks.gate [--json] [--only agent,e2e,...] [--repeat 2] [--confirm 2] [--accept] [--runs N]

Probes run one after another, each the benchmark a user would run by hand with smaller
sizes, as its own process (the command is printed, and named again when a figure fails):

- agent:    benchmarks.agent, the agent's round trip and throughput against raw ZeroMQ
            (ROUTER -> relay -> DEALER, the floor with a manager hop) and Parsl HTEX
- e2e:      benchmarks.e2e, the round trip through the service (push) and in a direct
            session against HTEX's, the 10,000-task batch against a ProcessPool(2)
- dataflow: benchmarks.dataflow, a chain's edge against Parsl's (DataFlowKernel over HTEX)
- data:     benchmarks.data, a 1 MiB ref put -> resolved in another process, against
            ProxyStore's Redis connector on the same redis-server
- start:    benchmarks.gate_start, `skyfn local up --detach` on a fresh SKYFN_HOME and again on
            the same home (a restart), against Parsl HTEX's start in the agent probe

Each probe runs `--repeat` times (2 by default) and each figure is the better of its values:
a slower run is the machine's noise (another process took a core), a regression is slow
every time. A figure still past its limit is measured again, its probes only, up to
`--confirm` more times (2 by default) and kept at its best: a loss the code made is past the
limit in every run, while a slow minute of a shared 2-core machine passes within one or two
(a 10,000-task batch of the agent lasts 0.1-0.4 s; one stall of another process moves it by
a third). Ratios cancel the machine's speed, so one limits file holds on a slow CI machine
and a fast laptop alike. A figure past its limit after that fails the gate (exit 1) with its
value, its limit and the command that reproduces it. `--accept` writes this run's figures as the accepted ones
(limits move with them by each figure's tolerance): for a change that makes a figure
better, in the same commit. `--runs N` runs the whole gate N times and prints each figure's
spread; with `--calibrate` each figure's median becomes its accepted value and its
tolerance max(1.5, 1.25 x the worst run / the median): how the shipped limits were chosen.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

ROOT = Path(__file__).resolve().parent.parent
LIMITS = Path(__file__).with_name("gate_limits.yaml")
PY = sys.executable


@dataclass(frozen=True)
class Probe:
    name: str
    args: list[str]
    timeout: float

    @property
    def command(self) -> str:
        return " ".join(["python"] + self.args)


PROBES = {p.name: p for p in (
    Probe("agent", ["-m", "benchmarks.agent", "--json", "--only", "interchange,zmq,htex",
                    "--tasks", "10000", "--rtt", "400"], 240),
    Probe("e2e", ["-m", "benchmarks.e2e", "--json", "--tasks", "10000", "--rtt", "300", "--big", "0",
                  "--peers", "pool,parsl"], 300),
    Probe("dataflow", ["-m", "benchmarks.dataflow", "--json", "--chain", "1000", "--fanin", "1000",
                       "--graph", "0", "--peers", "parsl"], 300),
    Probe("data", ["-m", "benchmarks.data", "--json", "--sizes", "1mib", "--skip", "s3,direct,file",
                   "--reps-small", "60"], 120),
    Probe("start", ["-m", "benchmarks.gate_start", "--json"], 180),
)}


@dataclass(frozen=True)
class Figure:
    """ours / peer, each a path into the probes' JSON (probe name first)."""
    name: str
    higher_is_better: bool
    what: str
    ours: tuple[str, ...]
    peer: tuple[str, ...]

    @property
    def probes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.ours[0], self.peer[0])))

    def parts(self, raw: dict) -> tuple[float, float]:
        a, b = _at(raw, self.ours), _at(raw, self.peer)
        if not a or not b:
            raise ValueError(f"{self.name}: a figure is missing ({'.'.join(self.ours)} = {a!r}, "
                             f"{'.'.join(self.peer)} = {b!r})")
        return a, b

    def value(self, raw: dict) -> float:
        a, b = self.parts(raw)
        return round(a / b, 3)


def _at(raw: dict, path: tuple[str, ...]):
    for key in path:
        raw = raw.get(key) if isinstance(raw, dict) else None
    return raw


HTEX_E2E = ("e2e", "peers", "parsl_htex", "rtt_p50_ms")
FIGURES = {f.name: f for f in (
    Figure("agent_rtt_p50_over_zmq_relay", False,
           "agent round trip p50 (interchange -> manager -> worker and back) / raw ZeroMQ through one relay (ms)",
           ("agent", "skyfn_ix_rtt_p50_ms"), ("agent", "zmq_relay_rtt_p50_ms")),
    Figure("agent_rtt_p50_over_htex", False, "agent round trip p50 / Parsl HTEX's (ms)",
           ("agent", "skyfn_ix_rtt_p50_ms"), ("agent", "htex_rtt_p50_ms")),
    Figure("agent_tasks_per_s_over_htex", True, "agent throughput, 10,000 no-ops / Parsl HTEX's (tasks/s)",
           ("agent", "skyfn_ix_tasks_per_s"), ("agent", "htex_tasks_per_s")),
    Figure("agent_tasks_per_s_over_zmq", True, "agent throughput / raw ZeroMQ ROUTER -> DEALERs (tasks/s)",
           ("agent", "skyfn_ix_tasks_per_s"), ("agent", "zmq_tasks_per_s")),
    Figure("service_rtt_p50_over_htex", False,
           "round trip through the embedded service, results pushed / Parsl HTEX's (ms)",
           ("e2e", "rtt_p50_ms"), HTEX_E2E),
    Figure("direct_rtt_p50_over_htex", False, "round trip in a direct session / Parsl HTEX's (ms)",
           ("e2e", "rtt_direct_p50_ms"), HTEX_E2E),
    Figure("batch_10k_over_process_pool", False,
           "10,000-task batch through the service / ProcessPoolExecutor(2), one submit per task (s)",
           ("e2e", "batch_10k_s"), ("e2e", "peers", "process_pool", "batch_s")),
    Figure("chain_edge_over_parsl", False, "a 1,000-task chain's edge / Parsl's (DataFlowKernel over HTEX) (ms)",
           ("dataflow", "chain_edge_ms"), ("dataflow", "peers", "parsl_htex", "chain_edge_ms")),
    Figure("ref_1mib_over_proxystore_redis", False,
           "1 MiB ref, put -> resolved in another process / ProxyStore's Redis connector (ms)",
           ("data", "results", "redis", "1mib", "median_ms"),
           ("data", "results", "proxystore_redis", "1mib", "median_ms")),
    Figure("start_fresh_over_htex_start", False,
           "`skyfn local up --detach`, fresh SKYFN_HOME / Parsl HTEX's start in the agent probe (s)",
           ("start", "fresh_s"), ("agent", "htex_startup_s")),
    Figure("start_restart_over_htex_start", False,
           "`skyfn local up --detach` again on the same home / Parsl HTEX's start in the agent probe (s)",
           ("start", "restart_s"), ("agent", "htex_startup_s")),
)}


def load_limits(path: Path = LIMITS) -> dict:
    data = yaml.safe_load(path.read_text())
    figures = data.get("figures") or {}
    missing = sorted(set(FIGURES) - set(figures))
    extra = sorted(set(figures) - set(FIGURES))
    if missing or extra:
        raise SystemExit(f"{path}: figures without a limit {missing}, limits of no figure {extra}; "
                         "the file and benchmarks/gate.py FIGURES must name the same figures")
    for name, row in figures.items():
        for key in ("accepted", "limit", "tolerance"):
            if not isinstance(row.get(key), (int, float)):
                raise SystemExit(f"{path}: figure {name}: '{key}' must be a number, got {row.get(key)!r}")
    return data


def run_probe(probe: Probe, log) -> dict:
    """Run one probe in its own process; its last stdout line is its JSON summary."""
    print(f"[gate] {probe.name}: {probe.command}", file=log, flush=True)
    t0 = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([PY] + probe.args, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=probe.timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise RuntimeError(f"probe {probe.name} failed (exit {proc.returncode}): {probe.command}\n{tail}")
    print(f"[gate] {probe.name}: {time.monotonic() - t0:.1f} s", file=log, flush=True)
    return json.loads(lines[-1])


def measure(names: list[str], log, repeat: int = 1, parts: dict | None = None) -> dict:
    """Run the probes the named figures need `repeat` times; each figure's best value (and,
    into `parts`, the ours and peer figures it was made of)."""
    wanted = [n for n in PROBES if any(n in FIGURES[f].probes for f in names)]
    best: dict[str, float] = {}
    for _ in range(max(1, repeat)):
        raw = {p: run_probe(PROBES[p], log) for p in wanted}
        for f in names:
            v = FIGURES[f].value(raw)
            better = max if FIGURES[f].higher_is_better else min
            if f not in best or better(best[f], v) != best[f]:
                best[f] = v
                if parts is not None:
                    parts[f] = FIGURES[f].parts(raw)
    return best


def past_limit(values: dict, limits: dict) -> list[str]:
    return [r["figure"] for r in check(values, limits) if not r["ok"]]


def confirm(values: dict, limits: dict, remeasure: Callable[[list[str], dict], dict], attempts: int, log,
            parts: dict | None = None) -> dict:
    """Measure the figures past their limits again (`remeasure(names, parts_out)` -> their
    values), up to `attempts` times; each keeps its best value (and, into `parts`, the ours
    and peer figures of that value). Returns the values, updated."""
    values = dict(values)
    for attempt in range(1, attempts + 1):
        failing = past_limit(values, limits)
        if not failing:
            break
        print(f"[gate] past the limit: {', '.join(failing)}; measuring again ({attempt}/{attempts})",
              file=log, flush=True)
        fresh_parts: dict = {}
        for name, v in remeasure(failing, fresh_parts).items():
            better = max if FIGURES[name].higher_is_better else min
            if better(values[name], v) != values[name]:
                values[name] = v
                if parts is not None and name in fresh_parts:
                    parts[name] = fresh_parts[name]
    return values


def check(values: dict, limits: dict) -> list[dict]:
    rows = []
    for name, value in values.items():
        lim = limits["figures"][name]
        fig = FIGURES[name]
        ok = value >= lim["limit"] if fig.higher_is_better else value <= lim["limit"]
        rows.append({"figure": name, "value": value, "accepted": lim["accepted"], "limit": lim["limit"],
                     "higher_is_better": fig.higher_is_better, "ok": ok,
                     "command": " && ".join(PROBES[p].command for p in fig.probes)})
    return rows


def set_figure(row: dict, name: str, accepted: float, tolerance: float | None = None) -> None:
    """A figure's accepted value, and its limit by its tolerance."""
    tol = row["tolerance"] = tolerance if tolerance is not None else row["tolerance"]
    row["accepted"] = round(accepted, 3)
    row["limit"] = round(accepted / tol if FIGURES[name].higher_is_better else accepted * tol, 3)


def write_limits(path: Path, figures: dict) -> None:
    """The limits file, its comment header kept, one line per figure."""
    header = "".join(ln for ln in path.read_text().splitlines(keepends=True) if ln.startswith("#"))
    lines = [f"  {name}: {{accepted: {r['accepted']}, tolerance: {r['tolerance']}, limit: {r['limit']}}}\n"
             for name, r in figures.items()]
    path.write_text(header + "figures:\n" + "".join(lines))


def accept(values: dict, limits: dict, path: Path = LIMITS) -> None:
    """This run's figures become the accepted ones; each limit keeps its tolerance."""
    figures = yaml.safe_load(path.read_text())["figures"]
    for name, value in values.items():
        set_figure(figures[name], name, value)
    write_limits(path, figures)


MIN_TOLERANCE = 1.5   # no limit closer than 1.5x its accepted figure ...
SPREAD_MARGIN = 1.25  # ... nor closer than 1.25x the worst of the calibration runs


def calibrate(runs: list[dict], path: Path = LIMITS) -> dict:
    """From N runs of the gate: each figure's median becomes its accepted value, its
    tolerance max(MIN_TOLERANCE, SPREAD_MARGIN x worst run / median)."""
    figures = yaml.safe_load(path.read_text())["figures"]
    for name in runs[0]:
        values = [r[name] for r in runs]
        med = statistics.median(values)
        worst = med / min(values) if FIGURES[name].higher_is_better else max(values) / med
        set_figure(figures[name], name, med, round(max(MIN_TOLERANCE, SPREAD_MARGIN * worst), 2))
    write_limits(path, figures)
    return figures


def print_table(rows: list[dict], out, parts: dict | None = None) -> None:
    parts = parts or {}
    print(f"{'figure':34} {'value':>8} {'accepted':>9} {'limit':>8}        {'ours':>10} {'peer':>10}", file=out)
    for r in rows:
        sign = ">=" if r["higher_is_better"] else "<="
        ours, peer = parts.get(r["figure"], ("", ""))
        print(f"{r['figure']:34} {r['value']:8.3f} {r['accepted']:9.3f} {sign}{r['limit']:6.3f}  "
              f"{'ok' if r['ok'] else 'FAIL':4}  {ours:>10} {peer:>10}", file=out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="benchmark regression gate (issue 37)")
    ap.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    ap.add_argument("--only", default="", help="comma-separated figures or probes (default: all)")
    ap.add_argument("--accept", action="store_true", help="write this run's figures as the accepted ones")
    ap.add_argument("--limits", type=Path, default=LIMITS, help=f"the limits file (default {LIMITS.name})")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each probe; a figure is its best (default 2)")
    ap.add_argument("--confirm", type=int, default=2,
                    help="measure a figure past its limit again, up to N times, before failing it (default 2)")
    ap.add_argument("--runs", type=int, default=1, help="run the gate N times and print each figure's spread")
    ap.add_argument("--calibrate", action="store_true",
                    help="with --runs N: write each figure's median as accepted and a tolerance from the spread")
    args = ap.parse_args(argv)
    limits = load_limits(args.limits)
    names = list(FIGURES)
    if args.only:
        picked = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = [s for s in picked if s not in FIGURES and s not in PROBES]
        if unknown:
            ap.error(f"unknown figure or probe {unknown}; figures: {sorted(FIGURES)}; probes: {sorted(PROBES)}")
        names = [f for f in FIGURES if f in picked or any(p in picked for p in FIGURES[f].probes)]
    t0 = time.monotonic()
    runs = []
    parts: dict[str, tuple[float, float]] = {}
    for i in range(max(1, args.runs)):
        values = measure(names, sys.stderr, args.repeat, parts)
        if not (args.accept or args.calibrate):
            values = confirm(values, limits, lambda failing, out: measure(failing, sys.stderr, 1, out),
                             args.confirm, sys.stderr, parts)
        runs.append(values)
        if args.runs > 1:
            print(f"[gate] run {i + 1}: {json.dumps(values)}", file=sys.stderr, flush=True)
    values = {n: statistics.median(r[n] for r in runs) for n in names} if len(runs) > 1 else runs[0]
    rows = check(values, limits)
    print_table(rows, sys.stdout, parts if len(runs) == 1 else None)
    failed = [r for r in rows if not r["ok"]]
    for r in failed:
        word = "below" if r["higher_is_better"] else "above"
        print(f"FAIL {r['figure']} = {r['value']:.3f}, {word} its limit {r['limit']:.3f} "
              f"(accepted {r['accepted']:.3f}; {args.limits}). Reproduce: {r['command']}")
    summary = {"figures": values, "parts": {n: {"ours": a, "peer": b} for n, (a, b) in parts.items()},
               "failed": [r["figure"] for r in failed],
               "seconds": round(time.monotonic() - t0, 1)}
    if len(runs) > 1:
        summary["spread"] = {n: {"min": min(r[n] for r in runs), "max": max(r[n] for r in runs),
                                 "runs": [r[n] for r in runs]} for n in names}
    if args.calibrate:
        calibrate(runs, args.limits)
        print(f"calibrated from {len(runs)} runs: {args.limits}")
    elif args.accept:
        accept(values, limits, args.limits)
        print(f"accepted: {args.limits}")
    if args.json:
        print(json.dumps(summary))
    return 1 if failed and not (args.accept or args.calibrate) else 0


if __name__ == "__main__":
    sys.exit(main())
