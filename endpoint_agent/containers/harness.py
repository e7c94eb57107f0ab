"""A process-level harness: real container workers (`endpoint_agent.manager.worker` wrapped by a
Runtime), placed by the WarmPool, fed over ZeroMQ like the manager feeds them, without
the interchange or the agent. The calling process plays the manager.

    rt = make_runtime(ContainerConfig(runtime="podman", types={"a": {"image": "host"}}))
    with ContainerPool(rt, slots=2, routing="warm") as pool:
        out = pool.run([("a", fn, (1,), {}), ...])   # [TaskResult], in submission order
        pool.stats()   # cold_starts, warm_hits, evictions, cold start times, ...

routing="warm": one queue, WarmPool.schedule (warm match first, else empty slot, else
evict the LRU idle worker of another type). routing="random": every task goes to a
random slot (seeded) and waits for it; a slot warm for another type is restarted with
the task's type (funcX's random-routing baseline).
"""
from __future__ import annotations

import collections
import os
import random
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import zmq

from endpoint_agent import wire
from endpoint_agent.containers.runtime import Launch, Runtime
from endpoint_agent.containers.warm_pool import COLD, EVICT, WARM, Decision, WarmPool
from endpoint_agent.slots import Slots
from skyfn.protocol.serialize import deserialize, pack_args, serialize_function


@dataclass
class TaskResult:
    key: int
    ctype: Optional[str]
    state: str
    value: Any = None
    error: Optional[str] = None
    slot: int = -1
    warm: bool = False
    submitted: float = 0.0
    done: float = 0.0


@dataclass
class _Worker:
    slot: int
    ctype: Optional[str]
    identity: bytes
    launch: Launch
    proc: subprocess.Popen
    spawned: float
    ready_at: Optional[float] = None
    known: set = field(default_factory=set)
    task: Optional[tuple] = None      # (key, fid, payload) sent, no result yet
    pending: Optional[tuple] = None   # waiting for READY


class ContainerPool:
    def __init__(self, runtime: Runtime, slots: int, *, routing: str = "warm", idle_timeout: float = 300.0,
                 half_life: float = 60.0, max_per_type: Optional[int] = None, seed: int = 0,
                 start_timeout: float = 60.0, stderr: Any = None):
        if routing not in ("warm", "random"):
            raise ValueError("routing must be 'warm' or 'random'")
        self.runtime = runtime
        self.n = slots
        self.routing = routing
        self.pool = WarmPool(slots, idle_timeout=idle_timeout, half_life=half_life, max_per_type=max_per_type)
        self.rng = random.Random(seed)
        self.start_timeout = start_timeout
        self.stderr = stderr
        self.ctx = zmq.Context(1)
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.addr = f"ipc://@skyfn-cpool-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.sock.bind(self.addr)
        self.slots = Slots(slots)
        self.workers: list[Optional[_Worker]] = [None] * slots
        self.by_id: dict[bytes, _Worker] = {}
        self.dying: list[tuple[_Worker, float]] = []
        self.gen = 0
        self.cold_start_s: list[float] = []
        self.random_stats = {"warm_hits": 0, "cold_starts": 0, "evictions": 0}
        self.functions: dict[str, str] = {}
        self._fid_by_fn: dict[int, str] = {}

    # --- workers ---------------------------------------------------------------------
    def _spawn(self, slot: int, ctype: Optional[str]) -> _Worker:
        self.gen += 1
        identity = f"w{slot}.{self.gen}".encode()
        self.slots.reset(slot)
        argv = [sys.executable, "-m", "endpoint_agent.manager.worker", "--connect", self.addr,
                "--identity", identity.decode(), "--slot", str(slot), "--slots", str(self.n), "--slots-fd", str(self.slots.fd),
                "--parent", str(os.getpid())]
        launch = self.runtime.wrap(ctype, argv, pass_fds=(self.slots.fd,),
                                   name=f"skyfn-w-{os.getpid()}-{slot}-{self.gen}")
        proc = launch.popen(stderr=self.stderr)
        w = _Worker(slot, ctype, identity, launch, proc, time.monotonic())
        self.workers[slot] = w
        self.by_id[identity] = w
        return w

    def _stop(self, slot: int) -> None:
        w = self.workers[slot]
        if w is None:
            return
        self.workers[slot] = None
        self.by_id.pop(w.identity, None)
        try:
            self.sock.send_multipart([w.identity, wire.STOP, b""], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        self.dying.append((w, time.monotonic()))

    def _reap(self, force: bool = False) -> None:
        keep = []
        for w, t0 in self.dying:
            if w.proc.poll() is not None:
                continue
            if force or time.monotonic() - t0 > 10.0:
                self.runtime.kill(w.launch, w.proc)
                try:
                    w.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
                continue
            keep.append((w, t0))
        self.dying = keep

    def _send(self, w: _Worker, task: tuple) -> None:
        key, fid, payload = task
        fns = {} if fid in w.known else {fid: self.functions[fid]}
        w.known.add(fid)
        w.task = task
        self.sock.send_multipart([w.identity, wire.TASKS, wire.dumps({"f": fns, "t": [[key, fid, payload, None, None]]})])

    def _assign(self, slot: int, ctype: Optional[str], task: tuple, restart: bool) -> None:
        if restart:
            self._stop(slot)
            w = self._spawn(slot, ctype)
            w.pending = task
        else:
            w = self.workers[slot]
            assert w is not None
            if w.ready_at is None:
                w.pending = task
            else:
                self._send(w, task)

    # --- running -----------------------------------------------------------------------
    def _fid(self, fn: Callable) -> str:
        fid = self._fid_by_fn.get(id(fn))
        if fid is None:
            fid = f"f{len(self._fid_by_fn)}"
            self._fid_by_fn[id(fn)] = fid
            self.functions[fid] = serialize_function(fn)
        return fid

    def run(self, tasks: Sequence[tuple], timeout: float = 600.0) -> list[TaskResult]:
        """Run [(ctype, fn, args, kwargs), ...]; results in submission order."""
        now = time.monotonic()
        results: list[Optional[TaskResult]] = [None] * len(tasks)
        queue: collections.deque = collections.deque()      # warm routing: (key, ctype, t0)
        per_slot = [collections.deque() for _ in range(self.n)]  # random routing
        specs = {}
        for key, (ctype, fn, args, *rest) in enumerate(tasks):
            kwargs = rest[0] if rest else {}
            specs[key] = (key, self._fid(fn), pack_args(tuple(args), dict(kwargs)))
            results[key] = TaskResult(key, ctype, "PENDING", submitted=now)
            self.pool.observe(ctype, now)
            if self.routing == "warm":
                queue.append((key, ctype, now))
            else:
                per_slot[self.rng.randrange(self.n)].append((key, ctype))
        remaining = len(tasks)
        deadline = now + timeout
        running: dict[int, int] = {}  # key -> slot
        while remaining:
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"{remaining} task(s) not done after {timeout} s")
            if self.routing == "warm":
                self._dispatch_warm(queue, specs, results, running, now)
            else:
                self._dispatch_random(per_slot, specs, results, running)
            for slot in self.pool.expire(now):
                self._stop(slot)
            self._check_workers(now)
            if self.sock.poll(20):
                while True:
                    try:
                        identity, op, body = self.sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    w = self.by_id.get(identity)
                    if w is None:
                        continue
                    if op == wire.READY:
                        w.ready_at = time.monotonic()
                        self.cold_start_s.append(w.ready_at - w.spawned)
                        self.pool.note_cold_start(w.ready_at - w.spawned)
                        if w.pending is not None:
                            task, w.pending = w.pending, None
                            self._send(w, task)
                    elif op == wire.RES:
                        t = time.monotonic()
                        for key, state, result, error, t0, t1, *_rest in wire.loads(body):
                            r = results[key]
                            self.pool.note_task(r.ctype, max(0.0, t1 - t0))
                            r.state, r.error, r.done, r.slot = state, error, t, w.slot
                            r.value = deserialize(result) if result is not None else None
                            running.pop(key, None)
                            remaining -= 1
                        w.task = None
                        self.pool.release(w.slot, t)
            self._reap()
        return results  # type: ignore[return-value]

    def _dispatch_warm(self, queue, specs, results, running, now) -> None:
        if not queue:
            return
        view = [(ctype, t0) for _key, ctype, t0 in queue]
        decisions = self.pool.schedule(view, now)
        if not decisions:
            return
        taken = set()
        items = list(queue)
        for i, d in decisions:
            key, ctype, _t0 = items[i]
            taken.add(i)
            results[key].warm = d.action == WARM
            running[key] = d.slot
            self._assign(d.slot, ctype, specs[key], restart=d.action in (COLD, EVICT))
        queue.clear()
        queue.extend(item for i, item in enumerate(items) if i not in taken)

    def _dispatch_random(self, per_slot, specs, results, running) -> None:
        for slot in range(self.n):
            q = per_slot[slot]
            w = self.workers[slot]
            if not q or (w is not None and (w.task is not None or w.pending is not None)):
                continue
            key, ctype = q.popleft()
            warm = w is not None and w.ctype == ctype
            st = self.random_stats
            if warm:
                st["warm_hits"] += 1
            else:
                st["cold_starts"] += 1
                if w is not None:
                    st["evictions"] += 1
            results[key].warm = warm
            running[key] = slot
            self._assign(slot, ctype, specs[key], restart=not warm)

    def _check_workers(self, now: float) -> None:
        for slot, w in enumerate(self.workers):
            if w is None:
                continue
            rc = w.proc.poll()
            if rc is None:
                if w.ready_at is None and now - w.spawned > self.start_timeout:
                    raise RuntimeError(f"worker in slot {slot} ({self.runtime.name}, type {w.ctype}) "
                                       f"not READY after {self.start_timeout} s: {w.launch.argv}")
                continue
            raise RuntimeError(f"worker in slot {slot} ({self.runtime.name}, type {w.ctype}) exited with "
                               f"code {rc} before its task was done: {w.launch.argv}")

    # --- results -------------------------------------------------------------------------
    def stats(self) -> dict:
        base = self.pool.stats.as_dict() if self.routing == "warm" else dict(self.random_stats)
        cs = sorted(self.cold_start_s)
        base["cold_start_s"] = {"n": len(cs), "p50": cs[len(cs) // 2] if cs else None,
                                "mean": sum(cs) / len(cs) if cs else None, "max": cs[-1] if cs else None}
        return base

    def close(self) -> None:
        for slot in range(self.n):
            self._stop(slot)
        deadline = time.monotonic() + 15.0
        while self.dying and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.02)
        self._reap(force=True)
        self.sock.close(0)
        self.ctx.term()
        self.slots.close()

    def __enter__(self) -> "ContainerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
