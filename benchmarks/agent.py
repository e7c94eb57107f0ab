"""The endpoint agent alone, with its peers run in the same benchmark on the same machine.

    .venv/bin/python -m benchmarks.agent [--json] [--tasks 10000] [--rtt 300] [--workers 2]
                                         [--only interchange,manager,queues,zmq,htex,gce]
                                         [--batches 5] [--batch-budget 3]

Every system gets the same work: a no-op task (`return x`), 2 workers, a warm-up, then a
batch of N tasks submitted at once and timed until the last result is back, then `--rtt`
single-task round trips one after the other (p50 / p99). The batch is run again until
`--batches` batches have run or `--batch-budget` seconds have been spent on them (at least
once), and its time is the median: a 10,000-task batch takes 0.1-0.4 s on the agent and raw
ZeroMQ, where one stall of another process moves a single timing by a third, while HTEX's
takes 10-20 s and averages the machine's noise in one run (so it runs once). The JSON keeps
each run's time (`batch_runs_s`). Each system is started and
stopped here; one that cannot run says why and its figures are null. `--only skyfn`
means interchange,manager.

- skyfn agent (`interchange`; JSON `skyfn_ix_*`, and the headline `skyfn_*` keys): the
  agent's real Interchange (endpoint_agent/interchange/interchange.py) in this process, stepped like
  the agent's main loop steps it (`step(LOOP_WAIT_S)`), with its real local manager
  (started by the interchange, over its ipc address) and 2 real workers. TaskPacks of 512
  are handed over with `deliver()` as the poller thread does (while load < capacity);
  the batch is timed until every result is in a ResultPack body put to the outbox (an
  always-idle stand-in that records bodies). The round trip is deliver -> body put; its
  breakdown comes from the result's RUNNING / DONE events (the worker's stamps). Only the
  queues, the poller thread's parsing and the outbox's sends are left out; this is the
  path the issue's agent-only targets are judged on (HTEX's row also goes through its
  interchange).
- skyfn manager only (`manager`; JSON `skyfn_manager_*`): this process plays the
  interchange. It binds a ZeroMQ ROUTER and starts a real manager process (`python -m
  endpoint_agent.manager --interchange tcp://...`, which starts the real workers) and
  speaks endpoint_agent/wire.py to it: REG, credit (REQ), TASKS batches sized by credit,
  RES batches back. It skips the real interchange's bookkeeping, so it is a lower bound
  of the agent's cost, not the agent. Timestamps of each round trip give a breakdown
  (interchange -> worker start, run, worker done -> interchange).
- skyfn via queues: redis-server + a real agent (`python -m endpoint_agent start NAME
  --foreground`, queues configured directly); TaskPacks of 512 go into the task stream,
  ResultPacks come back on the results stream. The round trip is broken down with the
  agent's own events (DISPATCHED, RUNNING, DONE).
- zmq ceiling: a raw pyzmq ROUTER here -> 2 DEALER worker processes, one message per task;
  and round trips through one Python relay process (the floor of a manager hop).
- Parsl HighThroughputExecutor driven directly (no DataFlowKernel, logging off): its
  interchange and process_worker_pool.py come from this venv's bin (put first on PATH).
- Globus Compute GlobusComputeEngine driven directly (no cloud service): started with an
  endpoint id and a run dir, given packed Task messages. globus-compute-endpoint pins
  dill==0.3.9 and skyfn pins dill==0.4.1, so it lives in its own virtualenv
  (`--setup-gce` makes it: .venv/peers/gce) and runs in a child process of that
  interpreter (`--peer gce`), which prints one JSON line.

The last line printed with --json is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GCE_PIN = "globus-compute-endpoint==4.19.0"
GCE_VENV = ROOT / ".venv" / "peers" / "gce"
SYSTEMS = ("interchange", "manager", "queues", "zmq", "htex", "gce")


def noop(x):
    return x


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(n: int, batch_s: float, rtts_ms: list[float], startup_s: float | None = None, **extra) -> dict:
    out = {"batch_s": round(batch_s, 4), "tasks_per_s": round(n / batch_s),
           "rtt_p50_ms": round(statistics.median(rtts_ms), 3), "rtt_p99_ms": round(percentile(rtts_ms, 0.99), 3)}
    if startup_s is not None:
        out["startup_s"] = round(startup_s, 2)
    out.update(extra)
    return out


def timed_batches(run_batch, batches: int, budget_s: float,
                  prepare=lambda k: None) -> tuple[float, list[float]]:
    """Run `run_batch(prepare(k))` (k = 0, 1, ...) until `batches` runs or `budget_s` seconds
    of them, at least once, timing only `run_batch`; the median time and every run's time (s)."""
    times: list[float] = []
    while not times or (len(times) < batches and sum(times) < budget_s):
        work = prepare(len(times))
        t = time.perf_counter()
        run_batch(work)
        times.append(time.perf_counter() - t)
    return statistics.median(times), [round(x, 4) for x in times]


def breakdown(parts: dict[str, list[float]]) -> dict[str, float]:
    """Median of each stage of the round trip, in ms."""
    return {k: round(statistics.median(v), 3) for k, v in parts.items() if v}


def venv_path_env(extra_path: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    bindir = str(extra_path or Path(sys.executable).parent)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in parts if p != str(ROOT)])
    return env


# --- skyfn: the agent core over the manager wire protocol --------------------------------
class ManagerDriver:
    """Plays the agent's interchange for one real manager process (wire.py protocol)."""

    def __init__(self, workers: int, prefetch: int):
        import zmq

        from endpoint_agent import wire

        self.zmq, self.wire = zmq, wire
        self.new_wire = hasattr(wire, "K_GPUS")  # 7-field tasks, `--block` command line
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.identity = f"bench-{os.getpid()}"
        if self.new_wire:
            cmd = ["--block", "bench", "--prefetch", str(prefetch)]
        else:
            cmd = ["--capacity", str(workers + prefetch)]
        cmd = [sys.executable, "-m", "endpoint_agent.manager", "--interchange", self.address,
               "--identity", self.identity, "--workers", str(workers), "--log-level", "WARNING",
               "--parent", str(os.getpid()), *cmd]
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=venv_path_env(), cwd=str(ROOT))
        self.peer: bytes | None = None
        self.credit = 0
        self.sent_functions = False
        self.key = 0
        self.reg: dict | None = None

    def task(self, fid: str, payload: str) -> list:
        self.key += 1
        if self.new_wire:
            return [self.key, fid, payload, None, None, 1, 0]
        return [self.key, fid, payload, None]

    def _recv(self, timeout_ms: float, on_result) -> None:
        zmq, wire = self.zmq, self.wire
        router = self.router
        if not router.poll(timeout_ms):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the manager exited with code {self.proc.returncode}")
            return
        while True:
            try:
                identity, op, body = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if op == wire.RES:
                on_result(wire.loads(body))
            elif op == wire.REQ:
                self.credit += wire.loads(body)
            elif op == wire.REG:
                self.peer = identity
                self.reg = wire.loads(body)
            elif op == wire.HB:
                if self.new_wire and self.peer is not None:  # the manager checks the interchange is alive
                    router.send_multipart([identity, wire.HB, b""])
            elif op == getattr(wire, "LOST", None):
                raise RuntimeError(f"tasks LOST by the manager: {body[:300]!r}")

    def run(self, tasks: list[list], functions: dict[str, str], timeout: float = 120.0,
            record: dict | None = None) -> None:
        """Dispatch `tasks` by credit (one TASKS message per credit grant, like the
        interchange) until every result is back. `record` (key -> row) gets the wall-clock
        send time, worker start/done and receive time of each task."""
        zmq, wire = self.zmq, self.wire
        pending = list(reversed(tasks))
        want = len(tasks)
        got = 0
        deadline = time.monotonic() + timeout

        def on_result(results):
            nonlocal got
            got += len(results)
            if record is not None:
                now = time.time()
                for r in results:
                    row = record.get(r[0])
                    if row is not None:
                        row.extend((r[4], r[5], now))
                        if r[1] != "SUCCEEDED":
                            raise RuntimeError(f"task failed: {r[3]}")

        while got < want:
            if pending and self.peer is not None and self.credit > 0:
                n = min(self.credit, len(pending))
                batch = [pending.pop() for _ in range(n)]
                msg = {"f": functions if not self.sent_functions else {}, "t": batch}
                if record is not None:
                    now = time.time()
                    for t in batch:
                        record[t[0]] = [now]
                self.router.send_multipart([self.peer, wire.TASKS, wire.dumps(msg)])
                self.sent_functions = True
                self.credit -= n
            self._recv(0 if (pending and self.credit > 0) else 50, on_result)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{want - got} of {want} results missing after {timeout} s")

    def close(self) -> None:
        try:
            if self.peer is not None and self.proc.poll() is None:
                self.router.send_multipart([self.peer, self.wire.STOP, b""], self.zmq.NOBLOCK)
            self.proc.wait(10)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        finally:
            self.router.close(0)
            self.ctx.term()


def bench_skyfn(n: int, rtt_n: int, workers: int, batches: int = 1, budget_s: float = 0.0) -> dict:
    from endpoint_agent.config import EndpointConfig
    from skyfn.protocol.serialize import pack_args, serialize_function

    cfg = EndpointConfig(workers=workers)
    prefetch = cfg.manager_prefetch_value if hasattr(cfg, "manager_prefetch_value") else cfg.capacity - workers
    fid = "noop"
    functions = {fid: serialize_function(noop)}
    payloads = [pack_args((i,), {}) for i in range(max(n, rtt_n, 200))]
    t0 = time.perf_counter()
    drv = ManagerDriver(workers, prefetch)
    try:
        drv.run([drv.task(fid, payloads[i]) for i in range(200)], functions, timeout=60)  # warm-up
        startup = time.perf_counter() - t0
        batch, batch_runs = timed_batches(lambda tasks: drv.run(tasks, functions), batches, budget_s,
                                          prepare=lambda _k: [drv.task(fid, payloads[i]) for i in range(n)])
        rtts, parts = [], {"to_worker_ms": [], "run_ms": [], "back_ms": []}
        for i in range(rtt_n):
            rec: dict = {}
            task = drv.task(fid, payloads[i])
            t = time.perf_counter()
            drv.run([task], functions, timeout=10, record=rec)
            rtts.append((time.perf_counter() - t) * 1e3)
            sent, start, done, back = rec[task[0]]
            parts["to_worker_ms"].append((start - sent) * 1e3)
            parts["run_ms"].append((done - start) * 1e3)
            parts["back_ms"].append((back - done) * 1e3)
    finally:
        drv.close()
    return summary(n, batch, rtts, startup, batch_runs_s=batch_runs, prefetch=prefetch, manager_cmd="python " + " ".join(drv.cmd[1:]),
                   rtt_breakdown_ms=breakdown(parts))


# --- skyfn: the real Interchange in this process -> real manager -> workers -------------
class _Outbox:
    """Stands in for the agent's Outbox: records what the interchange hands over, always
    idle (an outbox that sends instantly), so every result leaves as soon as it may."""

    def __init__(self) -> None:
        self.bodies: list[tuple[float, bytes]] = []   # (wall clock put, ResultPack JSON)
        self.acks: list[str] = []

    def put(self, bodies=(), acks=(), extend=()) -> None:
        if bodies:
            ts = time.time()
            self.bodies.extend((ts, b) for b in bodies)
        if acks:
            self.acks.extend(acks)

    def idle(self) -> bool:
        return True


def bench_interchange(n: int, rtt_n: int, workers: int, batches: int = 1, budget_s: float = 0.0,
                      pack_size: int = 512) -> dict:
    """The agent's real Interchange (endpoint_agent/interchange/interchange.py), stepped here the way
    the agent's main loop steps it, with its local manager and workers. TaskPacks are
    delivered like the poller thread delivers them (while load < capacity); results are
    the ResultPack bodies the interchange puts to the outbox."""
    import zmq

    from endpoint_agent import wire
    from endpoint_agent.agent import LOOP_WAIT_S
    from endpoint_agent.config import EndpointConfig
    from endpoint_agent.interchange import Interchange
    from skyfn.protocol.messages import TaskPack, TaskSpec
    from skyfn.protocol.serialize import pack_args, serialize_function

    cfg = EndpointConfig(workers=workers, managers=1, log_level="WARNING")
    out = _Outbox()
    fid = "noop"
    functions = {fid: serialize_function(noop)}
    payloads = [pack_args((i,), {}) for i in range(max(n, rtt_n, 200))]

    def packs(prefix: str, count: int) -> list[TaskPack]:
        return [TaskPack(pack_id=f"{prefix}{j}", endpoint_id="ep", functions=functions,
                         tasks=[TaskSpec(task_id=f"{prefix}{i}", function_id=fid, payload=payloads[i])
                                for i in range(j, min(count, j + pack_size))])
                for j in range(0, count, pack_size)]

    ctx = zmq.Context()
    ix = Interchange(cfg, "ep", out, ctx=ctx)
    seq = 0

    def run(todo: list[TaskPack], timeout: float = 120.0) -> None:
        """Deliver packs as the poller would (load < capacity) until every result has been put."""
        nonlocal seq
        want = ix.completed + ix.failed + sum(len(p.tasks) for p in todo)
        todo = list(reversed(todo))
        deadline = time.monotonic() + timeout
        while ix.completed + ix.failed < want or ix.results:
            if todo and ix.load() < ix.capacity():
                seq += 1
                pack = todo.pop()
                ix.deliver([(f"receipt-{seq}", pack, time.time())], len(pack.tasks))
            ix.step(LOOP_WAIT_S)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{want - ix.completed - ix.failed} results missing after {timeout} s")
        if ix.failed:
            raise RuntimeError(f"{ix.failed} task(s) failed: {out.bodies[-1][1][:500]!r}")

    try:
        t0 = time.perf_counter()
        ix.start_local_managers()
        deadline = time.monotonic() + 60
        while True:
            snap = ix.snapshot()
            if snap["managers"] and snap["free_workers"] == workers:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the manager did not register with {workers} workers: {snap}")
            ix.step(0.05)
        run(packs("w", 200), timeout=60)  # warm-up
        startup = time.perf_counter() - t0

        out.bodies.clear()

        def check_batch(k: int) -> None:
            got = {r["task_id"] for _, b in out.bodies for r in wire.loads(b)["results"]}
            if len(got) != n:
                raise RuntimeError(f"batch {k}: {len(got)} distinct results for {n} tasks")
            out.bodies.clear()

        def prepare(k: int) -> list[TaskPack]:
            if k:
                check_batch(k - 1)
            return packs(f"b{k}-", n)

        batch, batch_runs = timed_batches(run, batches, budget_s, prepare=prepare)
        check_batch(len(batch_runs) - 1)
        rtts, parts = [], {"to_worker_ms": [], "run_ms": [], "back_ms": []}
        for i in range(rtt_n):
            pack = TaskPack(pack_id=f"r{i}", endpoint_id="ep", functions=functions,
                            tasks=[TaskSpec(task_id=f"r{i}", function_id=fid, payload=payloads[i])])
            out.bodies.clear()
            t = time.perf_counter()
            sent = time.time()
            run([pack], timeout=10)
            rtts.append((time.perf_counter() - t) * 1e3)
            put_at, body = out.bodies[-1]
            rec = wire.loads(body)["results"][-1]
            ev = {e[0]: e[1] for e in rec["events"]}
            parts["to_worker_ms"].append((ev["RUNNING"] - sent) * 1e3)
            parts["run_ms"].append((ev["DONE"] - ev["RUNNING"]) * 1e3)
            parts["back_ms"].append((put_at - ev["DONE"]) * 1e3)
        cmd = ix.manager_command("local", workers, address=ix.address)
    finally:
        ix.close()
        ctx.term()
    return summary(n, batch, rtts, startup, batch_runs_s=batch_runs, pack_size=pack_size, capacity=ix.capacity(),
                   manager_cmd="python " + " ".join(cmd[1:]), rtt_breakdown_ms=breakdown(parts))


# --- skyfn via the task/results streams (redis-server + a real agent) ---------------------
def _event_ts(rec: dict, name: str) -> float | None:
    for ev in rec.get("events") or []:
        if isinstance(ev, dict):
            if ev.get("state") == name or ev.get("name") == name:
                return ev.get("ts")
        elif ev and ev[0] == name:
            return ev[1]
    return None


def bench_queues(n: int, rtt_n: int, workers: int) -> dict:
    from infra.local.processes import start_redis
    from tests.agent import fns
    from tests.agent.conftest import AgentProc, Queues

    with tempfile.TemporaryDirectory(prefix="skyfn-bench-") as tmp:
        tmp = Path(tmp)
        redis = start_redis(tmp / "redis", appendonly=False)
        agent = None
        try:
            q = Queues(redis.url, "bench")
            agent = AgentProc(tmp / "home", "bench", {
                "workers": workers, "endpoint_id": "ep", "task_queue": q.task_desc,
                "results_queue": q.results_desc, "log_level": "WARNING"})
            t0 = time.perf_counter()
            agent.start(wait_workers=workers)
            ids, bodies, groups = q.build(fns.noop, [(i,) for i in range(200)], prefix="w")
            q.send(bodies, groups)
            q.collect(ids, timeout=60)
            startup = time.perf_counter() - t0
            ids, bodies, groups = q.build(fns.noop, [(i,) for i in range(n)], prefix="b")
            t = time.perf_counter()
            q.send(bodies, groups)
            q.collect(ids, timeout=120)
            batch = time.perf_counter() - t
            rtts = []
            parts = {"queue_to_agent_ms": [], "agent_to_worker_ms": [], "run_ms": [], "back_via_queue_ms": []}
            for i in range(rtt_n):
                _, b, g = q.build(fns.noop, [(i,)], prefix=f"r{i}-")
                t = time.perf_counter()
                sent = time.time()
                q.send(b, g)
                rec = q.collect([f"r{i}-0"], timeout=10)[f"r{i}-0"][-1]
                back = time.time()
                rtts.append((time.perf_counter() - t) * 1e3)
                disp, run, done = (_event_ts(rec, s) for s in ("DISPATCHED", "RUNNING", "DONE"))
                if None not in (disp, run, done):
                    parts["queue_to_agent_ms"].append((disp - sent) * 1e3)
                    parts["agent_to_worker_ms"].append((run - disp) * 1e3)
                    parts["run_ms"].append((done - run) * 1e3)
                    parts["back_via_queue_ms"].append((back - done) * 1e3)
        finally:
            if agent is not None and agent.proc is not None:
                agent.terminate()
            redis.stop()
    return summary(n, batch, rtts, startup, rtt_breakdown_ms=breakdown(parts))


# --- raw pyzmq ROUTER -> DEALER processes: the practical ceiling --------------------------
ZMQ_WORKER = r"""
import pickle, sys, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.connect(sys.argv[1])
s.send(b"READY")
def noop(x):
    return x
while True:
    m = s.recv()
    if m == b"STOP":
        break
    s.send(pickle.dumps(noop(pickle.loads(m))))
s.close(1000)
"""


ZMQ_RELAY = r"""
import sys, zmq
ctx = zmq.Context()
up = ctx.socket(zmq.DEALER)
up.connect(sys.argv[1])
down = ctx.socket(zmq.ROUTER)
down.bind(sys.argv[2])
w, _ = down.recv_multipart()
up.send(b"READY")
poller = zmq.Poller()
poller.register(up, zmq.POLLIN)
poller.register(down, zmq.POLLIN)
while True:
    ev = dict(poller.poll())
    if up in ev:
        m = up.recv()
        down.send_multipart([w, m])
        if m == b"STOP":
            break
    if down in ev:
        up.send(down.recv_multipart()[1])
"""


def _reap(procs, router, ctx) -> None:
    """Wait for the raw-zmq peer processes (kill the stragglers), close the socket."""
    for p in procs:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    router.close(0)
    ctx.term()


def relay_rtt(rtt_n: int) -> list[float]:
    """Round trips through one Python relay process (ROUTER here -> relay -> 1 worker): the
    floor of a design with a manager process between the interchange and the workers."""
    import pickle

    import zmq

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    ipc = f"ipc://@skyfn-bench-relay-{os.getpid()}"
    procs = [subprocess.Popen([sys.executable, "-c", ZMQ_RELAY, f"tcp://127.0.0.1:{port}", ipc])]
    procs.append(subprocess.Popen([sys.executable, "-c", ZMQ_WORKER, ipc]))
    try:
        if not router.poll(30_000):
            raise RuntimeError("relay did not connect")
        relay, _ = router.recv_multipart()
        rtts = []
        for i in range(200 + rtt_n):
            t = time.perf_counter()
            router.send_multipart([relay, pickle.dumps(i)])
            router.recv_multipart()
            rtts.append((time.perf_counter() - t) * 1e3)
        router.send_multipart([relay, b"STOP"])
        return rtts[200:]
    finally:
        _reap(procs, router, ctx)


def bench_zmq(n: int, rtt_n: int, workers: int, batches: int = 1, budget_s: float = 0.0, window: int = 64) -> dict:
    import pickle

    import zmq

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", ZMQ_WORKER, f"tcp://127.0.0.1:{port}"]) for _ in range(workers)]
    try:
        peers = []
        while len(peers) < workers:
            if not router.poll(30_000):
                raise RuntimeError("zmq workers did not connect")
            ident, _ = router.recv_multipart()
            peers.append(ident)
        startup = time.perf_counter() - t0
        payloads = [pickle.dumps(i) for i in range(max(n, rtt_n))]

        def batch(count: int) -> None:
            nxt, got = 0, 0
            for p in peers:  # a window of tasks per worker, topped up as results come
                for _ in range(min(window, count - nxt)):
                    router.send_multipart([p, payloads[nxt]])
                    nxt += 1
            while got < count:
                ident, _ = router.recv_multipart()
                got += 1
                if nxt < count:
                    router.send_multipart([ident, payloads[nxt]])
                    nxt += 1

        batch(min(n, 1000))  # warm-up
        batch_s, batch_runs = timed_batches(lambda _k: batch(n), batches, budget_s)
        rtts = []
        for i in range(rtt_n):
            t = time.perf_counter()
            router.send_multipart([peers[i % workers], payloads[i]])
            router.recv_multipart()
            rtts.append((time.perf_counter() - t) * 1e3)
        for p in peers:
            router.send_multipart([p, b"STOP"])
    finally:
        _reap(procs, router, ctx)
    relay = relay_rtt(rtt_n)
    return summary(n, batch_s, rtts, startup, batch_runs_s=batch_runs, window_per_worker=window,
                   relay_rtt_p50_ms=round(statistics.median(relay), 3), relay_rtt_p99_ms=round(percentile(relay, 0.99), 3))


# --- Parsl HighThroughputExecutor, driven directly ---------------------------------------
def run_futures(submit, n: int, rtt_n: int, result_of=lambda f: f.result()) -> tuple[float, list[float]]:
    t = time.perf_counter()
    futures = [submit(i) for i in range(n)]
    out = [result_of(f) for f in futures]
    batch = time.perf_counter() - t
    assert out == list(range(n)), "wrong results"
    rtts = []
    for i in range(rtt_n):
        t = time.perf_counter()
        assert result_of(submit(i)) == i
        rtts.append((time.perf_counter() - t) * 1e3)
    return batch, rtts


def bench_htex(n: int, rtt_n: int, workers: int, batches: int = 1, budget_s: float = 0.0) -> dict:
    import logging

    import parsl
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import LocalProvider

    logging.getLogger("parsl").setLevel(logging.WARNING)
    env = venv_path_env()  # interchange.py and process_worker_pool.py from this venv's bin
    os.environ["PATH"], os.environ["PYTHONPATH"] = env["PATH"], env["PYTHONPATH"]
    run_dir = tempfile.mkdtemp(prefix="parsl-bench-")
    ex = HighThroughputExecutor(label="htex", max_workers_per_node=workers, cores_per_worker=1,
                                provider=LocalProvider(init_blocks=1, min_blocks=0, max_blocks=1))
    ex.run_dir = run_dir
    ex.run_id = "bench"
    ex.provider.script_dir = os.path.join(run_dir, "submit_scripts")  # what the DataFlowKernel would set
    os.makedirs(ex.provider.script_dir, exist_ok=True)
    t0 = time.perf_counter()
    ex.start()
    try:
        if not ex.scale_out_facade(1):
            raise RuntimeError(f"HTEX block did not start: {ex.status_facade}")
        [ex.submit(noop, {}, i).result(timeout=120) for i in range(20)]
        startup = time.perf_counter() - t0
        run_futures(lambda i: ex.submit(noop, {}, i), 200, 0)  # warm-up
        batch, batch_runs = timed_batches(lambda _: run_futures(lambda i: ex.submit(noop, {}, i), n, 0),
                                          batches, budget_s)
        _, rtts = run_futures(lambda i: ex.submit(noop, {}, i), 0, rtt_n)
    finally:
        try:
            ex.scale_in_facade(len(ex.status_facade))
        finally:
            ex.shutdown()
    return summary(n, batch, rtts, startup, batch_runs_s=batch_runs, parsl=parsl.__version__)


# --- Globus Compute's GlobusComputeEngine (child process in its own venv) -----------------
def gce_child(n: int, rtt_n: int, workers: int) -> None:
    """Runs under .venv/peers/gce/bin/python; prints one JSON line."""
    import logging
    import uuid

    from globus_compute_common import messagepack
    from globus_compute_common.messagepack.message_types import Task
    from globus_compute_endpoint import __version__ as gce_version
    from globus_compute_endpoint.engines import GlobusComputeEngine
    from globus_compute_endpoint.engines.base import GCFuture
    from globus_compute_sdk.serialize import ComputeSerializer
    from parsl.providers import LocalProvider

    logging.getLogger("parsl").setLevel(logging.WARNING)
    logging.getLogger("globus_compute_endpoint").setLevel(logging.WARNING)
    serde = ComputeSerializer()
    fn_buf = serde.serialize(noop)
    kw_buf = serde.serialize({})

    def packed(i: int) -> tuple[uuid.UUID, bytes]:
        tid = uuid.uuid4()
        buf = serde.pack_buffers([fn_buf, serde.serialize((i,)), kw_buf])
        return tid, messagepack.pack(Task(task_id=tid, task_buffer=buf))

    def result_of(f) -> object:
        res = messagepack.unpack(f.result(timeout=300))
        if getattr(res, "is_error", False) or getattr(res, "error_details", None):
            raise RuntimeError(f"task failed: {res.data}")
        return serde.deserialize(res.data)

    def submit(i: int):
        tid, body = packed(i)
        f = GCFuture(tid)
        engine.submit(f, body, resource_specification={})
        return f

    run_dir = tempfile.mkdtemp(prefix="gce-bench-")
    engine = GlobusComputeEngine(max_workers_per_node=workers, cores_per_worker=1,
                                 provider=LocalProvider(init_blocks=1, min_blocks=0, max_blocks=1))
    t0 = time.perf_counter()
    engine.start(endpoint_id=uuid.uuid4(), run_dir=run_dir)
    try:
        [result_of(submit(i)) for i in range(20)]
        startup = time.perf_counter() - t0
        run_futures(submit, 200, 0, result_of)
        batch, rtts = run_futures(submit, n, rtt_n, result_of)
    finally:
        engine.shutdown()
    print(json.dumps(summary(n, batch, rtts, startup, globus_compute_endpoint=gce_version)), flush=True)


def setup_gce() -> None:
    subprocess.run([sys.executable, "-m", "venv", str(GCE_VENV)], check=True)
    subprocess.run([str(GCE_VENV / "bin" / "python"), "-m", "pip", "install", "-q", GCE_PIN], check=True)


def bench_gce(n: int, rtt_n: int, workers: int) -> dict:
    py = Path(os.environ.get("SKYFN_GCE_PYTHON") or GCE_VENV / "bin" / "python")
    if not py.exists():
        raise RuntimeError(f"no {py}: `python -m benchmarks.agent --setup-gce` makes it ({GCE_PIN} pins dill==0.3.9, "
                           "which conflicts with skyfn's dill==0.4.1, so it cannot share this venv)")
    env = venv_path_env(py.parent)  # the engine's workers: process_worker_pool.py, globus-compute-endpoint
    proc = subprocess.run([str(py), "-m", "benchmarks.agent", "--peer", "gce", "--tasks", str(n), "--rtt", str(rtt_n),
                           "--workers", str(workers)], cwd=str(ROOT), env=env, capture_output=True, text=True,
                          timeout=240)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"GCE child exited {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}")
    return json.loads(lines[-1])


# --- main -------------------------------------------------------------------------------
RUNNERS = {"interchange": bench_interchange, "manager": bench_skyfn, "queues": bench_queues, "zmq": bench_zmq,
           "htex": bench_htex, "gce": bench_gce}
LABELS = {"interchange": "skyfn agent: real Interchange -> manager -> workers",
          "manager": "skyfn manager only (bench plays interchange)",
          "queues": "skyfn agent via Redis streams",
          "zmq": "raw pyzmq ROUTER -> DEALERs (ceiling)", "htex": "Parsl HTEX (direct, logging off)",
          "gce": "Globus Compute GlobusComputeEngine (direct)"}
PREFIX = {"interchange": "skyfn_ix", "manager": "skyfn_manager", "queues": "skyfn_queues", "zmq": "zmq",
          "htex": "htex", "gce": "gce"}
MINE = ("interchange", "manager", "queues")
BATCHED = ("interchange", "manager", "zmq", "htex")  # runners that repeat their batch (--batches)
HEADLINE = "interchange"  # the skyfn_* keys: the honest agent path (real interchange)
ALIASES = {"skyfn": ("interchange", "manager"), "ix": ("interchange",)}


def main() -> None:
    ap = argparse.ArgumentParser(description="endpoint agent alone vs Parsl HTEX, GlobusComputeEngine, raw zmq")
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rtt", type=int, default=300, help="sequential single-task round trips")
    ap.add_argument("--only", default=",".join(SYSTEMS),
                    help="comma-separated subset of " + ",".join(SYSTEMS) + " ('skyfn' = interchange,manager)")
    ap.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    ap.add_argument("--batches", type=int, default=5,
                    help="run each batch up to this many times; its time is the median (default 5)")
    ap.add_argument("--batch-budget", type=float, default=3.0,
                    help="... or until this many seconds of batches have run, at least once (default 3)")
    ap.add_argument("--setup-gce", action="store_true", help=f"create {GCE_VENV} with {GCE_PIN} and exit")
    ap.add_argument("--peer", choices=["gce"], help=argparse.SUPPRESS)  # child mode
    args = ap.parse_args()
    if args.setup_gce:
        setup_gce()
        return
    if args.peer == "gce":
        gce_child(args.tasks, args.rtt, args.workers)
        return

    wanted: set[str] = set()
    for s in args.only.split(","):
        s = s.strip()
        if not s:
            continue
        if s in ALIASES:
            wanted.update(ALIASES[s])
        elif s in SYSTEMS:
            wanted.add(s)
        else:
            ap.error(f"--only: unknown system {s!r} (known: {', '.join(SYSTEMS)}, skyfn)")
    results: dict[str, dict | None] = {}
    errors: dict[str, str] = {}
    for name in SYSTEMS:
        if name not in wanted:
            continue
        t = time.perf_counter()
        try:
            repeat = {"batches": args.batches, "budget_s": args.batch_budget} if name in BATCHED else {}
            results[name] = RUNNERS[name](args.tasks, args.rtt, args.workers, **repeat)
        except Exception as exc:  # a peer that cannot run: say why, its figures stay null
            results[name] = None
            errors[name] = f"{type(exc).__name__}: {exc}"
            print(f"[{name}] could not run: {errors[name]}", file=sys.stderr)
            if os.environ.get("SKYFN_BENCH_DEBUG"):
                traceback.print_exc()
        print(f"[{name}] done in {time.perf_counter() - t:.1f} s", file=sys.stderr)

    print(f"\n{args.tasks:,} no-op tasks, {args.workers} workers; then {args.rtt} single-task round trips")
    print(f"{'system':<52} {'batch s':>8} {'tasks/s':>9} {'rtt p50 ms':>11} {'p99 ms':>8} {'start s':>8}")
    for name, r in results.items():
        if r is None:
            print(f"{LABELS[name]:<52} {'—':>8} {'—':>9} {'—':>11} {'—':>8} {'—':>8}   ({errors[name][:60]})")
        else:
            print(f"{LABELS[name]:<52} {r['batch_s']:>8.3f} {r['tasks_per_s']:>9,} {r['rtt_p50_ms']:>11.3f} "
                  f"{r['rtt_p99_ms']:>8.3f} {r.get('startup_s', 0):>8.2f}")

    out: dict = {"tasks": args.tasks, "workers": args.workers, "rtt_n": args.rtt,
                 "skyfn_path": "real Interchange in process -> real manager -> workers (the skyfn_ix_ row)"}
    keys = ("tasks_per_s", "batch_s", "batch_runs_s", "rtt_p50_ms", "rtt_p99_ms", "startup_s")
    head = results.get(HEADLINE)
    for k in keys:  # the keys describe the honest path
        out[f"skyfn_{k}"] = head.get(k) if head else None
    for name in SYSTEMS:
        p = PREFIX[name]
        r = results.get(name)
        for k in keys:
            out[f"{p}_{k}"] = r.get(k) if r else None
    ratios: dict[str, float | None] = {}
    for p, mine in [("skyfn", HEADLINE)] + [(PREFIX[m], m) for m in MINE]:  # skyfn_* = the headline row
        me = results.get(mine)
        for peer in ("zmq", "htex", "gce"):
            other = results.get(peer)
            ok = me is not None and other is not None
            ratios[f"{p}_over_{peer}_tasks_per_s"] = round(me["tasks_per_s"] / other["tasks_per_s"], 2) if ok else None
            ratios[f"{peer}_over_{p}_rtt_p50"] = round(other["rtt_p50_ms"] / me["rtt_p50_ms"], 2) if ok else None
    out["ratios"] = ratios
    if results.get("zmq"):
        out["zmq_relay_rtt_p50_ms"] = results["zmq"]["relay_rtt_p50_ms"]
        out["zmq_relay_rtt_p99_ms"] = results["zmq"]["relay_rtt_p99_ms"]
    for name in MINE:
        if results.get(name):
            out[f"{PREFIX[name]}_rtt_breakdown_ms"] = results[name].get("rtt_breakdown_ms")
    for name in ("interchange", "manager"):
        if results.get(name):
            out[f"{PREFIX[name]}_manager_cmd"] = results[name].get("manager_cmd")
    if results.get("interchange"):
        out["skyfn_ix_pack_size"] = results["interchange"].get("pack_size")
        out["skyfn_ix_capacity"] = results["interchange"].get("capacity")
    for name in ("htex", "gce"):
        if results.get(name):
            out[f"{name}_version"] = results[name].get("parsl") or results[name].get("globus_compute_endpoint")
    out["errors"] = errors

    print()
    for mine in MINE:
        if results.get(mine) is None:
            continue
        for peer in ("htex", "gce", "zmq"):
            tput = ratios[f"{PREFIX[mine]}_over_{peer}_tasks_per_s"]
            rtt = ratios[f"{peer}_over_{PREFIX[mine]}_rtt_p50"]
            if tput is not None:
                print(f"{LABELS[mine]}: {tput:.2f}x the throughput of {peer}; {peer}'s rtt p50 is {rtt:.2f}x ours")
    if results.get("zmq"):
        print(f"raw zmq through one Python relay process (ROUTER -> relay -> 1 DEALER worker): round trip p50 "
              f"{out['zmq_relay_rtt_p50_ms']} ms, p99 {out['zmq_relay_rtt_p99_ms']} ms (the floor with a manager hop)")
    for name in MINE:
        bd = out.get(f"{PREFIX[name]}_rtt_breakdown_ms")
        if bd:
            print(f"{LABELS[name]}: round trip p50 {results[name]['rtt_p50_ms']} ms; medians by stage: "
                  + ", ".join(f"{k} {v}" for k, v in bd.items()))
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
