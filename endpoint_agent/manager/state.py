"""The manager's shared state: what every part of the manager process reads and writes.

The manager (manager.py) is composed of parts with one job each: worker supervision
(workers.py), task dispatch to workers inside the node (dispatch.py) and result
sending to the interchange (results.py); containers (routing, runtime, warm pool)
are configured by containers.py. They share one `ManagerState` -- the Manager is
one: the worker slots and their processes, the backlog per container type, the node's
free cores and accelerators, and what is due to go upstream (results, RUNNING, LOST and
BACK reports). Its few methods are the bookkeeping every part needs: queueing a task,
releasing a worker's resources, the number of tasks held and the warm containers.

A task is the interchange's tuple [key, function id, payload, walltime, container type,
cores, gpus, owner] (the owner absent from older agents). Imports go one way: this
module imports no part; only manager.py imports them all.
"""
from __future__ import annotations

import collections
import os
import socket
import subprocess
import time
from typing import Any

from endpoint_agent import wire

MAX_CHUNK = 64
CHUNK_TARGET_S = 0.005      # a chunk should hold about this much work
RUNNING_AFTER_S = 0.5       # report RUNNING for tasks running longer than this
CHECK_PERIOD_S = 0.1        # worker liveness, RUNNING reports, walltimes
HEARTBEAT_S = 2.0
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


class ManagerState:
    """The manager's records. `ix` is the DEALER to the interchange, `wsock` the ROUTER to
    the workers and `slots` their progress slots (endpoint_agent/slots.py); the manager sets them up."""

    def __init__(self, identity: str, workers: int, prefetch: int, parent: int | None = None, *,
                 block: str = "0", heartbeat: float = HEARTBEAT_S, cores: int | None = None,
                 accelerators: list[str] | None = None, max_output: int = 64 * 1024):
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
        self.parent = parent
        self.ix: Any = None
        self.wsock: Any = None
        self.worker_addr = ""
        self.slots: Any = None

        self.workers: list[WorkerProc | None] = [None] * workers
        self.slot_type: list[str] = [NONE] * workers
        self.by_identity: dict[bytes, WorkerProc] = {}
        self.gen = 0
        self.respawn_at = [0.0] * workers
        self.fail_streak = [0] * workers
        self.backlog: dict[Any, collections.deque] = {NONE: collections.deque()}  # plain tasks per type
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
        self.last_ix = time.monotonic()
        self.warm_dirty = False
        self.cold_starts = 0
        # containers (containers.py): set by the manager
        self.idle_timeout = 300.0
        self.routing = "warm"
        self.rng: Any = None
        self.runtime: Any = None
        self.pool: Any = None

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

    def _release(self, w: WorkerProc) -> None:
        """The cores and accelerators the worker held go back to the node."""
        if w.cores:
            self.cores_free += w.cores
            w.cores = 0
        if w.gpus:
            self.gpus_free.extend(w.gpus)
            w.gpus = []

    def held(self) -> int:
        return self.n_backlog + sum(len(w.inflight) for w in self.workers if w is not None)

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
