"""The interchange: the agent's hub between the queues and any number of managers.

It binds a ZeroMQ ROUTER on `interchange_address:interchange_port` (127.0.0.1 and a free
port by default). Off loopback it is a CurveZMQ server by default: its key pair lives in
the endpoint directory (curve/server.key, curve/server.key_secret, zmq.auth format) and
managers get the public key on their command line (`--server-key`, see wire.py); a
client without it cannot complete the handshake, so it is never heard. Managers started
by the agent itself (`managers` local ones when no provider starts them) are restarted if
they die; managers on other nodes register on their own.

Task packs arrive from the poller thread; every task gets an integer key and waits in
`pending`, per route (container type, cores, GPUs), until a manager has credit. Routing:
managers that can fit the task (cores, GPUs), free workers first, then prefetch; for a
container type C, managers advertising an idle warm C first (most free workers first),
then the one with the most free capacity. Many tasks go in one message per manager.

Managers heartbeat every `manager_heartbeat_period`; one silent for 2 periods (or a local
one whose process died) is lost: its tasks go back to the front of the line, except the
ones it was running at its last heartbeat, which are charged a retry (FAILED with the
reason past `max_task_retries`). Messages from a manager the interchange does not know
(declared lost, or from before a restart) are answered with STOP.

Results come back in batches and become TaskResult records with the agent-side events
(DISPATCHED when the pack was received, RUNNING and DONE from the worker) and captured
stdout/stderr; they leave as ResultPack bodies through the outbox: at most
`result_batch` per body, at most one send per `result_flush_ms` (a lone result goes at
once). A task message is acknowledged in the same outbox operation as, and after, the
last result of its pack; a cancelled task counts as done for its pack, with no result
(the service already marked it CANCELLED).

Records are plain dicts/lists and bodies orjson: the wire shape is exactly
skyfn.protocol.messages.ResultPack (the tests validate it with the model).

Single-threaded, except `deliver`, `load`, `cancel`, `drain`, `snapshot` and `capacity`,
which other threads (poller, control poller, scaling strategy) may call.
"""
from __future__ import annotations

import collections
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import zmq

from endpoint_agent import blob_results, wire
from endpoint_agent.config import EndpointConfig, is_loopback
from endpoint_agent.outbox import Outbox
from endpoint_agent.poller import Delivery
from endpoint_agent.procutil import child_env, describe_exit
from endpoint_agent.task_record import (  # noqa: F401 - re-exported for tests
    T_FN, T_ID, T_MGR, T_PACK, T_PAYLOAD, T_RECV, T_ROUTE, T_TRIES, T_WALL,
)
from skyfn.protocol import blobs
from skyfn.protocol.messages import PACK_MAX_BYTES
from skyfn.protocol.states import now

log = logging.getLogger("skyfn.agent.interchange")

PLAIN = (wire.NO_CONTAINER, 0, 0)  # route of a task with no container and no resources
MANAGER_CHECK_S = 0.1
UPDATES_PER_BODY = 2000  # ~200 KB of TaskUpdates per result message at most
RUNNING_UPDATE = "RUNNING"
EARLY_CANCEL_TTL_S = 3600.0
LOCAL_BLOCK = "local"


def ensure_server_keys(directory: Path) -> tuple[bytes, bytes]:
    """(public, secret) Z85 CurveZMQ keys of the interchange, created on first use."""
    import zmq.auth

    directory = Path(directory)
    secret_file = directory / "server.key_secret"
    if not secret_file.exists():
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        old = os.umask(0o077)
        try:
            zmq.auth.create_certificates(str(directory), "server")
        finally:
            os.umask(old)
    public, secret = zmq.auth.load_certificate(str(secret_file))
    return public, secret


class ManagerHandle:
    """The interchange's view of one manager."""

    def __init__(self, identity: bytes, proc: subprocess.Popen | None = None, slot: int | None = None):
        self.identity = identity
        self.id = identity.decode(errors="replace")
        self.proc = proc
        self.slot = slot              # index of a local manager the agent restarts
        self.registered = False
        self.credit = 0
        self.known: set[str] = set()   # function ids whose bodies it has
        self.assigned: set[int] = set()  # task keys it holds
        self.block = LOCAL_BLOCK if proc is not None else "?"
        self.hostname = ""
        self.pid = proc.pid if proc is not None else None
        self.workers = 0
        self.cores = 0
        self.accelerators: list[str] = []
        self.warm: dict[str, int] = {}
        self.containers: dict[str, int] = {}
        self.cold_starts = 0
        self.running: list[int] = []
        self.free_hb = 0
        self.worker_pids: list[int] = []
        self.draining = False
        self.last_busy: float | None = None  # monotonic time it last held a task
        self.started = time.monotonic()
        self.last_seen = time.monotonic()
        self.last_heartbeat: float | None = None  # wall clock

    def free_workers(self) -> int:
        return max(0, self.workers - len(self.assigned))

    def fits(self, route: tuple) -> bool:
        return route[1] <= self.cores and route[2] <= len(self.accelerators)

    def info(self) -> dict[str, Any]:
        return {"id": self.id, "block": self.block, "hostname": self.hostname, "pid": self.pid,
                "workers": self.workers, "free_workers": self.free_workers(), "running": len(self.running),
                "assigned": len(self.assigned), "warm": dict(self.warm), "containers": dict(self.containers),
                "cold_starts": self.cold_starts, "cores": self.cores, "accelerators": list(self.accelerators),
                "last_heartbeat": self.last_heartbeat, "draining": self.draining, "local": self.proc is not None,
                "worker_pids": list(self.worker_pids)}


class Interchange:
    def __init__(self, config: EndpointConfig, endpoint_id: str, outbox: Outbox, ctx: zmq.Context | None = None,
                 key_dir: Path | None = None):
        self.config = config
        self.endpoint_id = endpoint_id
        self.outbox = outbox
        self.ctx = ctx or zmq.Context.instance()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.server_key: str | None = None
        if config.encrypted:
            if key_dir is None:
                raise ValueError("encryption needs a directory for the interchange's key pair")
            public, secret = ensure_server_keys(key_dir)
            self.router.curve_server = True
            self.router.curve_secretkey = secret
            self.router.curve_publickey = public
            self.server_key = public.decode()
        elif not is_loopback(config.interchange_address):
            log.warning("the interchange listens on %s WITHOUT encryption (encryption: off)",
                        config.interchange_address)
        bind_host = config.interchange_address
        if config.interchange_port:
            self.router.bind(f"tcp://{bind_host}:{config.interchange_port}")
            self.port = config.interchange_port
        else:
            self.port = self.router.bind_to_random_port(f"tcp://{bind_host}")
        self.bind_address = f"tcp://{bind_host}:{self.port}"
        local_host = "127.0.0.1" if bind_host in ("0.0.0.0", "*") or is_loopback(bind_host) else bind_host
        self.address = f"tcp://{local_host}:{self.port}"   # what local managers connect to
        if sys.platform.startswith("linux"):
            # local managers: an abstract unix socket is a little quicker than loopback TCP
            # (same socket, so the same CurveZMQ settings)
            self.address = f"ipc://@skyfn-ix-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self.router.bind(self.address)
        advertise = config.interchange_advertise or (
            bind_host if bind_host not in ("0.0.0.0", "*") else socket.getfqdn())
        self.public_address = f"tcp://{advertise}:{self.port}"  # what managers on other nodes connect to
        self.wake_addr = f"inproc://skyfn-wake-{uuid.uuid4().hex}"
        self.wake = self.ctx.socket(zmq.PULL)
        self.wake.bind(self.wake_addr)
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.poller.register(self.wake, zmq.POLLIN)

        # from other threads: appended there, popped here (deque is thread-safe for that)
        self.handoff: collections.deque[Delivery] = collections.deque()
        self.control: collections.deque = collections.deque()
        self.given = 0   # tasks delivered by the poller (written by the poller thread only)
        self.taken = 0   # tasks taken from the handoff (written by this thread only)
        self._wakers: dict[int, zmq.Socket] = {}

        self.keys = itertools.count((int(time.time() * 1000) % (1 << 40)) << 20)
        self.pack_seq = itertools.count(1)
        self.tasks: dict[int, list] = {}
        self.packs: dict[int, list] = {}          # seq -> [receipt, remaining, owner]
        self.result_upload: dict | None = None    # presigned S3 form of the latest pack (large results)
        self.pending: dict[tuple, collections.deque] = {PLAIN: collections.deque()}
        self.n_pending = 0
        self.functions: dict[str, str] = {}
        self.early_cancel: dict[str, float] = {}  # task ids cancelled before they arrived

        self.results: list[dict] = []
        self.results_bytes = 0
        self.updates: list[dict] = []
        self.acks: list[str] = []
        self.flush_interval = config.result_flush_ms / 1000.0
        self.first_buffered = 0.0

        self.managers: dict[bytes, ManagerHandle] = {}
        self.drained_blocks: set[str] = set()
        self.local_slots: list[dict[str, Any]] = []
        self.local_gen = 0
        self.told_to_stop: dict[bytes, float] = {}
        self.next_manager_check = 0.0
        self.hb_timeout = 2.0 * config.manager_heartbeat_period
        self.room_event = None  # set by the agent to the poller's event

        self.completed = 0
        self.failed = 0
        self.cancelled = 0
        self.received_packs = 0
        self.received_tasks = 0
        self.retried = 0
        self.managers_lost = 0
        self.roster = 0  # bumped when a manager registers or goes (status.json is rewritten)
        self.closing = False
        # an aAPP policy (placement_policy) places tasks on managers instead of the built-in routing
        self.placement = None
        if config.placement_policy:
            from endpoint_agent.placement import ManagerPlacement, parse_policy

            self.placement = ManagerPlacement(parse_policy(config.placement_policy))
        # allowed_functions: a task of any other function fails here, before anything of it is deserialized
        self.gate = None
        if config.allowed_functions is not None:
            from endpoint_agent.allowlist import FunctionGate

            self.gate = FunctionGate(config.allowed_functions, endpoint_id)
        # data: globus: GlobusFile arguments staged in before tasks run, outputs out after (staging.py)
        self.staging = None
        globus = getattr(getattr(config, "data", None), "globus", None)
        if globus is not None:
            from endpoint_agent.staging import TaskStaging

            self.staging = TaskStaging(self, globus, None if key_dir is None else Path(key_dir).parent)

    # --- other threads ---------------------------------------------------------
    def deliver(self, batch: list[Delivery], n_tasks: int) -> None:
        self.handoff.extend(batch)
        self.given += n_tasks
        self.wake_up()

    def cancel(self, task_ids: list[str]) -> None:
        """Cancel tasks (from the control poller): dropped if queued, killed if running."""
        self.control.append(("cancel", list(task_ids)))
        self.wake_up()

    def drain(self, manager_id: str | None = None, block: str | None = None) -> list[str]:
        """Tell one manager, or every manager of a block, to take nothing more, give back
        what it has not started, finish what runs, and exit. Returns the ids told."""
        ids = [m.id for m in list(self.managers.values())
               if (manager_id is not None and m.id == manager_id) or (block is not None and m.block == block)]
        self.control.append(("drain", (ids, block)))
        self.wake_up()
        return ids

    def snapshot(self) -> dict[str, Any]:
        """A cheap picture for the scaling strategy and status (safe from any thread)."""
        managers = [m.info() for m in list(self.managers.values()) if m.registered]
        blocks: dict[str, dict[str, int]] = {}
        for m in managers:
            b = blocks.setdefault(m["block"], {"managers": 0, "workers": 0, "free_workers": 0, "running": 0,
                                               "assigned": 0})
            b["managers"] += 1
            b["workers"] += m["workers"]
            b["free_workers"] += m["free_workers"]
            b["running"] += m["running"]
            b["assigned"] += m["assigned"]
        return {"pending": self.n_pending + (self.given - self.taken), "held": self.load(),
                "workers": sum(m["workers"] for m in managers),
                "free_workers": sum(m["free_workers"] for m in managers if not m["draining"]),
                "managers": managers, "blocks": blocks, "address": self.public_address,
                "encrypted": self.server_key is not None}

    # colleague C's InterchangeControl (endpoint_agent.scaling) --------------------
    def block_snapshot(self) -> dict[str, Any]:
        """{"pending", "blocks": {block: {"managers", "workers", "free", "tasks", "last_busy"}}}"""
        mono = time.monotonic()
        blocks: dict[str, dict[str, Any]] = {}
        for m in list(self.managers.values()):
            if not m.registered:
                continue
            b = blocks.setdefault(m.block, {"managers": 0, "workers": 0, "free": 0, "tasks": 0, "last_busy": None})
            held = len(m.assigned)
            b["managers"] += 1
            b["workers"] += m.workers
            b["free"] += 0 if m.draining else m.free_workers()
            b["tasks"] += held
            busy = mono if held else m.last_busy
            if busy is not None and (b["last_busy"] is None or busy > b["last_busy"]):
                b["last_busy"] = busy
        return {"pending": self.n_pending + (self.given - self.taken), "blocks": blocks}

    def drain_block(self, block_id: str) -> None:
        self.drained_blocks.add(str(block_id))
        self.drain(block=str(block_id))

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

    def capacity(self) -> int:
        """Tasks the agent should hold: every connected worker plus the prefetch."""
        workers = sum(m.workers for m in list(self.managers.values()) if m.registered and not m.draining)
        return max(self.config.capacity, workers + int(self.config.prefetch or 0))

    # --- manager processes ---------------------------------------------------------
    def manager_command(self, block: str, workers: int, *, identity: str | None = None, parent: int | None = None,
                        address: str | None = None) -> list[str]:
        """The command line that starts a manager for this interchange (see wire.py)."""
        cfg = self.config
        cmd = [sys.executable, "-m", "endpoint_agent.manager", "--interchange", address or self.public_address,
               "--block", str(block), "--workers", str(workers),
               "--prefetch", str(cfg.manager_prefetch_value), "--heartbeat", f"{cfg.manager_heartbeat_period:g}",
               "--max-output", str(cfg.max_output_bytes), "--log-level", cfg.log_level]
        if self.server_key:
            cmd += ["--server-key", self.server_key]
        if identity:
            cmd += ["--identity", identity]
        if parent is not None:
            cmd += ["--parent", str(parent)]
        if cfg.cores:
            cmd += ["--cores", str(cfg.cores)]
        if isinstance(cfg.accelerators, list):
            cmd += ["--accelerators", ",".join(cfg.accelerators)]
        if cfg.containers:
            cmd += ["--containers", wire.dumps(cfg.containers).decode()]
        return cmd

    def start_local_managers(self, n: int | None = None) -> None:
        n = self.config.managers if n is None else n
        for _ in range(n):
            self.local_slots.append({"handle": None, "restart_at": 0.0, "failures": 0, "retired": False})
            self.start_manager(len(self.local_slots) - 1)

    def start_manager(self, slot: int = 0) -> None:
        if not self.local_slots:
            self.local_slots.append({"handle": None, "restart_at": 0.0, "failures": 0, "retired": False})
        self.local_gen += 1
        identity = f"m{os.getpid()}.{self.local_gen}"
        cmd = self.manager_command(LOCAL_BLOCK, self.config.workers, identity=identity, parent=os.getpid(),
                                   address=self.address)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=child_env())
        m = ManagerHandle(identity.encode(), proc, slot)
        self.managers[m.identity] = m
        self.local_slots[slot]["handle"] = m
        log.info("started local manager %s (pid %s) with %d workers", identity, proc.pid, self.config.workers)

    def check_managers(self, mono: float) -> None:
        for m in list(self.managers.values()):
            if m.proc is not None:
                rc = m.proc.poll()
                if rc is not None:
                    self.lose_manager(m, f"process {m.proc.pid} {describe_exit(rc)}", mono)
                    continue
            if m.registered and mono - m.last_seen > self.hb_timeout:
                self.lose_manager(m, f"silent for {mono - m.last_seen:.1f} s (heartbeat period "
                                     f"{self.config.manager_heartbeat_period:g} s)", mono)
            elif not m.registered and m.proc is None and mono - m.started > 60:
                self.managers.pop(m.identity, None)
        for slot, s in enumerate(self.local_slots):
            if s["handle"] is None and not s["retired"] and not self.closing and mono >= s["restart_at"]:
                self.start_manager(slot)
        if self.told_to_stop:
            for ident, ts in list(self.told_to_stop.items()):
                if mono - ts > 30:
                    del self.told_to_stop[ident]

    def lose_manager(self, m: ManagerHandle, why: str, mono: float) -> None:
        """The manager is gone (or must be treated so): its tasks run elsewhere."""
        self.managers.pop(m.identity, None)
        self.roster += 1
        if m.proc is not None and m.proc.poll() is None:
            m.proc.kill()
        if m.registered:
            try:
                self.router.send_multipart([m.identity, wire.STOP, b""], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            self.told_to_stop[m.identity] = mono
        self._requeue_from(m, f"manager {m.id} on {m.hostname or '?'} lost ({why})")
        if not self.closing:
            self.managers_lost += 1
            log.error("manager %s (block %s, %s) lost: %s; %d task(s) go back to the queue", m.id, m.block,
                      m.hostname or "?", why, len(m.assigned))
        if m.slot is not None and m.slot < len(self.local_slots):
            s = self.local_slots[m.slot]
            s["handle"] = None
            if m.draining:
                s["retired"] = True
                return
            quick = not m.registered or mono - m.started < 1.0  # died right after start: back off
            s["failures"] = s["failures"] + 1 if quick else 0
            delay = min(10.0, 0.25 * 2 ** s["failures"]) if s["failures"] > 1 else 0.0
            s["restart_at"] = mono + delay

    def _requeue_from(self, m: ManagerHandle, reason: str) -> None:
        running = set(m.running)
        tasks = self.tasks
        lost = sorted(m.assigned)
        m.assigned = set()
        charged = []
        for key in reversed(lost):
            t = tasks.get(key)
            if t is None:
                continue
            t[T_MGR] = None
            if key in running:
                charged.append(key)
            else:
                self._pend_front(key, t)
        if charged:
            self.on_lost(m, [[key, "died", f"{reason} while running the task"] for key in charged])

    def stop_managers(self, timeout: float = 5.0) -> None:
        for m in list(self.managers.values()):
            try:
                self.router.send_multipart([m.identity, wire.STOP, b""], zmq.NOBLOCK)
            except zmq.ZMQError:
                if m.proc is not None:
                    m.proc.terminate()
        deadline = time.monotonic() + timeout
        for m in list(self.managers.values()):
            if m.proc is None:
                continue
            try:
                m.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                m.proc.terminate()
                try:
                    m.proc.wait(2)
                except subprocess.TimeoutExpired:
                    m.proc.kill()
                    m.proc.wait()
        self.managers.clear()

    # backwards-compatible names (one local manager)
    def check_manager(self, mono: float) -> None:
        self.check_managers(mono)

    def stop_manager(self, timeout: float = 5.0) -> None:
        self.stop_managers(timeout)

    @property
    def manager(self) -> ManagerHandle | None:
        """The first local manager (status of a one-manager agent)."""
        for s in self.local_slots:
            if s["handle"] is not None:
                return s["handle"]
        return None

    # --- the loop -----------------------------------------------------------------
    def step(self, max_wait: float) -> None:
        """One round: wait for messages (at most max_wait s, less when a flush is due),
        take everything available, dispatch, flush."""
        wait = max_wait
        if self.results or self.updates or self.acks:
            wait = min(wait, max(0.0005, self.first_buffered + self.flush_interval - time.monotonic()))
        events = dict(self.poller.poll(wait * 1000))
        if self.wake in events:
            wake = self.wake
            try:  # ZMQ_EVENTS, not recv until Again: a raised Again costs more than the check
                while wake.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    wake.recv(zmq.NOBLOCK)
            except zmq.Again:
                pass
        if self.handoff:
            self.ingest()
        if self.control:
            self.do_control()
        if self.router in events:
            self.drain_router()
        mono = time.monotonic()
        if mono >= self.next_manager_check:
            self.next_manager_check = mono + MANAGER_CHECK_S
            self.check_managers(mono)
        if self.n_pending:
            self.dispatch()
        self.maybe_flush(mono)

    def ingest(self) -> None:
        handoff = self.handoff
        tasks = self.tasks
        plain = self.pending[PLAIN]
        functions = self.functions
        early = self.early_cancel
        keys = self.keys
        placed = self.placement is not None
        gate = self.gate
        while handoff:
            receipt, pack, recv_ts = handoff.popleft()
            n = len(pack.tasks)
            self.taken += n
            self.received_packs += 1
            self.received_tasks += n
            if pack.functions:
                if gate is None:
                    functions.update(pack.functions)
                else:  # the bodies of refused functions are not even kept
                    functions.update({fid: body for fid, body in pack.functions.items()
                                      if gate.refuse(fid, pack.function_meta.get(fid)) is None})
            if pack.result_upload:  # where results too large to travel inline go (blob_results.py)
                self.result_upload = pack.result_upload
            seq = next(self.pack_seq)
            self.packs[seq] = [receipt, n, pack.owner]  # the owner: whose refs the tasks may resolve
            if not n:
                self._pack_done(seq)
                continue
            for spec in pack.tasks:
                if gate is not None:
                    why = gate.refuse(spec.function_id, pack.function_meta.get(spec.function_id))
                    if why is not None:
                        if spec.function_id not in gate.logged:  # once per function, not per task
                            gate.logged.add(spec.function_id)
                            log.warning("task %s refused: %s", spec.task_id, why)
                        self._add_result({"task_id": spec.task_id, "state": "FAILED", "reason": why,
                                          "events": [["DISPATCHED", recv_ts]]}, seq)
                        continue
                if spec.function_id not in functions:
                    self._add_result(
                        {"task_id": spec.task_id, "state": "FAILED", "events": [["DISPATCHED", recv_ts]],
                         "reason": f"the body of function {spec.function_id} was not in the task pack"}, seq)
                    continue
                if early and spec.task_id in early:
                    self.cancelled += 1
                    self._task_gone(seq)
                    continue
                key = next(keys)
                res = spec.resources
                payload = spec.payload if spec.payload_url is None else blobs.make_ref(spec.payload_url)
                if (spec.stage_in or spec.stage_out) and self._stage(key, spec, payload, seq, recv_ts):
                    continue
                if spec.container is None and not res and not placed:
                    tasks[key] = [spec.task_id, spec.function_id, payload, spec.walltime, seq, recv_ts, 0,
                                  PLAIN, None]
                    plain.append(key)
                    self.n_pending += 1
                    continue
                cores = int(res.get("cores") or 0) if res else 0
                gpus = int(res.get("gpus") or 0) if res else 0
                route = (spec.container or wire.NO_CONTAINER, cores if cores > 1 or gpus else 0, gpus)
                if placed:  # the policy decides per function tag
                    route += (spec.tag,)
                t = [spec.task_id, spec.function_id, payload, spec.walltime, seq, recv_ts, 0, route, None]
                tasks[key] = t
                self._pend(key, t)

    def _stage(self, key: int, spec, payload: Any, seq: int, recv_ts: float) -> bool:
        """A task with GlobusFiles: held while its inputs arrive (True), or pended now (False)."""
        if self.staging is None:
            from endpoint_agent.staging import no_staging_reason

            self._add_result({"task_id": spec.task_id, "state": "FAILED", "reason": no_staging_reason(self.endpoint_id),
                              "events": [["DISPATCHED", recv_ts]]}, seq)
            return True
        res = spec.resources
        cores = int(res.get("cores") or 0) if res else 0
        gpus = int(res.get("gpus") or 0) if res else 0
        route = (spec.container or wire.NO_CONTAINER, cores if cores > 1 or gpus else 0, gpus)
        if self.placement is not None:
            route += (spec.tag,)
        t = [spec.task_id, spec.function_id, payload, spec.walltime, seq, recv_ts, 0, route, None]
        self.tasks[key] = t
        if not self.staging.admit(key, t, spec):
            self._pend(key, t)
        return True

    def _pend(self, key: int, t: list) -> None:
        dq = self.pending.get(t[T_ROUTE])
        if dq is None:
            dq = self.pending[t[T_ROUTE]] = collections.deque()
        dq.append(key)
        self.n_pending += 1

    def _pend_front(self, key: int, t: list) -> None:
        dq = self.pending.get(t[T_ROUTE])
        if dq is None:
            dq = self.pending[t[T_ROUTE]] = collections.deque()
        dq.appendleft(key)
        self.n_pending += 1

    def do_control(self) -> None:
        while self.control:
            kind, arg = self.control.popleft()
            if kind == "cancel":
                self.on_cancel(arg)
            elif kind == "staged":
                self.staging.on_staged(*arg)
            elif kind == "drain":
                ids, block = arg
                for m in list(self.managers.values()):
                    if (m.id in ids or (block is not None and m.block == block)) and not m.draining:
                        self._drain_manager(m)

    def _drain_manager(self, m: ManagerHandle) -> None:
        m.draining = True
        m.credit = 0
        log.info("draining manager %s (block %s)", m.id, m.block)
        try:
            self.router.send_multipart([m.identity, wire.DRAIN, b""], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def on_cancel(self, task_ids: list[str]) -> None:
        want = set(task_ids)
        found = {t[T_ID]: key for key, t in self.tasks.items() if t[T_ID] in want}
        per_manager: dict[bytes, list[int]] = {}
        mono = time.monotonic()
        for tid in want:
            key = found.get(tid)
            if key is None:
                self.early_cancel[tid] = mono + EARLY_CANCEL_TTL_S
                continue
            t = self.tasks.pop(key)
            self.cancelled += 1
            if self.staging is not None:
                self.staging.forget(tid)
            if t[T_MGR] is not None:
                m = self.managers.get(t[T_MGR])
                if m is not None:
                    m.assigned.discard(key)
                    per_manager.setdefault(m.identity, []).append(key)
            else:
                self.n_pending -= 1  # its key stays in the deque; dispatch skips it
            self._task_gone(t[T_PACK])
        for ident, keys in per_manager.items():
            try:
                self.router.send_multipart([ident, wire.CANCEL, wire.dumps(keys)], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        if self.early_cancel:
            for tid, until in list(self.early_cancel.items()):
                if until < mono:
                    del self.early_cancel[tid]
        log.info("cancelled %d task(s) (%d running or queued on managers)", len(found),
                 sum(len(k) for k in per_manager.values()))
        self._room()

    def drain_router(self) -> None:
        router = self.router
        managers = self.managers
        mono = time.monotonic()
        EVENTS, POLLIN = zmq.EVENTS, zmq.POLLIN
        for _ in range(10_000):
            try:  # ZMQ_EVENTS first: cheaper than a recv that raises Again (the lone-task path)
                if not router.getsockopt(EVENTS) & POLLIN:
                    return
                identity, op, body = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            m = managers.get(identity)
            if m is None:
                if op == wire.REG and identity not in self.told_to_stop:
                    m = ManagerHandle(identity)
                    managers[identity] = m
                else:
                    if identity not in self.told_to_stop and op != wire.BYE:
                        log.warning("message from unknown manager %s: telling it to stop", identity.decode(errors="replace"))
                    self.told_to_stop.setdefault(identity, mono)
                    try:
                        router.send_multipart([identity, wire.STOP, b""], zmq.NOBLOCK)
                    except zmq.ZMQError:
                        pass
                    continue
            m.last_seen = mono
            if op == wire.RES:
                self.on_results(m, wire.loads(body))
            elif op == wire.REQ:
                if not m.draining:
                    m.credit += wire.loads(body)
            elif op == wire.HB:
                self.on_heartbeat(m, wire.loads(body))
            elif op == wire.RUN:
                self.on_running(wire.loads(body))
            elif op == wire.LOST:
                self.on_lost(m, wire.loads(body))
            elif op == wire.BACK:
                self.on_back(m, wire.loads(body))
            elif op == wire.REG:
                self.on_register(m, wire.loads(body))
            elif op == wire.BYE:
                log.info("manager %s (block %s) drained and left", m.id, m.block)
                m.draining = True
                self.managers.pop(identity, None)
                self.roster += 1
                self._requeue_from(m, f"manager {m.id} left")
                if m.slot is not None and m.slot < len(self.local_slots):
                    self.local_slots[m.slot]["handle"] = None
                    self.local_slots[m.slot]["retired"] = True

    def on_register(self, m: ManagerHandle, info: dict) -> None:
        m.registered = True
        self.roster += 1
        m.hostname = info.get("hostname", "")
        m.pid = info.get("pid")
        m.block = str(info.get("block", m.block))
        m.workers = int(info.get("workers", 0))
        m.cores = int(info.get("cores", m.workers))
        m.accelerators = list(info.get("accelerators") or [])
        m.warm = info.get("warm") or {}
        m.containers = info.get("containers") or {}
        m.cold_starts = int(info.get("cold_starts", 0))
        m.last_heartbeat = time.time()
        if m.slot is not None and m.slot < len(self.local_slots):
            self.local_slots[m.slot]["failures"] = 0
        if m.block in self.drained_blocks:
            self._drain_manager(m)
        log.info("manager %s registered: block %s, host %s, %d workers, %d cores, accelerators %s", m.id, m.block,
                 m.hostname, m.workers, m.cores, m.accelerators or "none")
        self._room()

    def on_heartbeat(self, m: ManagerHandle, hb: dict) -> None:
        m.last_heartbeat = time.time()
        m.running = hb.get("running") or []
        m.free_hb = hb.get("free", 0)
        m.warm = hb.get("warm") or {}
        m.containers = hb.get("containers") or {}
        m.cold_starts = hb.get("cold_starts", m.cold_starts)
        m.worker_pids = hb.get("workers") or []
        try:
            self.router.send_multipart([m.identity, wire.HB, b""], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    # --- routing --------------------------------------------------------------------
    def dispatch(self) -> None:
        live = [m for m in self.managers.values() if m.registered and not m.draining]
        if not live:
            return
        if self.placement is not None:
            self.placement.dispatch(self, live)
            return
        for route, dq in list(self.pending.items()):
            if not dq:
                continue
            cands = [m for m in live if m.credit > 0 and m.fits(route)]
            if not cands:
                if not any(m.fits(route) for m in live):
                    self._fail_unfit(route, dq, live)
                continue
            if len(cands) > 1:
                ctype = route[0]
                if ctype != wire.NO_CONTAINER:
                    cands.sort(key=lambda m: (m.warm.get(ctype, 0) > 0, m.free_workers(), m.credit), reverse=True)
                else:
                    cands.sort(key=lambda m: (m.free_workers(), m.credit), reverse=True)
                # first pass: up to each manager's free workers; second: up to its credit (prefetch)
                for m in cands:
                    if not dq:
                        break
                    free = m.free_workers()
                    if free:
                        self._send_tasks(m, dq, min(free, m.credit), route)
            for m in cands:
                if not dq:
                    break
                if m.credit > 0:
                    self._send_tasks(m, dq, m.credit, route)

    def _fail_unfit(self, route: tuple, dq: collections.deque, live: list[ManagerHandle]) -> None:
        biggest = max(live, key=lambda m: (len(m.accelerators), m.cores))
        reason = (f"the task needs {route[1] or 1} core(s) and {route[2]} GPU(s); the largest node connected "
                  f"({biggest.hostname}, manager {biggest.id}) has {biggest.cores} core(s) and "
                  f"{len(biggest.accelerators)} GPU(s)")
        while dq:
            key = dq.popleft()
            t = self.tasks.pop(key, None)
            if t is None:
                continue
            self.n_pending -= 1
            self._add_result({"task_id": t[T_ID], "state": "FAILED", "reason": reason,
                              "events": [["DISPATCHED", t[T_RECV]]]}, t[T_PACK])
        self._room()

    def _send_tasks(self, m: ManagerHandle, dq: collections.deque, n: int, route: tuple) -> None:
        tasks = self.tasks
        batch = []
        fids = set()
        ctype = None if route[0] == wire.NO_CONTAINER else route[0]
        cores, gpus = route[1], route[2]
        ident = m.identity
        packs = self.packs
        while dq and len(batch) < n:
            key = dq.popleft()
            t = tasks.get(key)
            if t is None:
                continue  # cancelled while pending
            pack = packs.get(t[T_PACK])
            batch.append((key, t[T_FN], t[T_PAYLOAD], t[T_WALL], ctype, cores, gpus, pack[2] if pack else None))
            fids.add(t[T_FN])
            t[T_MGR] = ident
        if not batch:
            return
        self.n_pending -= len(batch)
        new = fids - m.known
        fns = {fid: self.functions[fid] for fid in new}
        try:
            self.router.send_multipart([ident, wire.TASKS, wire.dumps({"f": fns, "t": batch})])
        except zmq.ZMQError as exc:  # not connected (yet, or any more)
            log.debug("dispatch to manager %s failed (%s); will retry", m.id, exc)
            for b in reversed(batch):
                tasks[b[0]][T_MGR] = None
                dq.appendleft(b[0])
            self.n_pending += len(batch)
            m.credit = 0
            return
        m.credit -= len(batch)  # the manager counts what it receives
        m.known |= new
        m.assigned.update(b[0] for b in batch)
        if ctype is not None and m.warm.get(ctype):
            m.warm[ctype] = max(0, m.warm[ctype] - len(batch))

    # --- results --------------------------------------------------------------------
    def on_results(self, m: ManagerHandle, results: list) -> None:
        tasks = self.tasks
        assigned = m.assigned
        for key, state, result, error, start, done, out, err in results:
            t = tasks.pop(key, None)
            if t is None:
                continue
            assigned.discard(key)
            rec = {"task_id": t[T_ID], "state": state,
                   "events": [["DISPATCHED", t[T_RECV]], ["RUNNING", start], ["DONE", done]]}
            if result is not None:
                stored, result = blob_results.offload(self.result_upload, t[T_ID], result)
                if stored:
                    rec["result"] = result
                else:
                    rec.update(state="FAILED", reason=result)
            if error is not None:
                rec["error"] = error
            if out is not None:
                rec["stdout"] = out
            if err is not None:
                rec["stderr"] = err
            if self.staging is not None and self.staging.result(key, t, rec):
                continue  # held while its GlobusFile outputs are sent (staging.py)
            self._add_result(rec, t[T_PACK])
        if not assigned:
            m.last_busy = time.monotonic()
        self._room()

    def on_running(self, items: list) -> None:
        lease = self.config.lease_seconds
        for key, ts in items:
            t = self.tasks.get(key)
            if t is not None:
                if not (self.results or self.updates):
                    self.first_buffered = time.monotonic()
                self.updates.append({"task_id": t[T_ID], "state": RUNNING_UPDATE, "ts": ts, "lease_seconds": lease})

    def on_back(self, m: ManagerHandle, keys: list) -> None:
        for key in reversed(keys):
            m.assigned.discard(key)
            t = self.tasks.get(key)
            if t is not None and t[T_MGR] == m.identity:
                t[T_MGR] = None
                self._pend_front(key, t)

    def on_lost(self, m: ManagerHandle, items: list) -> None:
        for key, kind, reason in items:
            t = self.tasks.get(key)
            if t is None:
                continue
            m.assigned.discard(key)
            t[T_MGR] = None
            if kind == "timeout":
                del self.tasks[key]
                self._add_result({"task_id": t[T_ID], "state": "TIMED_OUT", "reason": reason,
                                  "events": [["DISPATCHED", t[T_RECV]]]}, t[T_PACK])
                continue
            if kind == "fail":
                del self.tasks[key]
                log.warning("task %s failed: %s", t[T_ID], reason)
                self._add_result({"task_id": t[T_ID], "state": "FAILED", "reason": reason,
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
                self._pend_front(key, t)
        self._room()

    def _add_result(self, rec: dict, pack: int) -> None:
        if self.staging is not None and self.staging.held:
            self.staging.settle(rec)
        if not self.results:
            self.first_buffered = time.monotonic()
        if rec["state"] == "SUCCEEDED":
            self.completed += 1
        else:
            self.failed += 1
        self.results.append(rec)
        self.results_bytes += 160 + len(rec.get("result") or "") + len(rec.get("error") or "") + \
            len(rec.get("stdout") or "") + len(rec.get("stderr") or "")
        self._task_gone(pack)
        if len(self.results) >= self.config.result_batch or self.results_bytes >= PACK_MAX_BYTES:
            self.flush()

    def _task_gone(self, pack: int) -> None:
        p = self.packs.get(pack)
        if p is not None:
            p[1] -= 1
            if p[1] <= 0:
                self._pack_done(pack)

    def _pack_done(self, seq: int) -> None:
        receipt = self.packs.pop(seq)[0]
        if not (self.results or self.updates or self.acks):
            self.first_buffered = time.monotonic()
        self.acks.append(receipt)

    def _room(self) -> None:
        ev = self.room_event
        if ev is not None and not ev.is_set() and self.load() < self.capacity():
            ev.set()

    def maybe_flush(self, mono: float) -> None:
        """Flush when the outbox is idle (a lone result leaves at once), else let results
        accumulate while it sends, for at most result_flush_ms (batches grow with load)."""
        if not (self.results or self.updates or self.acks):
            return
        if self.outbox.idle() or mono - self.first_buffered >= self.flush_interval:
            self.flush()

    @staticmethod
    def _rec_size(rec: dict) -> int:
        return 160 + len(rec.get("result") or "") + len(rec.get("error") or "") + \
            len(rec.get("stdout") or "") + len(rec.get("stderr") or "")

    def flush(self) -> None:
        """Hand buffered results, updates and acks to the outbox as one operation."""
        if not (self.results or self.updates or self.acks):
            return
        eid = self.endpoint_id
        results, updates = self.results, self.updates
        batch = self.config.result_batch
        bodies = []
        if len(results) <= batch and self.results_bytes < PACK_MAX_BYTES and len(updates) <= UPDATES_PER_BODY:
            if results or updates:
                bodies.append(wire.dumps({"endpoint_id": eid, "results": results, "updates": updates}))
        else:
            chunk: list = []
            size = 0
            for rec in results:
                rb = self._rec_size(rec)
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
        if self.staging is not None:
            self.staging.close()
        self.stop_managers()
        for sock in list(self._wakers.values()):
            sock.close(0)
        self.router.close(0)
        self.wake.close(0)
