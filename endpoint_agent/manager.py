"""The manager process: owns N worker processes and feeds them tasks from the interchange.

`python -m endpoint_agent.manager --interchange tcp://127.0.0.1:PORT --identity ID
--workers N --capacity C`. It registers with the interchange over a DEALER socket,
asks for tasks by credit (it holds at most `capacity`), and hands them to workers over a
ROUTER socket in chunks sized to the backlog and the measured task duration: single
tasks when the backlog is small or tasks are long (latency, load balance), chunks of up
to MAX_CHUNK short tasks when the backlog is large (throughput). Results are forwarded
in batches.

A worker that dies is replaced. The task it was running (known from the shared slots)
is reported LOST to the interchange, which re-runs it or fails it after its retries;
the tasks queued behind it are given to other workers. A task past its walltime gets
its worker killed and is reported LOST with kind "timeout". The manager exits with its
parent (the agent), taking its workers with it.
"""
from __future__ import annotations

import argparse
import collections
import logging
import os
import signal
import subprocess
import sys
import time
import uuid

import zmq

from endpoint_agent import wire
from endpoint_agent.procutil import child_env, describe_exit, die_with_parent
from endpoint_agent.slots import Slots

log = logging.getLogger("skyfn.manager")

MAX_CHUNK = 64
CHUNK_TARGET_S = 0.005      # a chunk should hold about this much work
RUNNING_AFTER_S = 0.5       # report RUNNING for tasks running longer than this
CHECK_PERIOD_S = 0.1        # worker liveness, RUNNING reports, walltimes
HEARTBEAT_S = 1.0
RESPAWN_BACKOFF_MAX_S = 5.0


class WorkerProc:
    def __init__(self, slot: int, gen: int, proc: subprocess.Popen, identity: bytes):
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


class Manager:
    def __init__(self, interchange: str, identity: str, workers: int, capacity: int, parent: int):
        self.n_workers = workers
        self.capacity = max(capacity, workers)
        self.ctx = zmq.Context(1)
        self.ix = self.ctx.socket(zmq.DEALER)
        self.ix.setsockopt(zmq.IDENTITY, identity.encode())
        self.ix.setsockopt(zmq.LINGER, 2000)
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
        self.by_identity: dict[bytes, WorkerProc] = {}
        self.gen = 0
        self.respawn_at = [0.0] * workers
        self.fail_streak = [0] * workers
        self.backlog: collections.deque = collections.deque()
        self.functions: dict[str, str] = {}
        self.requested = 0
        self.results: list = []
        self.running_out: list = []
        self.lost_out: list = []
        self.running_reported: set[int] = set()
        self.avg_task_s = 0.0005
        self.stopping = False
        self.parent = parent

    # --- workers -----------------------------------------------------------
    def spawn(self, slot: int) -> None:
        self.gen += 1
        identity = f"w{slot}.{self.gen}".encode()
        self.slots.reset(slot)
        cmd = [sys.executable, "-m", "endpoint_agent.worker", "--connect", self.worker_addr,
               "--identity", identity.decode(), "--slot", str(slot), "--slots", str(self.n_workers),
               "--slots-fd", str(self.slots.fd), "--parent", str(os.getpid())]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, pass_fds=(self.slots.fd,), env=child_env())
        w = WorkerProc(slot, self.gen, proc, identity)
        self.workers[slot] = w
        self.by_identity[identity] = w

    def handle_death(self, w: WorkerProc, rc: int) -> None:
        self.drain_workers()  # results it sent before dying are still good
        started, running, _ts = self.slots.read(w.slot)
        culprit = started - w.reported - 1 if running else -1
        tasks = list(w.inflight)
        requeue = []
        for i, task in enumerate(tasks):
            key = task[0]
            self.running_reported.discard(key)
            if w.kill_reason and w.kill_reason[1] == key:
                self.lost_out.append([key, w.kill_reason[0], w.kill_reason[2]])
            elif i == culprit:
                self.lost_out.append([key, "died", f"worker process {w.proc.pid} {describe_exit(rc)} while running the task"])
            else:
                requeue.append(task)
        self.backlog.extendleft(reversed(requeue))
        self.by_identity.pop(w.identity, None)
        self.workers[w.slot] = None
        quick = time.monotonic() - w.started_at < 2.0 and not w.reported
        self.fail_streak[w.slot] = self.fail_streak[w.slot] + 1 if quick else 0
        streak = self.fail_streak[w.slot]  # deaths in a row right after start: back off
        delay = 0.0 if streak <= 1 else min(RESPAWN_BACKOFF_MAX_S, 0.1 * 2 ** streak)
        self.respawn_at[w.slot] = time.monotonic() + delay
        level = logging.INFO if w.kill_reason else logging.WARNING
        log.log(level, "worker %s (pid %s) %s; %d task(s) requeued, %d lost; replacing it%s", w.slot, w.proc.pid,
                describe_exit(rc), len(requeue), len(tasks) - len(requeue),
                f" in {delay:.1f} s" if delay else "")

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
            if not running or w.kill_reason:
                continue
            idx = started - w.reported - 1
            if not 0 <= idx < len(w.inflight):
                continue
            task = w.inflight[idx]
            key, walltime = task[0], task[3]
            elapsed = now_wall - ts
            if walltime and elapsed > walltime:
                w.kill_reason = ("timeout", key, f"walltime of {walltime:g} s exceeded")
                w.proc.kill()
            elif elapsed > RUNNING_AFTER_S and key not in self.running_reported:
                self.running_reported.add(key)
                self.running_out.append([key, ts])

    def drain_workers(self) -> None:
        sock = self.wsock
        while True:
            try:
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

    def on_results(self, w: WorkerProc, results: list) -> None:
        inflight = w.inflight
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
        if results:
            last = results[-1]
            self.avg_task_s = 0.8 * self.avg_task_s + 0.2 * max(1e-6, last[5] - last[4])
            self.results.extend(results)

    def dispatch(self) -> None:
        backlog = self.backlog
        if not backlog:
            return
        ready = [w for w in self.workers if w is not None and w.ready and w.kill_reason is None]
        if not ready:
            return
        n = len(ready)
        by_time = int(CHUNK_TARGET_S / self.avg_task_s) if self.avg_task_s > 0 else MAX_CHUNK
        size = max(1, min(MAX_CHUNK, len(backlog) // (2 * n), by_time))
        for w in ready:
            if not backlog:
                return
            if not w.inflight:
                self.send_chunk(w, size)
        # Large backlog: give each worker a second chunk so it never waits for a round trip.
        if size > 1 and len(backlog) >= 4 * n:
            for w in ready:
                if backlog and len(w.inflight) <= size:
                    self.send_chunk(w, size)

    def send_chunk(self, w: WorkerProc, size: int) -> None:
        backlog = self.backlog
        chunk = [backlog.popleft() for _ in range(min(size, len(backlog)))]
        fids = {t[1] for t in chunk} - w.known
        fns = {fid: self.functions[fid] for fid in fids if fid in self.functions}
        try:
            self.wsock.send_multipart([w.identity, wire.TASKS, wire.dumps({"f": fns, "t": chunk})])
        except zmq.ZMQError:  # the worker is gone; its death is handled on the next check
            backlog.extendleft(reversed(chunk))
            w.ready = False
            return
        w.known |= fids
        w.inflight.extend(chunk)

    # --- interchange -------------------------------------------------------
    def drain_interchange(self) -> None:
        sock = self.ix
        while True:
            try:
                op, body = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if op == wire.TASKS:
                msg = wire.loads(body)
                if msg.get("f"):
                    self.functions.update(msg["f"])
                tasks = msg["t"]
                self.backlog.extend(tasks)
                self.requested = max(0, self.requested - len(tasks))
            elif op == wire.STOP:
                self.stopping = True

    def held(self) -> int:
        return len(self.backlog) + sum(len(w.inflight) for w in self.workers if w is not None)

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
        if self.stopping:
            return
        held = self.held()
        want = self.capacity - held - self.requested
        if want > 0 and (want >= max(1, self.capacity // 4) or held + self.requested == 0):
            self.ix.send_multipart([wire.REQ, wire.dumps(want)])
            self.requested += want

    def heartbeat(self) -> None:
        pids = [w.proc.pid for w in self.workers if w is not None]
        running = sum(1 for i in range(self.n_workers) if self.workers[i] is not None and self.slots.read(i)[1])
        self.ix.send_multipart([wire.HB, wire.dumps({"workers": pids, "backlog": len(self.backlog), "running": running})])

    # --- main loop ---------------------------------------------------------
    def run(self) -> int:
        for slot in range(self.n_workers):
            self.spawn(slot)
        self.ix.send_multipart([wire.REG, wire.dumps(
            {"pid": os.getpid(), "workers": self.n_workers, "capacity": self.capacity})])
        self.heartbeat()
        poller = zmq.Poller()
        poller.register(self.ix, zmq.POLLIN)
        poller.register(self.wsock, zmq.POLLIN)
        next_check = time.monotonic() + CHECK_PERIOD_S
        next_hb = time.monotonic() + HEARTBEAT_S
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
                    if os.getppid() != self.parent:
                        log.warning("agent (pid %s) is gone; stopping", self.parent)
                        return 0
                if mono >= next_hb:
                    next_hb = mono + HEARTBEAT_S
                    self.heartbeat()
                self.send_upstream()
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="endpoint_agent.manager")
    ap.add_argument("--interchange", required=True)
    ap.add_argument("--identity", required=True)
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--capacity", type=int, required=True)
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--parent", type=int, required=True, help="the agent's pid")
    args = ap.parse_args(argv)
    die_with_parent()
    if os.getppid() != args.parent:  # the agent died while we were starting
        return 0
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    manager = Manager(args.interchange, args.identity, args.workers, args.capacity, args.parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: setattr(manager, "stopping", True))
    return manager.run()


if __name__ == "__main__":
    sys.exit(main())
