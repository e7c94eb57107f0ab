"""The manager process: owns N worker processes on one node and feeds them tasks.

Command line (stable; see wire.py for every option):
    python -m endpoint_agent.manager --interchange tcp://HOST:PORT --block BLOCK_ID --workers N
        [--server-key K] [--identity ID] [--prefetch P] [--heartbeat S] [--cores C]
        [--accelerators 0,1] [--containers JSON] [--max-output BYTES] [--parent PID]

It registers with the interchange over a DEALER socket (CurveZMQ when given the server's
public key), asks for tasks by credit (it holds at most workers + prefetch), heartbeats,
and hands tasks to workers over a ROUTER socket in chunks sized to the backlog and the
measured task duration: single tasks when the backlog is small or tasks are long
(latency, load balance), chunks of up to MAX_CHUNK short tasks when the backlog is large
(throughput). Results are forwarded in batches.

Worker slots have a container type ("none": a plain process). A task of type C goes to an
idle worker of type C (warm); when there is none, the warm-pool policy may turn an idle
worker of another type into a C worker (a cold start). With endpoint_agent.containers
present, its runtime wraps the worker command and its WarmPool makes that choice.

Resources: a task's {"cores", "gpus"} are granted from the node's cores and accelerators;
a task needing GPUs runs alone on a worker with CUDA_VISIBLE_DEVICES set to the ids
assigned to it (and OMP_NUM_THREADS to its cores); workers are held back rather than
oversubscribe the node. A task asking more than the node has fails with the reason.

A worker that dies is replaced. The task it was running (known from the shared slots)
is reported LOST to the interchange, which re-runs it or fails it after its retries;
the tasks queued behind it are given to other workers. A task past its walltime gets
its worker killed and is reported LOST with kind "timeout"; a cancelled running task gets
its worker killed, and nothing is reported. The manager exits with its parent (the agent,
for local managers), when told to, or when the interchange goes silent.
"""
from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from typing import Any

import zmq

from endpoint_agent import wire
from endpoint_agent.procutil import child_env, describe_exit, die_with_parent
from endpoint_agent.slots import Slots

log = logging.getLogger("skyfn.manager")

MAX_CHUNK = 64
CHUNK_TARGET_S = 0.005      # a chunk should hold about this much work
RUNNING_AFTER_S = 0.5       # report RUNNING for tasks running longer than this
CHECK_PERIOD_S = 0.1        # worker liveness, RUNNING reports, walltimes
HEARTBEAT_S = 2.0
SEND_TIMEOUT_S = 30.0       # a send to the interchange blocked this long ends the manager
RESPAWN_BACKOFF_MAX_S = 5.0
NONE = wire.NO_CONTAINER


def _cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def accelerators_from_env() -> list[str]:
    raw = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if not raw or raw in ("-1", "NoDevFiles"):
        return []
    return [a.strip() for a in raw.split(",") if a.strip()]


def _owner(task) -> str | None:
    """The submitting user of an interchange task tuple (its 8th field; absent from older agents)."""
    return task[7] if len(task) > 7 else None


class SimplePool:
    """The manager's warm-pool choice for a chunk-based worker pool: reuse an idle worker of
    the type; else turn the least recently used idle worker of another type into one, types
    above their share first, never one whose type still has a backlog and no more than its
    share. Shares are proportional to the tasks received per type; with
    endpoint_agent.containers present its WarmPool's decayed demand (`targets`) is used."""

    def __init__(self, slots: int = 1, half_life: float = 60.0) -> None:
        self.received: collections.Counter = collections.Counter()
        self.cold_starts = 0
        self.demand = None
        try:
            from endpoint_agent.containers.warm_pool import WarmPool

            self.demand = WarmPool(max(1, slots), half_life=half_life)
        except Exception:  # noqa: BLE001 - plain counts then
            self.demand = None

    def note(self, ctype: str, n: int) -> None:
        self.received[ctype] += n
        if self.demand is not None:
            self.demand.observe(ctype, time.monotonic(), n)

    def shares(self, total: int) -> dict[str, int]:
        if self.demand is not None:
            return {k: v for k, v in self.demand.targets(time.monotonic()).items()}
        total_recv = sum(self.received.values()) or 1
        return {k: max(1, round(total * v / total_recv)) for k, v in self.received.items()}

    def victim(self, ctype: str, idle: list["WorkerProc"], counts: dict[str, int], backlog: dict[str, int],
               total: int) -> "WorkerProc | None":
        shares = self.shares(total)
        cands = sorted((w for w in idle if w.ctype != ctype), key=lambda w: w.last_used)  # LRU first
        over = [w for w in cands if counts.get(w.ctype, 0) > shares.get(w.ctype, 0)]
        for w in over + cands:
            if not backlog.get(w.ctype) or w in over or counts.get(ctype, 0) == 0:
                return w
        return None


class WorkerProc:
    __slots__ = ("slot", "gen", "proc", "identity", "ready", "inflight", "reported", "known", "started_at",
                 "kill_reason", "ctype", "cores", "gpus", "last_used", "launch")

    def __init__(self, slot: int, gen: int, proc: subprocess.Popen, identity: bytes, ctype: str):
        self.slot = slot
        self.gen = gen
        self.proc = proc
        self.identity = identity
        self.ready = False
        self.inflight: collections.deque = collections.deque()  # tasks given, in order, no result yet
        self.reported = 0  # results received from this process
        self.known: set[str] = set()  # function ids this process has the body of
        self.started_at = time.monotonic()
        self.kill_reason: tuple[str, int, str] | None = None  # (kind, key, reason) when we killed it
        self.ctype = ctype
        self.cores = 0          # cores held while it has tasks
        self.gpus: list[str] = []  # accelerators held while it has tasks
        self.last_used = time.monotonic()
        self.launch = None


class Manager:
    def __init__(self, interchange: str, identity: str, workers: int, prefetch: int, parent: int | None = None, *,
                 block: str = "0", server_key: str | None = None, heartbeat: float = HEARTBEAT_S,
                 cores: int | None = None, accelerators: list[str] | None = None,
                 containers: dict[str, Any] | None = None, max_output: int = 64 * 1024):
        self.n_workers = workers
        self.capacity = workers + max(0, prefetch)
        self.block = block
        self.identity = identity
        self.heartbeat_s = heartbeat
        self.ix_timeout = max(10.0, 5 * heartbeat)
        self.node_cores = cores or max(_cpus(), workers)
        self.accelerators = list(accelerators if accelerators is not None else accelerators_from_env())
        self.cores_free = self.node_cores
        self.gpus_free = list(self.accelerators)
        self.max_output = max_output
        self.ctx = zmq.Context(1)
        self.ix = self.ctx.socket(zmq.DEALER)
        self.ix.setsockopt(zmq.IDENTITY, identity.encode())
        self.ix.setsockopt(zmq.LINGER, 2000)
        # A send that cannot go anywhere (the interchange never accepted us: wrong server
        # key, plaintext against Curve) must end the manager with a reason, not hang it.
        self.ix.setsockopt(zmq.SNDTIMEO, int(SEND_TIMEOUT_S * 1000))
        if server_key:
            pub, sec = zmq.curve_keypair()
            self.ix.curve_secretkey = sec
            self.ix.curve_publickey = pub
            self.ix.curve_serverkey = server_key.encode() if isinstance(server_key, str) else server_key
        self.ix.connect(interchange)
        self.wsock = self.ctx.socket(zmq.ROUTER)
        self.wsock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.wsock.setsockopt(zmq.LINGER, 0)
        if sys.platform.startswith("linux"):
            self.worker_addr = f"ipc://@skyfn-mgr-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self.wsock.bind(self.worker_addr)
        else:  # pragma: no cover
            port = self.wsock.bind_to_random_port("tcp://127.0.0.1")
            self.worker_addr = f"tcp://127.0.0.1:{port}"
        self.slots = Slots(workers)
        self.workers: list[WorkerProc | None] = [None] * workers
        self.slot_type: list[str] = [NONE] * workers
        self.by_identity: dict[bytes, WorkerProc] = {}
        self.gen = 0
        self.respawn_at = [0.0] * workers
        self.fail_streak = [0] * workers
        self.backlog: dict[str, collections.deque] = {NONE: collections.deque()}  # plain tasks per type
        self.rbacklog: collections.deque = collections.deque()  # tasks with resources (cores > 1 or gpus)
        self.n_backlog = 0
        self.functions: dict[str, str] = {}
        self.requested = 0
        self.results: list = []
        self.running_out: list = []
        self.lost_out: list = []
        self.back_out: list = []
        self.running_reported: set[int] = set()
        self.cancelled: set[int] = set()
        self.avg_task_s = 0.0005
        self.stopping = False
        self.draining = False
        self.parent = parent
        self.last_ix = time.monotonic()
        self.warm_dirty = False
        self.runtime, self.pool = self._containers(containers or {})
        self.cold_starts = 0

    # --- containers (colleague B's API when present) ------------------------------
    def _containers(self, settings: dict[str, Any]):
        self.idle_timeout = float(settings.get("idle_timeout", 300.0))
        self.routing = settings.get("routing") or "warm"
        if self.routing not in ("warm", "random"):
            log.error("containers.routing %r is not one of: warm, random; using warm", self.routing)
            self.routing = "warm"
        import random

        self.rng = random.Random(settings.get("routing_seed"))
        pool = SimplePool(self.n_workers, float(settings.get("demand_half_life", 60.0)))
        if not settings:
            return None, pool
        try:
            from endpoint_agent.containers import runtime_from_settings
        except ImportError:
            log.error("containers configured but endpoint_agent.containers is missing; workers run without them")
            return None, pool
        try:
            runtime = runtime_from_settings(settings)
        except Exception as exc:  # noqa: BLE001 - ContainerError / ContainerConfigError say why
            log.error("container runtime unusable (%s); workers run without containers", exc)
            runtime = None
        return runtime, pool

    def _popen(self, ctype: str, cmd: list[str], slot: int):
        """(process, launch) of a worker of this type: inside a container when a runtime is set."""
        if self.runtime is None:
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, pass_fds=(self.slots.fd,), env=child_env()), None
        launch = self.runtime.wrap(None if ctype == NONE else ctype, cmd, pass_fds=(self.slots.fd,),
                                   name=f"skyfn-w-{os.getpid()}-{slot}-{self.gen}")
        return launch.popen(), launch

    # --- workers -----------------------------------------------------------
    def spawn(self, slot: int) -> None:
        self.gen += 1
        ctype = self.slot_type[slot]
        identity = f"w{slot}.{self.gen}".encode()
        self.slots.reset(slot)
        cmd = [sys.executable, "-m", "endpoint_agent.worker", "--connect", self.worker_addr,
               "--identity", identity.decode(), "--slot", str(slot), "--slots", str(self.n_workers),
               "--slots-fd", str(self.slots.fd), "--parent", str(os.getpid()), "--max-output", str(self.max_output)]
        if ctype != NONE:
            self.cold_starts += 1
        try:
            proc, launch = self._popen(ctype, cmd, slot)
        except Exception as exc:  # noqa: BLE001 - a container that cannot start: plain worker
            log.error("cannot start a %s worker (%s); slot %d runs a plain worker", ctype, exc, slot)
            self.slot_type[slot] = ctype = NONE
            proc, launch = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, pass_fds=(self.slots.fd,),
                                            env=child_env()), None
        w = WorkerProc(slot, self.gen, proc, identity, ctype)
        w.launch = launch
        self.workers[slot] = w
        self.by_identity[identity] = w
        self.warm_dirty = True

    def _release(self, w: WorkerProc) -> None:
        if w.cores:
            self.cores_free += w.cores
            w.cores = 0
        if w.gpus:
            self.gpus_free.extend(w.gpus)
            w.gpus = []

    def handle_death(self, w: WorkerProc, rc: int) -> None:
        self.drain_workers()  # results it sent before dying are still good
        started, running, _ts = self.slots.read(w.slot)
        culprit = started - w.reported - 1 if running else -1
        tasks = list(w.inflight)
        requeue = []
        for i, task in enumerate(tasks):
            key = task[0]
            self.running_reported.discard(key)
            if key in self.cancelled:
                self.cancelled.discard(key)
            elif w.kill_reason and w.kill_reason[1] == key:
                if w.kill_reason[0] != "cancelled":
                    self.lost_out.append([key, w.kill_reason[0], w.kill_reason[2]])
            elif i == culprit:
                self.lost_out.append([key, "died", f"worker process {w.proc.pid} {describe_exit(rc)} while running the task"])
            else:
                requeue.append(task)
        w.inflight.clear()
        self._release(w)
        for task in reversed(requeue):
            self._queue_front(task)
        self.by_identity.pop(w.identity, None)
        self.workers[w.slot] = None
        self.warm_dirty = True
        quick = time.monotonic() - w.started_at < 2.0 and not w.reported and not w.kill_reason
        self.fail_streak[w.slot] = self.fail_streak[w.slot] + 1 if quick else 0
        streak = self.fail_streak[w.slot]  # deaths in a row right after start: back off
        delay = 0.0 if streak <= 1 else min(RESPAWN_BACKOFF_MAX_S, 0.1 * 2 ** streak)
        self.respawn_at[w.slot] = time.monotonic() + delay
        level = logging.INFO if w.kill_reason else logging.WARNING
        log.log(level, "worker %s (pid %s) %s; %d task(s) requeued, %d lost; replacing it%s", w.slot, w.proc.pid,
                describe_exit(rc), len(requeue), len(tasks) - len(requeue),
                f" in {delay:.1f} s" if delay else "")

    def kill_worker(self, w: WorkerProc, kind: str, key: int, reason: str) -> None:
        if w.kill_reason is None:
            w.kill_reason = (kind, key, reason)
            try:
                w.proc.kill()
            except OSError:
                pass
            if w.launch is not None and self.runtime is not None and w.launch.runtime != "none":
                # the container itself, off the loop (the runtime's CLI may take a while)
                import threading

                threading.Thread(target=self.runtime.kill, args=(w.launch, w.proc), kwargs={"always": True},
                                 daemon=True).start()  # the client was killed above; the container lives on

    def check_workers(self, now_wall: float) -> None:
        mono = time.monotonic()
        for slot in range(self.n_workers):
            w = self.workers[slot]
            if w is None:
                if mono >= self.respawn_at[slot] and not self.stopping:
                    self.spawn(slot)
                continue
            rc = w.proc.poll()
            if rc is not None:
                self.handle_death(w, rc)
                if mono >= self.respawn_at[slot] and not self.stopping:
                    self.spawn(slot)
                continue
            started, running, ts = self.slots.read(slot)
            if w.ctype != NONE and not w.inflight and w.ready and not w.kill_reason \
                    and mono - w.last_used > self.idle_timeout:
                log.info("worker %s: idle %s container for %.0f s; stopping it", slot, w.ctype, mono - w.last_used)
                self.slot_type[slot] = NONE
                self.kill_worker(w, "evict", -1, "idle")
                continue
            if not running or w.kill_reason:
                continue
            idx = started - w.reported - 1
            if not 0 <= idx < len(w.inflight):
                continue
            task = w.inflight[idx]
            key, walltime = task[0], task[3]
            elapsed = now_wall - ts
            if key in self.cancelled:
                self.kill_worker(w, "cancelled", key, "cancelled")
            elif walltime and elapsed > walltime:
                self.kill_worker(w, "timeout", key, f"walltime of {walltime:g} s exceeded")
            elif elapsed > RUNNING_AFTER_S and key not in self.running_reported:
                self.running_reported.add(key)
                self.running_out.append([key, ts])

    def drain_workers(self) -> None:
        sock = self.wsock
        EVENTS, POLLIN = zmq.EVENTS, zmq.POLLIN
        while True:
            try:  # ZMQ_EVENTS first: cheaper than a recv that raises Again
                if not sock.getsockopt(EVENTS) & POLLIN:
                    return
                identity, op, body = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            w = self.by_identity.get(identity)
            if w is None:
                continue  # a replaced worker's last words: its tasks were already requeued
            if op == wire.RES:
                self.on_results(w, wire.loads(body))
            elif op == wire.READY:
                w.ready = True
                self.fail_streak[w.slot] = 0
                self.warm_dirty = True

    def on_results(self, w: WorkerProc, results: list) -> None:
        inflight = w.inflight
        cancelled = self.cancelled
        for res in results:
            key = res[0]
            if inflight and inflight[0][0] == key:
                inflight.popleft()
            else:  # out of order should not happen; stay correct anyway
                for i, task in enumerate(inflight):
                    if task[0] == key:
                        del inflight[i]
                        break
            w.reported += 1
            if self.running_reported:
                self.running_reported.discard(key)
        if cancelled:
            results = [r for r in results if r[0] not in cancelled or cancelled.discard(r[0])]
        if not inflight:
            self._release(w)
            w.last_used = time.monotonic()
            self.warm_dirty = self.warm_dirty or w.ctype != NONE
        if results:
            last = results[-1]
            self.avg_task_s = 0.8 * self.avg_task_s + 0.2 * max(1e-6, last[5] - last[4])
            self.results.extend(results)

    # --- placement inside the node --------------------------------------------
    def _queue(self, task: list) -> None:
        ctype = task[4] or NONE
        cores, gpus = task[5] or 1, task[6] or 0
        if cores > self.node_cores or gpus > len(self.accelerators):
            self.lost_out.append([task[0], "fail",
                                  f"the task needs {cores} core(s) and {gpus} GPU(s); this node ({socket.gethostname()}, "
                                  f"manager {self.identity}) has {self.node_cores} core(s) and "
                                  f"{len(self.accelerators)} GPU(s) {self.accelerators}"])
            return
        if cores > 1 or gpus:
            self.rbacklog.append(task)
        else:
            dq = self.backlog.get(ctype)
            if dq is None:
                dq = self.backlog[ctype] = collections.deque()
            dq.append(task)
        self.n_backlog += 1
        self.pool.note(ctype, 1)

    def _queue_front(self, task: list) -> None:
        cores, gpus = task[5] or 1, task[6] or 0
        if cores > 1 or gpus:
            self.rbacklog.appendleft(task)
        else:
            self.backlog.setdefault(task[4] or NONE, collections.deque()).appendleft(task)
        self.n_backlog += 1

    def _wire_task(self, task: list, env: dict | None = None) -> list:
        return [task[0], task[1], task[2], task[3], env, _owner(task)]

    def dispatch(self) -> None:
        if not self.n_backlog:
            return
        workers = self.workers
        ready = [w for w in workers if w is not None and w.ready and w.kill_reason is None]
        if not ready:
            return
        if self.rbacklog:
            self._dispatch_resources(ready)
        if self.routing == "random":
            return self._dispatch_random(ready)
        for ctype, dq in self.backlog.items():
            if not dq:
                continue
            mine = [w for w in ready if w.ctype == ctype] if ctype != NONE or len(self.backlog) > 1 or \
                self.slot_type.count(NONE) != self.n_workers else ready
            n = len(mine)
            if n:
                by_time = int(CHUNK_TARGET_S / self.avg_task_s) if self.avg_task_s > 0 else MAX_CHUNK
                size = max(1, min(MAX_CHUNK, len(dq) // (2 * n), by_time))
                for w in mine:
                    if not dq:
                        break
                    if not w.inflight and not w.gpus and self.cores_free >= 1:
                        self.cores_free -= 1
                        w.cores = 1
                        self.send_chunk(w, dq, size)
                # Large backlog: give each worker a second chunk so it never waits for a round trip.
                if size > 1 and len(dq) >= 4 * n:
                    for w in mine:
                        if dq and w.inflight and w.cores == 1 and not w.gpus and len(w.inflight) <= size:
                            self.send_chunk(w, dq, size)
            if dq and not self.draining:
                self._convert(ctype, ready)

    def _convert(self, ctype: str, ready: list[WorkerProc]) -> None:
        """No idle worker of this type: maybe cold-start one in place of an idle other-type worker.
        Not one whose own type has queued tasks: dispatch feeds it later in the same pass."""
        backlog = self.backlog
        idle = [w for w in ready if not w.inflight and w.ctype != ctype and not backlog.get(w.ctype)]
        if not idle:
            return
        workers = self.workers
        starting = sum(1 for s, t in enumerate(self.slot_type) if t == ctype and (workers[s] is None or not workers[s].ready))
        if starting >= (len(backlog.get(ctype, ())) or 1):
            return  # workers of this type already starting will take its queued tasks
        counts = collections.Counter(self.slot_type)
        backlog = {t: len(d) for t, d in self.backlog.items()}
        w = self.pool.victim(ctype, idle, counts, backlog, self.n_workers)
        if w is None:
            return
        log.info("worker %s: %s -> %s (cold start)", w.slot, w.ctype, ctype)
        self.slot_type[w.slot] = ctype
        self.kill_worker(w, "evict", -1, "evicted")
        self.respawn_at[w.slot] = 0.0
        w.ready = False
        ready.remove(w)  # dispatch's list: nothing more is sent to it in this pass

    def _dispatch_random(self, ready: list[WorkerProc]) -> None:
        """containers.routing: random (funcX's baseline): each task is bound to a slot drawn
        uniformly at random (kept in self.backlog under the slot's int index, so cancel and
        drain see it) and waits for it; a slot whose worker is of another type is restarted
        as the task's type (a cold start). One task at a time per worker."""
        backlog = self.backlog
        n = self.n_workers
        new = []
        for key, dq in backlog.items():
            if dq and not isinstance(key, int):
                new.extend(dq)
                dq.clear()
        for task in sorted(new, key=lambda t: t[0]):  # keys grow in arrival order
            backlog.setdefault(self.rng.randrange(n), collections.deque()).append(task)
        for w in ready:
            dq = backlog.get(w.slot)
            if not dq or w.inflight or w.gpus:
                continue
            ctype = dq[0][4] or NONE
            if w.ctype != ctype:
                if not self.draining:
                    log.info("worker %s: %s -> %s (random routing, cold start)", w.slot, w.ctype, ctype)
                    self.slot_type[w.slot] = ctype
                    self.kill_worker(w, "evict", -1, "evicted")
                    self.respawn_at[w.slot] = 0.0
                    w.ready = False
                continue
            if self.cores_free >= 1:
                self.cores_free -= 1
                w.cores = 1
                self.send_chunk(w, dq, 1)

    def _dispatch_resources(self, ready: list[WorkerProc]) -> None:
        """Tasks with cores/GPUs: one at a time, on an idle worker, when the node has room."""
        rb = self.rbacklog
        for _ in range(len(rb)):
            task = rb[0]
            cores, gpus = task[5] or 1, task[6] or 0
            if cores > self.cores_free or gpus > len(self.gpus_free):
                break  # in order: hold workers back until the node has room for it
            ctype = task[4] or NONE
            w = next((w for w in ready if not w.inflight and w.ctype == ctype), None)
            if w is None:
                if not self.draining:
                    self._convert(ctype, ready)
                break
            rb.popleft()
            self.n_backlog -= 1
            self.cores_free -= cores
            w.cores = cores
            w.gpus = [self.gpus_free.pop(0) for _ in range(gpus)]
            env = {"OMP_NUM_THREADS": str(cores)}
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(w.gpus)
            self._send(w, [task], [self._wire_task(task, env)])

    def send_chunk(self, w: WorkerProc, dq: collections.deque, size: int) -> None:
        chunk = [dq.popleft() for _ in range(min(size, len(dq)))]
        self.n_backlog -= len(chunk)
        self._send(w, chunk, [[t[0], t[1], t[2], t[3], None, _owner(t)] for t in chunk])

    def _send(self, w: WorkerProc, chunk: list, wire_tasks: list) -> None:
        fids = {t[1] for t in chunk} - w.known
        fns = {fid: self.functions[fid] for fid in fids if fid in self.functions}
        try:
            self.wsock.send_multipart([w.identity, wire.TASKS, wire.dumps({"f": fns, "t": wire_tasks})])
        except zmq.ZMQError:  # the worker is gone; its death is handled on the next check
            for task in reversed(chunk):
                self._queue_front(task)
            if not w.inflight:
                self._release(w)
            w.ready = False
            return
        w.known |= fids
        w.inflight.extend(chunk)
        if w.ctype != NONE:
            self.warm_dirty = True

    # --- interchange -------------------------------------------------------
    def drain_interchange(self) -> None:
        sock = self.ix
        EVENTS, POLLIN = zmq.EVENTS, zmq.POLLIN
        while True:
            try:  # ZMQ_EVENTS first: cheaper than a recv that raises Again
                if not sock.getsockopt(EVENTS) & POLLIN:
                    return
                op, body = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.last_ix = time.monotonic()
            if op == wire.TASKS:
                msg = wire.loads(body)
                if msg.get("f"):
                    self.functions.update(msg["f"])
                tasks = msg["t"]
                self.requested = max(0, self.requested - len(tasks))
                if self.draining:
                    self.back_out.extend(t[0] for t in tasks)
                    continue
                if len(self.backlog) == 1 and not self.rbacklog:
                    dq = self.backlog[NONE]
                    plain = True
                    for t in tasks:
                        if t[4] is not None or t[5] or t[6]:
                            plain = False
                            break
                    if plain:
                        dq.extend(tasks)
                        self.n_backlog += len(tasks)
                        self.pool.note(NONE, len(tasks))
                        continue
                for t in tasks:
                    self._queue(t)
            elif op == wire.CANCEL:
                self.on_cancel(wire.loads(body))
            elif op == wire.HB:
                pass
            elif op == wire.DRAIN:
                self.start_drain()
            elif op == wire.STOP:
                self.stopping = True

    def on_cancel(self, keys: list[int]) -> None:
        want = set(keys)
        for dq in list(self.backlog.values()) + [self.rbacklog]:
            if want and any(t[0] in want for t in dq):
                kept = [t for t in dq if t[0] not in want]
                self.n_backlog -= len(dq) - len(kept)
                want -= {t[0] for t in dq}
                dq.clear()
                dq.extend(kept)
        for w in self.workers:
            if w is None or not want:
                continue
            for task in w.inflight:
                if task[0] in want:
                    self.cancelled.add(task[0])
                    want.discard(task[0])
        if self.cancelled:
            self.check_workers(time.time())  # kill the running ones now

    def start_drain(self) -> None:
        if self.draining:
            return
        self.draining = True
        log.info("draining: taking no more tasks; %d queued task(s) given back", self.n_backlog)
        for dq in list(self.backlog.values()) + [self.rbacklog]:
            self.back_out.extend(t[0] for t in dq)
            dq.clear()
        self.n_backlog = 0

    def held(self) -> int:
        return self.n_backlog + sum(len(w.inflight) for w in self.workers if w is not None)

    def send_upstream(self) -> None:
        if self.results:
            self.ix.send_multipart([wire.RES, wire.dumps(self.results)])
            self.results = []
        if self.running_out:
            self.ix.send_multipart([wire.RUN, wire.dumps(self.running_out)])
            self.running_out = []
        if self.lost_out:
            self.ix.send_multipart([wire.LOST, wire.dumps(self.lost_out)])
            self.lost_out = []
        if self.back_out:
            self.ix.send_multipart([wire.BACK, wire.dumps(self.back_out)])
            self.back_out = []
        if self.stopping or self.draining:
            return
        held = self.held()
        want = self.capacity - held - self.requested
        if want > 0 and (want >= max(1, self.capacity // 4) or held + self.requested == 0):
            self.ix.send_multipart([wire.REQ, wire.dumps(want)])
            self.requested += want

    def warm(self) -> tuple[dict[str, int], dict[str, int]]:
        """(idle warm workers per container type, live workers per type); type "none" left out."""
        idle: dict[str, int] = {}
        live: dict[str, int] = {}
        for w in self.workers:
            if w is None or w.ctype == NONE or w.kill_reason:
                continue
            live[w.ctype] = live.get(w.ctype, 0) + 1
            if w.ready and not w.inflight:
                idle[w.ctype] = idle.get(w.ctype, 0) + 1
        return idle, live

    def heartbeat(self) -> None:
        running = []
        for i, w in enumerate(self.workers):
            if w is not None and w.inflight:
                started, run, _ = self.slots.read(i)
                idx = started - w.reported - 1
                if run and 0 <= idx < len(w.inflight):
                    running.append(w.inflight[idx][0])
        idle, live = self.warm()
        free = sum(1 for w in self.workers if w is not None and w.ready and not w.inflight)
        self.ix.send_multipart([wire.HB, wire.dumps({
            "running": running, "free": free, "backlog": self.n_backlog, "warm": idle, "containers": live,
            "cold_starts": self.cold_starts, "workers": [w.proc.pid for w in self.workers if w is not None],
            "draining": self.draining})])
        self.warm_dirty = False

    def registration(self) -> dict[str, Any]:
        idle, live = self.warm()
        return {"pid": os.getpid(), "hostname": socket.gethostname(), "block": self.block,
                "workers": self.n_workers, "capacity": self.capacity, "cores": self.node_cores,
                "accelerators": self.accelerators, "warm": idle, "containers": live, "cold_starts": self.cold_starts}

    # --- main loop ---------------------------------------------------------
    def run(self) -> int:
        for slot in range(self.n_workers):
            self.spawn(slot)
        self.ix.send_multipart([wire.REG, wire.dumps(self.registration())])
        self.heartbeat()
        poller = zmq.Poller()
        poller.register(self.ix, zmq.POLLIN)
        poller.register(self.wsock, zmq.POLLIN)
        next_check = time.monotonic() + CHECK_PERIOD_S
        next_hb = time.monotonic() + self.heartbeat_s
        try:
            while not self.stopping:
                timeout = max(0.0, next_check - time.monotonic())
                events = dict(poller.poll(timeout * 1000))
                if self.ix in events:
                    self.drain_interchange()
                if self.wsock in events:
                    self.drain_workers()
                self.dispatch()
                mono = time.monotonic()
                if mono >= next_check:
                    next_check = mono + CHECK_PERIOD_S
                    self.check_workers(time.time())
                    self.dispatch()
                    if self.parent is not None and os.getppid() != self.parent:
                        log.warning("agent (pid %s) is gone; stopping", self.parent)
                        return 0
                    if mono - self.last_ix > self.ix_timeout:
                        log.warning("interchange silent for %.0f s; stopping", mono - self.last_ix)
                        return 0
                    if self.warm_dirty:
                        next_hb = mono  # tell the interchange about warm containers soon
                if mono >= next_hb:
                    next_hb = mono + self.heartbeat_s
                    self.heartbeat()
                self.send_upstream()
                if self.draining and self.held() == 0 and not self.back_out:
                    self.ix.send_multipart([wire.BYE, b""])
                    log.info("drained; exiting")
                    return 0
            self.send_upstream()
            return 0
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """STOP to every worker; the idle ones leave at once, the ones still in user code
        get SIGTERM after a moment, SIGKILL if that does not end them."""
        self.stopping = True
        alive = [w for w in self.workers if w is not None and w.proc.poll() is None]
        for w in alive:
            try:
                self.wsock.send_multipart([w.identity, wire.STOP, b""], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and any(w.proc.poll() is None for w in alive):
            time.sleep(0.01)
        for w in alive:
            if w.proc.poll() is None:
                try:
                    w.proc.terminate()
                except OSError:
                    pass
        deadline = time.monotonic() + 3.0
        for w in alive:
            try:
                w.proc.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        self.wsock.close(0)
        self.ix.close(1000)
        self.ctx.term()
        self.slots.close()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="endpoint_agent.manager",
                                 description="A skyfn manager: runs workers on this node for an interchange.")
    ap.add_argument("--interchange", required=True, help="tcp://HOST:PORT (or ipc://...) of the interchange")
    ap.add_argument("--block", default="0", help="the block (batch job) this manager belongs to")
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--server-key", default=None,
                    help="the interchange's CurveZMQ public key (Z85); default: env SKYFN_SERVER_KEY")
    ap.add_argument("--identity", default=None)
    ap.add_argument("--prefetch", type=int, default=None, help="tasks held beyond the workers (default 2 * workers)")
    ap.add_argument("--capacity", type=int, default=None, help=argparse.SUPPRESS)  # old spelling: workers + prefetch
    ap.add_argument("--heartbeat", type=float, default=HEARTBEAT_S)
    ap.add_argument("--cores", type=int, default=None)
    ap.add_argument("--accelerators", default=None, help="comma-separated ids; default: CUDA_VISIBLE_DEVICES")
    ap.add_argument("--containers", default=None, help="JSON settings of endpoint_agent.containers")
    ap.add_argument("--max-output", type=int, default=64 * 1024)
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--parent", type=int, default=None, help="exit when this process (the agent) dies")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.parent is not None:
        die_with_parent()
        if os.getppid() != args.parent:  # the agent died while we were starting
            return 0
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    prefetch = args.prefetch
    if prefetch is None:
        prefetch = args.capacity - args.workers if args.capacity is not None else 2 * args.workers
    accelerators = None
    if args.accelerators is not None:
        accelerators = [a.strip() for a in args.accelerators.split(",") if a.strip()]
    identity = args.identity or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    server_key = args.server_key or os.environ.get("SKYFN_SERVER_KEY") or None
    containers = json.loads(args.containers) if args.containers else None
    manager = Manager(args.interchange, identity, args.workers, prefetch, args.parent, block=args.block,
                      server_key=server_key, heartbeat=args.heartbeat, cores=args.cores, accelerators=accelerators,
                      containers=containers, max_output=args.max_output)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: setattr(manager, "stopping", True))
    try:
        return manager.run()
    except zmq.Again:
        logging.getLogger("skyfn.manager").error(
            "cannot send to the interchange at %s for %.0f s: it did not accept this manager "
            "(check --server-key / SKYFN_SERVER_KEY and the address); exiting", args.interchange, SEND_TIMEOUT_S)
        return 3


if __name__ == "__main__":
    sys.exit(main())
