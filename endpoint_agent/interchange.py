"""The interchange: the agent's hub between the queues and the manager process.

It binds a ZeroMQ ROUTER on 127.0.0.1 (port chosen at start), starts the manager
process and restarts it if it dies (its tasks go back to the front of the line). Task
packs arrive from the poller thread; every task gets an integer key and waits in
`pending` until the manager has credit, then goes in one batch per message. Results
come back in batches, become TaskResult records with the agent-side events (DISPATCHED
when the pack was received, RUNNING and DONE from the worker), and leave as ResultPack
bodies through the outbox: at most `result_batch` per body, at most one send per
`result_flush_ms` (a lone result goes at once). A task message is acknowledged in the
same outbox operation as, and after, the last result of its pack.

Records are plain dicts/lists and bodies orjson: the wire shape is exactly
skyfn.protocol.messages.ResultPack (the tests validate it with the model), at a
fraction of the cost of building models per task.

Single-threaded: only `deliver` and `load` are called from the poller thread.
"""
from __future__ import annotations

import collections
import itertools
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import zmq

from endpoint_agent import wire
from endpoint_agent.config import EndpointConfig
from endpoint_agent.outbox import Outbox
from endpoint_agent.poller import Delivery
from endpoint_agent.procutil import child_env, describe_exit
from skyfn.protocol.messages import PACK_MAX_BYTES
from skyfn.protocol.states import now

log = logging.getLogger("skyfn.agent.interchange")

# task record fields
T_ID, T_FN, T_PAYLOAD, T_WALL, T_PACK, T_RECV, T_TRIES = range(7)
MANAGER_CHECK_S = 0.2
UPDATES_PER_BODY = 2000  # ~200 KB of TaskUpdates per result message at most
RUNNING_UPDATE = "RUNNING"


class ManagerHandle:
    """The interchange's view of one manager process."""

    def __init__(self, proc: subprocess.Popen, identity: bytes):
        self.proc = proc
        self.identity = identity
        self.registered = False
        self.credit = 0
        self.known: set[str] = set()   # function ids whose bodies it has
        self.assigned: set[int] = set()  # task keys it holds
        self.worker_pids: list[int] = []
        self.started = time.monotonic()


class Interchange:
    def __init__(self, config: EndpointConfig, endpoint_id: str, outbox: Outbox, ctx: zmq.Context | None = None):
        self.config = config
        self.endpoint_id = endpoint_id
        self.outbox = outbox
        self.capacity = config.capacity
        self.ctx = ctx or zmq.Context.instance()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.wake_addr = f"inproc://skyfn-wake-{uuid.uuid4().hex}"
        self.wake = self.ctx.socket(zmq.PULL)
        self.wake.bind(self.wake_addr)
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.poller.register(self.wake, zmq.POLLIN)

        # from the poller thread: appended there, popped here (deque is thread-safe for that)
        self.handoff: collections.deque[Delivery] = collections.deque()
        self.given = 0   # tasks delivered by the poller (written by the poller thread only)
        self.taken = 0   # tasks taken from the handoff (written by this thread only)
        self._wakers: dict[int, zmq.Socket] = {}

        self.keys = itertools.count(1)
        self.pack_seq = itertools.count(1)
        self.tasks: dict[int, list] = {}
        self.packs: dict[int, list] = {}          # seq -> [receipt, remaining]
        self.pending: collections.deque[int] = collections.deque()
        self.functions: dict[str, str] = {}

        self.results: list[dict] = []
        self.results_bytes = 0
        self.updates: list[dict] = []
        self.acks: list[str] = []
        self.flush_interval = config.result_flush_ms / 1000.0
        self.first_buffered = 0.0

        self.manager: ManagerHandle | None = None
        self.manager_gen = 0
        self.manager_restart_at = 0.0
        self.manager_failures = 0
        self.next_manager_check = 0.0
        self.manager_stats: dict[str, Any] = {}
        self.room_event = None  # set by the agent to the poller's event

        self.completed = 0
        self.failed = 0
        self.received_packs = 0
        self.received_tasks = 0
        self.retried = 0
        self.closing = False

    # --- poller side (other thread) --------------------------------------------
    def deliver(self, batch: list[Delivery], n_tasks: int) -> None:
        self.handoff.extend(batch)
        self.given += n_tasks
        self.wake_up()

    def wake_up(self) -> None:
        """Cut the loop's wait short (from another thread: poller, outbox)."""
        # one PUSH socket per calling thread (sockets are not thread-safe)
        if self.closing:
            return
        tid = threading.get_ident()
        try:
            sock = self._wakers.get(tid)
            if sock is None:
                sock = self.ctx.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(self.wake_addr)
                self._wakers[tid] = sock
            sock.send(b"", zmq.NOBLOCK)
        except zmq.ZMQError:  # wake-ups already queued (the loop will look anyway), or closing
            pass

    def load(self) -> int:
        """Tasks held: received and without a result sent to the outbox yet."""
        return len(self.tasks) + (self.given - self.taken)

    # --- manager process ---------------------------------------------------------
    def start_manager(self) -> None:
        self.manager_gen += 1
        identity = f"m{os.getpid()}.{self.manager_gen}".encode()
        cmd = [sys.executable, "-m", "endpoint_agent.manager", "--interchange", self.address,
               "--identity", identity.decode(), "--workers", str(self.config.workers),
               "--capacity", str(self.capacity), "--log-level", self.config.log_level, "--parent", str(os.getpid())]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=child_env())
        self.manager = ManagerHandle(proc, identity)
        log.info("started manager pid %s with %d workers", proc.pid, self.config.workers)

    def check_manager(self, mono: float) -> None:
        m = self.manager
        if m is None:
            if not self.closing and mono >= self.manager_restart_at:
                self.start_manager()
            return
        rc = m.proc.poll()
        if rc is None:
            return
        lost = sorted(m.assigned)
        self.manager = None
        for key in reversed(lost):
            if key in self.tasks:
                self.pending.appendleft(key)
        quick = not m.registered or mono - m.started < 1.0  # died right after start: back off
        self.manager_failures = self.manager_failures + 1 if quick else 0
        delay = min(10.0, 0.25 * 2 ** self.manager_failures) if self.manager_failures > 1 else 0.0
        self.manager_restart_at = mono + delay
        if not self.closing:
            log.error("manager (pid %s) %s; %d task(s) go back to the queue; restarting it%s", m.proc.pid,
                      describe_exit(rc), len(lost), f" in {delay:.1f} s" if delay else "")
            if not delay:
                self.start_manager()

    def stop_manager(self, timeout: float = 5.0) -> None:
        m = self.manager
        if m is None:
            return
        try:
            self.router.send_multipart([m.identity, wire.STOP, b""], zmq.NOBLOCK)
        except zmq.ZMQError:
            m.proc.terminate()
        try:
            m.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            m.proc.terminate()
            try:
                m.proc.wait(2)
            except subprocess.TimeoutExpired:
                m.proc.kill()
                m.proc.wait()
        self.manager = None

    # --- the loop -----------------------------------------------------------------
    def step(self, max_wait: float) -> None:
        """One round: wait for messages (at most max_wait s, less when a flush is due),
        take everything available, dispatch, flush."""
        wait = max_wait
        if self.results or self.updates or self.acks:
            wait = min(wait, max(0.0005, self.first_buffered + self.flush_interval - time.monotonic()))
        events = dict(self.poller.poll(wait * 1000))
        if self.wake in events:
            try:
                while True:
                    self.wake.recv(zmq.NOBLOCK)
            except zmq.Again:
                pass
        if self.handoff:
            self.ingest()
        if self.router in events:
            self.drain_router()
        mono = time.monotonic()
        if mono >= self.next_manager_check:
            self.next_manager_check = mono + MANAGER_CHECK_S
            self.check_manager(mono)
        self.dispatch()
        self.maybe_flush(mono)

    def ingest(self) -> None:
        handoff = self.handoff
        tasks = self.tasks
        pending = self.pending
        functions = self.functions
        while handoff:
            receipt, pack, recv_ts = handoff.popleft()
            n = len(pack.tasks)
            self.taken += n
            self.received_packs += 1
            self.received_tasks += n
            if pack.functions:
                functions.update(pack.functions)
            seq = next(self.pack_seq)
            self.packs[seq] = [receipt, n]
            if not n:
                self._pack_done(seq)
                continue
            for spec in pack.tasks:
                if spec.function_id not in functions:
                    self._add_result(
                        {"task_id": spec.task_id, "state": "FAILED", "events": [["DISPATCHED", recv_ts]],
                         "reason": f"the body of function {spec.function_id} was not in the task pack"}, seq)
                    continue
                key = next(self.keys)
                tasks[key] = [spec.task_id, spec.function_id, spec.payload, spec.walltime, seq, recv_ts, 0]
                pending.append(key)

    def drain_router(self) -> None:
        router = self.router
        for _ in range(10_000):
            try:
                identity, op, body = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            m = self.manager
            if m is None or identity != m.identity:
                continue  # a dead manager's last words
            if op == wire.RES:
                self.on_results(m, wire.loads(body))
            elif op == wire.REQ:
                m.credit += wire.loads(body)
            elif op == wire.RUN:
                self.on_running(wire.loads(body))
            elif op == wire.LOST:
                self.on_lost(m, wire.loads(body))
            elif op == wire.HB:
                self.manager_stats = wire.loads(body)
                m.worker_pids = self.manager_stats.get("workers", [])
            elif op == wire.REG:
                m.registered = True
                self.manager_failures = 0
                log.info("manager %s registered: %s", identity.decode(), body.decode())

    def dispatch(self) -> None:
        m = self.manager
        pending = self.pending
        if not pending or m is None or not m.registered or m.credit <= 0:
            return
        n = min(m.credit, len(pending))
        tasks = self.tasks
        batch = []
        fids = set()
        for _ in range(n):
            key = pending.popleft()
            t = tasks.get(key)
            if t is None:
                continue
            batch.append((key, t[T_FN], t[T_PAYLOAD], t[T_WALL]))
            fids.add(t[T_FN])
        if not batch:
            return
        new = fids - m.known
        fns = {fid: self.functions[fid] for fid in new}
        try:
            self.router.send_multipart([m.identity, wire.TASKS, wire.dumps({"f": fns, "t": batch})])
        except zmq.ZMQError as exc:  # not connected (yet, or any more)
            log.debug("dispatch to manager failed (%s); will retry", exc)
            pending.extendleft(reversed([b[0] for b in batch]))
            return
        m.credit -= len(batch)  # the manager counts what it receives
        m.known |= new
        m.assigned.update(b[0] for b in batch)

    # --- results --------------------------------------------------------------------
    def on_results(self, m: ManagerHandle, results: list) -> None:
        tasks = self.tasks
        assigned = m.assigned
        for key, state, result, error, start, done in results:
            t = tasks.pop(key, None)
            if t is None:
                continue
            assigned.discard(key)
            rec = {"task_id": t[T_ID], "state": state,
                   "events": [["DISPATCHED", t[T_RECV]], ["RUNNING", start], ["DONE", done]]}
            if result is not None:
                rec["result"] = result
            if error is not None:
                rec["error"] = error
            self._add_result(rec, t[T_PACK])
        self._room()

    def on_running(self, items: list) -> None:
        lease = self.config.lease_seconds
        for key, ts in items:
            t = self.tasks.get(key)
            if t is not None:
                if not (self.results or self.updates):
                    self.first_buffered = time.monotonic()
                self.updates.append({"task_id": t[T_ID], "state": RUNNING_UPDATE, "ts": ts, "lease_seconds": lease})

    def on_lost(self, m: ManagerHandle, items: list) -> None:
        for key, kind, reason in items:
            t = self.tasks.get(key)
            if t is None:
                continue
            m.assigned.discard(key)
            if kind == "timeout":
                del self.tasks[key]
                self._add_result({"task_id": t[T_ID], "state": "TIMED_OUT", "reason": reason,
                                  "events": [["DISPATCHED", t[T_RECV]]]}, t[T_PACK])
                continue
            t[T_TRIES] += 1
            if t[T_TRIES] > self.config.max_task_retries:
                del self.tasks[key]
                why = f"{reason} ({t[T_TRIES]} time{'s' if t[T_TRIES] > 1 else ''}; no retries left)"
                log.warning("task %s failed: %s", t[T_ID], why)
                self._add_result({"task_id": t[T_ID], "state": "FAILED", "reason": why,
                                  "events": [["DISPATCHED", t[T_RECV]]]}, t[T_PACK])
            else:
                self.retried += 1
                log.warning("task %s lost: %s; running it again", t[T_ID], reason)
                self.pending.appendleft(key)
        self._room()

    def _add_result(self, rec: dict, pack: int) -> None:
        if not self.results:
            self.first_buffered = time.monotonic()
        if rec["state"] == "SUCCEEDED":
            self.completed += 1
        else:
            self.failed += 1
        self.results.append(rec)
        self.results_bytes += 160 + len(rec.get("result") or "") + len(rec.get("error") or "")
        p = self.packs.get(pack)
        if p is not None:
            p[1] -= 1
            if p[1] <= 0:
                self._pack_done(pack)
        if len(self.results) >= self.config.result_batch or self.results_bytes >= PACK_MAX_BYTES:
            self.flush()

    def _pack_done(self, seq: int) -> None:
        receipt = self.packs.pop(seq)[0]
        self.acks.append(receipt)

    def _room(self) -> None:
        ev = self.room_event
        if ev is not None and not ev.is_set() and self.load() < self.capacity:
            ev.set()

    def maybe_flush(self, mono: float) -> None:
        """Flush when the outbox is idle (a lone result leaves at once), else let results
        accumulate while it sends, for at most result_flush_ms (batches grow with load)."""
        if not (self.results or self.updates or self.acks):
            return
        if self.outbox.idle() or mono - self.first_buffered >= self.flush_interval:
            self.flush()

    def flush(self) -> None:
        """Hand buffered results, updates and acks to the outbox as one operation."""
        if not (self.results or self.updates or self.acks):
            return
        eid = self.endpoint_id
        results, updates = self.results, self.updates
        batch = self.config.result_batch
        bodies = []
        if len(results) <= batch and self.results_bytes < PACK_MAX_BYTES and len(updates) <= UPDATES_PER_BODY:
            bodies.append(wire.dumps({"endpoint_id": eid, "results": results, "updates": updates}))
        else:
            chunk: list = []
            size = 0
            for rec in results:
                rb = 160 + len(rec.get("result") or "") + len(rec.get("error") or "")
                if chunk and (len(chunk) >= batch or size + rb > PACK_MAX_BYTES):
                    bodies.append(wire.dumps({"endpoint_id": eid, "results": chunk, "updates": []}))
                    chunk, size = [], 0
                chunk.append(rec)
                size += rb
            if chunk:
                bodies.append(wire.dumps({"endpoint_id": eid, "results": chunk, "updates": []}))
            for i in range(0, len(updates), UPDATES_PER_BODY):
                bodies.append(wire.dumps({"endpoint_id": eid, "results": [], "updates": updates[i:i + UPDATES_PER_BODY]}))
        self.outbox.put(bodies=bodies, acks=self.acks)
        self.results, self.updates, self.acks = [], [], []
        self.results_bytes = 0

    def extend_leases(self) -> None:
        """Extend the leases of every pack held, and tell the service (LEASE updates)."""
        receipts = [p[0] for p in self.packs.values()]
        if not receipts:
            return
        ts = now()
        lease = self.config.lease_seconds
        self.updates.extend({"task_id": t[T_ID], "state": "LEASE", "ts": ts, "lease_seconds": lease}
                            for t in self.tasks.values())
        self.outbox.put(extend=receipts)
        self.flush()

    # --- shutdown -------------------------------------------------------------------
    def close(self) -> None:
        self.closing = True
        self.stop_manager()
        for sock in list(self._wakers.values()):
            sock.close(0)
        self.router.close(0)
        self.wake.close(0)
