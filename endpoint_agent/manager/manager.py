"""The manager process: owns N worker processes on one node and feeds them tasks.

Command line (stable; see endpoint_agent/wire.py for every option):
    python -m endpoint_agent.manager --interchange tcp://HOST:PORT --block BLOCK_ID --workers N
        [--server-key K] [--identity ID] [--prefetch P] [--heartbeat S] [--cores C]
        [--accelerators 0,1] [--containers JSON] [--max-output BYTES] [--parent PID]

It registers with the interchange over a DEALER socket (CurveZMQ when given the server's
public key), asks for tasks by credit (it holds at most workers + prefetch), heartbeats,
and hands tasks to workers over a ROUTER socket. This module is the process: its
sockets, the interchange's messages in (TASKS, CANCEL, DRAIN, STOP), registration and
heartbeats, and the loop. The work is done by parts with one job each, sharing the
manager's state (a ManagerState, state.py; the Manager is one):
  - workers.py         worker supervision: processes, liveness, deaths, walltimes;
  - dispatch.py        task dispatch inside the node: chunks, warm containers, resources;
  - results.py         result sending: worker results in, results, reports and credit out;
  - containers.py      the containers settings and the warm-pool choice.

A worker that dies is replaced. The task it was running (known from the shared slots)
is reported LOST to the interchange, which re-runs it or fails it after its retries;
the tasks queued behind it are given to other workers. A task past its walltime gets
its worker killed and is reported LOST with kind "timeout"; a cancelled running task gets
its worker killed, and nothing is reported. The manager exits with its parent (the agent,
for local managers), when told to, or when the interchange goes silent.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import time
import uuid
from typing import Any

import zmq

from endpoint_agent import wire
from endpoint_agent.manager.containers import SimplePool, configure  # noqa: F401 - SimplePool re-exported
from endpoint_agent.manager.dispatch import TaskDispatcher
from endpoint_agent.manager.results import ResultSender
from endpoint_agent.manager.state import (  # noqa: F401 - re-exported
    CHECK_PERIOD_S, CHUNK_TARGET_S, HEARTBEAT_S, MAX_CHUNK, NONE, RESPAWN_BACKOFF_MAX_S, RUNNING_AFTER_S,
    ManagerState, WorkerProc, _cpus, _owner, accelerators_from_env,
)
from endpoint_agent.manager.workers import WorkerSupervisor
from endpoint_agent.procutil import die_with_parent
from endpoint_agent.slots import Slots

log = logging.getLogger("skyfn.manager")

SEND_TIMEOUT_S = 30.0       # a send to the interchange blocked this long ends the manager


class Manager(ManagerState):
    def __init__(self, interchange: str, identity: str, workers: int, prefetch: int, parent: int | None = None, *,
                 block: str = "0", server_key: str | None = None, heartbeat: float = HEARTBEAT_S,
                 cores: int | None = None, accelerators: list[str] | None = None,
                 containers: dict[str, Any] | None = None, max_output: int = 64 * 1024):
        ManagerState.__init__(self, identity, workers, prefetch, parent, block=block, heartbeat=heartbeat,
                              cores=cores, accelerators=accelerators, max_output=max_output)
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
        self.idle_timeout, self.routing, self.rng, self.runtime, self.pool = configure(containers or {}, workers)

        # the parts: they keep no reference to this state, their methods take it
        self.sender = ResultSender()
        self.supervisor = WorkerSupervisor(self.sender)
        self.dispatcher = TaskDispatcher(self.supervisor)

    # --- the parts' methods, under the names the tests use ------------------
    def dispatch(self) -> None:
        self.dispatcher.dispatch(self)

    def start_drain(self) -> None:
        self.dispatcher.start_drain(self)

    def check_workers(self, now_wall: float) -> None:
        self.supervisor.check_workers(self, now_wall)

    def send_upstream(self) -> None:
        self.sender.send_upstream(self)

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
                self.dispatcher.on_cancel(self, wire.loads(body))
            elif op == wire.HB:
                pass
            elif op == wire.DRAIN:
                self.dispatcher.start_drain(self)
            elif op == wire.STOP:
                self.stopping = True

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
        sender, supervisor, dispatcher = self.sender, self.supervisor, self.dispatcher
        for slot in range(self.n_workers):
            supervisor.spawn(self, slot)
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
                    sender.drain_workers(self)
                dispatcher.dispatch(self)
                mono = time.monotonic()
                if mono >= next_check:
                    next_check = mono + CHECK_PERIOD_S
                    supervisor.check_workers(self, time.time())
                    dispatcher.dispatch(self)
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
                sender.send_upstream(self)
                if self.draining and self.held() == 0 and not self.back_out:
                    self.ix.send_multipart([wire.BYE, b""])
                    log.info("drained; exiting")
                    return 0
            sender.send_upstream(self)
            return 0
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """STOP to every worker (see WorkerSupervisor.stop_workers), then close the sockets."""
        self.stopping = True
        self.supervisor.stop_workers(self)
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
