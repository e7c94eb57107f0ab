"""The chaos run: many tasks from concurrent SDK clients (separate processes) on the
embedded runtime, while processes of the deployment are killed with SIGKILL at random
intervals and brought back as an operator would (infra/local/recover.py); then a
report of what every task became.

    python -m tests.e2e.chaos --tasks 20000 --clients 4 --json      # make chaos

Victims, in a random order (each kind once per round): a worker (its manager starts another), a manager (the agent
starts another), the agent (restarted with `skyfn-endpoint start local`), redis-server
(restarted on its port; it replays its append-only file) and the service process
(restarted on its port). Kills go on while the clients submit (`pace` seconds) and then
until each kind died `min_kills` times, however long the restarts take (`kills_timeout`
bounds only a victim that never comes back). Clients are plain `skyfn.Executor`s with
default settings.

The report: submitted, completed, failed (grouped by reason), duplicated (a result
delivered twice, a wrong result, or a task with more than one final state in the
service), lost (submitted, never finished), executions and re-executions (from a log
each task appends to before returning: at-least-once execution is allowed), kills.

With `graphs` (`--graphs`, issue 26) the clients submit task graphs instead of independent
tasks: blocks of five, a -> (b, c) -> d -> e (a diamond, then a chain), each task taking
its inputs' futures and returning 1 + their sum. The report adds `edges` and
`ran_before_inputs`: executions of a task that began before any execution of one of its
inputs had ended (from the same log, which then holds each execution's start and end).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VICTIMS = ("worker", "manager", "agent", "redis", "service")


def chaos_task(client, i, log_dir, seconds=0.0):
    """Works `seconds`, appends 'i' to the client's execution log (one line per
    execution), returns [client, i]."""
    import os as _os
    import time as _time

    if seconds:
        _time.sleep(seconds)

    fd = _os.open(_os.path.join(log_dir, f"exec-{client}.log"), _os.O_WRONLY | _os.O_APPEND | _os.O_CREAT, 0o644)
    try:
        _os.write(fd, f"{i}\n".encode())
    finally:
        _os.close(fd)
    return [client, i]


def chaos_node(client, i, log_dir, seconds=0.0, *inputs):
    """A graph's task: works `seconds`, logs 'i start end' (one line per execution), returns
    [client, i, 1 + the sum of its inputs' values]."""
    import os as _os
    import time as _time

    began = _time.time()
    if seconds:
        _time.sleep(seconds)
    value = 1 + sum(v[2] for v in inputs)
    fd = _os.open(_os.path.join(log_dir, f"exec-{client}.log"), _os.O_WRONLY | _os.O_APPEND | _os.O_CREAT, 0o644)
    try:
        _os.write(fd, f"{i} {began:.6f} {_time.time():.6f}\n".encode())
    finally:
        _os.close(fd)
    return [client, i, value]


# Each block of five: index offset -> the offsets of its inputs (a, b(a), c(a), d(b, c), e(d)).
BLOCK = {0: (), 1: (0,), 2: (0,), 3: (1, 2), 4: (3,)}


def graph_inputs(n: int) -> dict[int, tuple[int, ...]]:
    """Task index -> the indices of its inputs, for n tasks in blocks (a short last block keeps its edges)."""
    return {i: tuple(i - i % 5 + k for k in BLOCK[i % 5]) for i in range(n)}


def graph_values(n: int) -> dict[int, int]:
    inputs, values = graph_inputs(n), {}
    for i in range(n):
        values[i] = 1 + sum(values[k] for k in inputs[i])
    return values


# --- one client process --------------------------------------------------------------

def client_main(client: int, n: int, pace_seconds: float, log_dir: str, out: str, timeout: float,
                task_seconds: float = 0.0, graphs: bool = False) -> None:
    """Submit n tasks spread over pace_seconds with a default Executor, wait for every
    future, write {i: outcome} to `out`. With `graphs`, as blocks of a task graph."""
    from skyfn import Executor

    outcomes: dict[int, dict] = {}
    started = time.monotonic()
    inputs = graph_inputs(n) if graphs else {}
    expected = graph_values(n) if graphs else {}
    with Executor(endpoint="local") as ex:
        futures = {}
        chunk = max(1, n // max(1, int(pace_seconds * 5)))
        chunk = chunk + (-chunk) % 5 if graphs else chunk  # whole blocks
        for start in range(0, n, chunk):
            for i in range(start, min(n, start + chunk)):
                if graphs:
                    futures[i] = ex.submit(chaos_node, client, i, log_dir, task_seconds,
                                           *[futures[k] for k in inputs[i]])
                else:
                    futures[i] = ex.submit(chaos_task, client, i, log_dir, task_seconds)
            due = started + pace_seconds * min(n, start + chunk) / n
            time.sleep(max(0.0, due - time.monotonic()))
        submitted_at = time.monotonic()
        deadline = submitted_at + timeout
        for i, fut in futures.items():
            try:
                value = fut.result(timeout=max(0.0, deadline - time.monotonic()))
                want = [client, i, expected[i]] if graphs else [client, i]
                outcomes[i] = {"ok": value == want, "value": value, "task_id": fut.task_id}
            except TimeoutError:
                outcomes[i] = {"pending": True, "task_id": fut.task_id}
            except BaseException as exc:  # noqa: BLE001 - every outcome is reported
                outcomes[i] = {"error": type(exc).__name__, "reason": str(exc)[:500], "task_id": fut.task_id}
        ex.shutdown(wait=False, cancel_futures=False)
    Path(out).write_text(json.dumps({"client": client, "n": n, "outcomes": outcomes,
                                     "seconds": time.monotonic() - started}))
    os._exit(0)  # pending futures must not hold the process


# --- the killer ------------------------------------------------------------------------

class Killer(threading.Thread):
    """Kills a random victim every uniform(*interval) seconds until stopped; restarts what
    the runtime does not restart itself. Records every kill. A victim that is not there at
    its turn (a manager while its agent restarts, the service while its pid file is
    rewritten) is tried again later in the round (up to three times), not skipped; once
    `wanted` is set, rounds hold only the kinds killed fewer times than that."""

    def __init__(self, home: Path, interval: tuple[float, float], victims=VICTIMS, seed: int = 0,
                 outage: tuple[float, float] = (0.5, 3.0)):
        super().__init__(name="chaos-killer", daemon=True)
        self.home = home
        self.interval = interval
        self.victims = victims
        self.rng = random.Random(seed)
        self.outage = outage
        self.kills: list[dict] = []
        self.misses: collections.Counter = collections.Counter()  # turns at which the victim was not there
        self.errors: list[str] = []
        self.wanted: int | None = None
        self.stack_at_timeout: str | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def counts(self) -> collections.Counter:
        return collections.Counter(k["victim"] for k in list(self.kills))

    def least_killed(self) -> int:
        """Kills of the kind killed least so far."""
        counts = self.counts()
        return min(counts.get(v, 0) for v in self.victims)

    def run(self) -> None:
        bag: list[str] = []
        misses: collections.Counter = collections.Counter()
        while not self._halt.wait(self.rng.uniform(*self.interval)):
            if not bag:  # every kind once per round (or those still wanted), in a random order
                counts = self.counts()
                bag = [v for v in self.victims if self.wanted is None or counts.get(v, 0) < self.wanted]
                bag = bag or list(self.victims)
                self.rng.shuffle(bag)
                misses.clear()
            victim = bag.pop()
            try:
                began = time.time()
                pid = self.kill(victim)
                if pid is not None:
                    self.kills.append({"victim": victim, "pid": pid, "at": began, "took": time.time() - began})
                    continue
                self.misses[victim] += 1
                if misses[victim] < 3:
                    misses[victim] += 1
                    bag.insert(0, victim)  # not there now: again at the end of this round
            except Exception as exc:  # noqa: BLE001 - the run goes on; the report shows it
                self.errors.append(f"{victim}: {type(exc).__name__}: {exc}")

    def kill(self, victim: str) -> int | None:
        import psutil

        from infra.local import agent, recover
        from infra.local.processes import recorded_process
        from infra.local.state import StateDir

        state = StateDir.at(self.home)
        agent_proc = recorded_process(agent.pidfile(self.home, "local"))
        if victim in ("worker", "manager"):
            if agent_proc is None:
                return None
            managers = [c for c in agent_proc.children() if "endpoint_agent.manager" in " ".join(c.cmdline())]
            if victim == "manager":
                target = managers[0] if managers else None
            else:
                workers = [w for m in managers for w in m.children(recursive=True)]
                target = self.rng.choice(workers) if workers else None
            if target is None:
                return None
            os.kill(target.pid, signal.SIGKILL)
            return target.pid
        if victim == "agent":
            if agent_proc is None:
                return None
            family = [agent_proc] + agent_proc.children(recursive=True)
            os.kill(agent_proc.pid, signal.SIGKILL)
            psutil.wait_procs(family, timeout=15)
            self._halt.wait(self.rng.uniform(*self.outage))
            recover.endpoint_agent(self.home)
            return agent_proc.pid
        proc = recorded_process(state.pidfile(victim))
        if proc is None:
            return None
        os.kill(proc.pid, signal.SIGKILL)
        psutil.wait_procs([proc], timeout=10)
        self._halt.wait(self.rng.uniform(*self.outage))
        recover.redis(self.home) if victim == "redis" else recover.service(self.home)
        return proc.pid


# --- the run ---------------------------------------------------------------------------

def _final_events(home: Path, task_ids: list[str]) -> tuple[dict[str, int], dict[str, str]]:
    """Per task: how many final states its record holds, and its state."""
    from skyfn import Client

    finals, states = {}, {}
    with Client() as c:
        for k in range(0, len(task_ids), 5000):
            answer = c.status(task_ids[k:k + 5000], include_events=True)
            for tid, st in answer["tasks"].items():
                states[tid] = st["state"]
                finals[tid] = sum(1 for e in st.get("events") or [] if e[0] in ("SUCCEEDED", "FAILED", "TIMED_OUT",
                                                                                 "CANCELLED"))
    return finals, states


def run(tasks: int = 20000, clients: int = 4, pace: float = 120.0, interval: tuple[float, float] = (2.0, 8.0),
        workers: int = 2, seed: int = 1, timeout: float = 900.0, victims=VICTIMS, home: Path | None = None,
        task_seconds: float = 0.01, min_kills: int = 2, kills_timeout: float = 300.0, echo=print,
        graphs: bool = False) -> dict:
    import yaml

    from infra.local import recover, runtime

    home = Path(home or tempfile.mkdtemp(prefix="skyfn-chaos-"))
    log_dir = home / "exec"
    log_dir.mkdir(parents=True, exist_ok=True)
    cfg = home / "endpoints" / "local"
    cfg.mkdir(parents=True, exist_ok=True)
    # Short leases and heartbeats so that work held by a killed process comes back in
    # seconds; three retries of a task whose worker or manager died (the default is one).
    (cfg / "config.yaml").write_text(yaml.safe_dump({
        "workers": workers, "lease_seconds": 6, "heartbeat_period": 1, "grace_period": 2,
        "manager_heartbeat_period": 0.5, "max_task_retries": 3, "log_level": "WARNING"}))
    env = dict(os.environ, SKYFN_HOME=str(home),
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    saved_home = os.environ.get("SKYFN_HOME")
    os.environ["SKYFN_HOME"] = str(home)  # Client() here reads this deployment's config
    procs: list = []
    try:
        t0 = time.time()
        runtime.up(home, detach=True, echo=lambda *_: None)
        echo(f"runtime up in {time.time() - t0:.1f} s (home {home})")
        per = [tasks // clients + (1 if c < tasks % clients else 0) for c in range(clients)]
        for c in range(clients):
            out = home / f"client-{c}.json"
            code = (f"from tests.e2e.chaos import client_main; client_main({c}, {per[c]}, {pace}, {str(log_dir)!r}, "
                    f"{str(out)!r}, {timeout}, {task_seconds}, {graphs})")
            with open(home / f"client-{c}.log", "wb") as log:
                procs.append((subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=log,
                                               stderr=subprocess.STDOUT), out))
        killer = Killer(home, interval, victims, seed)
        started = time.time()
        killer.start()
        time.sleep(pace)  # kill while the clients submit
        # and on until every kind died `min_kills` times. The count ends the kills, not the
        # clock: the killer restarts each victim before its next turn, so the time a kill
        # takes grows with the machine's load (an agent restart: 4 s idle, 25 s and more on a
        # slow hour), and any wall-clock budget leaves a slow machine short (CI at stop 20:
        # 6 kills in 80 s). `kills_timeout` is only against a victim that never comes back.
        until = time.time() + kills_timeout
        killer.wanted = min_kills
        while killer.least_killed() < min_kills and time.time() < until:
            time.sleep(0.2)
        if killer.least_killed() < min_kills:  # where the killer is, for the report: a restart that hangs shows here
            killer.stack_at_timeout = "".join(traceback.format_stack(sys._current_frames().get(killer.ident)))
        killer.stop()
        killer.join(60)
        chaos_seconds = time.time() - started
        echo(f"chaos over after {chaos_seconds:.0f} s: {len(killer.kills)} kills; recovering")
        revived = recover.revive(home)
        for p, _ in procs:
            p.wait(timeout + 120)
        return _report(home, procs, per, killer, chaos_seconds, revived, time.time() - started, graphs)
    finally:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
        runtime.down(home, echo=lambda *_: None)
        if saved_home is None:
            os.environ.pop("SKYFN_HOME", None)
        else:
            os.environ["SKYFN_HOME"] = saved_home


def _report(home, procs, per, killer, chaos_seconds, revived, seconds, graphs=False) -> dict:
    outcomes: dict[tuple[int, int], dict] = {}
    missing_clients = []
    for c, (p, out) in enumerate(procs):
        try:
            data = json.loads(Path(out).read_text())
        except (OSError, ValueError):
            missing_clients.append(c)
            continue
        for i, o in data["outcomes"].items():
            outcomes[(c, int(i))] = o
    executions = collections.Counter()
    spans: dict[tuple[int, int], list[tuple[float, float]]] = collections.defaultdict(list)
    for log in (home / "exec").glob("exec-*.log"):
        c = int(log.stem.split("-")[1])
        for line in log.read_text().splitlines():
            i, *times = line.split()
            executions[(c, int(i))] += 1
            if times:
                spans[(c, int(i))].append((float(times[0]), float(times[1])))
    task_ids = [o["task_id"] for o in outcomes.values() if o.get("task_id")]
    finals, states = _final_events_safe(home, task_ids)
    submitted = sum(per)
    completed = sum(1 for o in outcomes.values() if o.get("ok"))
    wrong = sum(1 for o in outcomes.values() if "value" in o and not o["ok"])
    failed = collections.Counter(f"{o['error']}: {_reason_class(o['reason'])}" for o in outcomes.values()
                                 if "error" in o and o["error"] != "TaskNotFound")
    not_found = sum(1 for o in outcomes.values() if o.get("error") == "TaskNotFound")
    pending = sum(1 for o in outcomes.values() if o.get("pending"))
    unreported = submitted - len(outcomes)
    multi_final = sum(1 for n in finals.values() if n > 1)
    dup_ids = len(task_ids) - len(set(task_ids))
    completed_never_ran = sum(1 for k, o in outcomes.items() if o.get("ok") and executions[k] == 0)
    graph = _graph_report(per, spans) if graphs else {}
    return {
        **graph,
        "submitted": submitted, "completed": completed, "failed": sum(failed.values()),
        "failed_reasons": dict(failed),
        "duplicated": wrong + multi_final + dup_ids,
        "duplicated_detail": {"wrong_result": wrong, "more_than_one_final_state": multi_final,
                              "task_id_reused": dup_ids},
        "lost": pending + not_found + unreported + completed_never_ran,
        "lost_detail": {"never_finished": pending, "unknown_to_the_service": not_found, "client_died": unreported,
                        "completed_without_running": completed_never_ran, "clients_without_report": missing_clients},
        "executions": sum(executions.values()), "re_executed": sum(1 for n in executions.values() if n > 1),
        "service_states": dict(collections.Counter(states.values())),
        "kills": dict(collections.Counter(k["victim"] for k in killer.kills)), "kill_errors": killer.errors,
        "kill_misses": dict(killer.misses), "killer_stack_at_timeout": killer.stack_at_timeout,
        "kill_seconds": {v: [round(k["took"], 1) for k in killer.kills if k["victim"] == v] for v in VICTIMS},
        "revived_after_chaos": revived, "chaos_seconds": round(chaos_seconds, 1), "seconds": round(seconds, 1),
    }


def _graph_report(per: list[int], spans: dict) -> dict:
    """Edges, and executions that began before every execution of one of their inputs ended."""
    edges = early = 0
    for c, n in enumerate(per):
        for i, ins in graph_inputs(n).items():
            edges += len(ins)
            for began, _ in spans.get((c, i), ()):
                if any(not spans.get((c, k)) or began < min(end for _, end in spans[(c, k)]) for k in ins):
                    early += 1
    return {"edges": edges, "ran_before_inputs": early}


def _final_events_safe(home, task_ids):
    try:
        return _final_events(home, task_ids)
    except Exception as exc:  # noqa: BLE001 - the report says the check could not be made
        print(f"could not read the service's task records: {exc}", file=sys.stderr)
        return {}, {}


def _reason_class(reason: str) -> str:
    """Group failure reasons: the text up to the first id-like or numeric detail."""
    import re

    text = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "<id>", reason or "")
    text = re.sub(r"\b\d+(\.\d+)?\b", "N", text)
    return text[:160] or "(no reason given)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--pace", type=float, default=120.0, help="seconds over which clients submit (and kills run)")
    parser.add_argument("--interval", type=float, nargs=2, default=(2.0, 8.0), metavar=("MIN", "MAX"),
                        help="seconds between kills, uniformly at random")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--task-seconds", type=float, default=0.01, help="work per task (sleep), so that kills "
                        "find tasks in flight")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--victims", nargs="+", choices=VICTIMS, default=list(VICTIMS))
    parser.add_argument("--graphs", action="store_true", help="task graphs (blocks of five tasks with edges)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = run(args.tasks, args.clients, args.pace, tuple(args.interval), args.workers, args.seed,
                 victims=tuple(args.victims), task_seconds=args.task_seconds, echo=lambda m: print(m, file=sys.stderr),
                 graphs=args.graphs)
    print(json.dumps(report, indent=2) if args.json else "\n".join(f"{k}: {v}" for k, v in report.items()))
    ok = report["lost"] == 0 and report["duplicated"] == 0 and report.get("ran_before_inputs", 0) == 0 \
        and "(no reason given)" not in " ".join(report["failed_reasons"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
