"""The interchange: the agent's hub between the queues and any number of managers.

It binds a ZeroMQ ROUTER on `interchange_address:interchange_port` (127.0.0.1 and a free
port by default). Off loopback it is a CurveZMQ server by default: its key pair lives in
the endpoint directory (curve/server.key, curve/server.key_secret, zmq.auth format) and
managers get the public key on their command line (`--server-key`, see endpoint_agent/wire.py); a
client without it cannot complete the handshake, so it is never heard.

This module is the hub: the sockets, the loop (`step`) and the calls other threads make.
The work is done by parts with one job each, sharing the interchange's state (an
IxState, state.py; the Interchange is one):
  - intake.py       task packs in (keys, routes, refusals) and cancels;
  - managers.py     the manager registry and supervision: registration, heartbeats,
                    lost managers and the requeue of their tasks, drains, the local
                    manager processes and their restarts, snapshots;
  - dispatch.py     choosing managers for pending tasks and sending them (or
                    placement.py, with an aAPP `placement_policy`);
  - results.py      results and updates batched into ResultPack bodies to the outbox,
                    with the acks of the packs done;
  - parked.py       dependents sent ahead of their inputs, released when the inputs'
                    results are here (or handed back to the service);
  - endpoint_agent.direct  with `direct:` configured, the socket SDKs of direct
                    sessions send task packs to (in the same poller) and get their results from.
Records are plain dicts/lists and bodies orjson: the wire shape is exactly
skyfn.protocol.messages.ResultPack (the tests validate it with the model).

Single-threaded, except `deliver`, `load`, `cancel`, `drain`, `snapshot` and `capacity`,
which other threads (poller, control poller, scaling strategy) may call.
"""
from __future__ import annotations

import collections
import logging
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import zmq

from endpoint_agent import wire
from endpoint_agent.config import EndpointConfig, is_loopback
from endpoint_agent.interchange.dispatch import Dispatcher
from endpoint_agent.interchange.intake import EARLY_CANCEL_TTL_S, Intake  # noqa: F401 - re-exported
from endpoint_agent.interchange.managers import ManagerRegistry
from endpoint_agent.interchange.parked import ParkedTasks
from endpoint_agent.interchange.results import (  # noqa: F401 - re-exported
    RUNNING_UPDATE, UPDATES_PER_BODY, ResultBatcher,
)
from endpoint_agent.interchange.state import LOCAL_BLOCK, PLAIN, IxState, ManagerHandle  # noqa: F401 - re-exported
from endpoint_agent.service.outbox import Outbox
from endpoint_agent.service.poller import Delivery
from endpoint_agent.task_record import (  # noqa: F401 - re-exported for tests
    T_FN, T_ID, T_MGR, T_PACK, T_PAYLOAD, T_RECV, T_ROUTE, T_TRIES, T_WALL,
)

log = logging.getLogger("skyfn.agent.interchange")

MANAGER_CHECK_S = 0.1


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


class Interchange(IxState):
    def __init__(self, config: EndpointConfig, endpoint_id: str, outbox: Outbox, ctx: zmq.Context | None = None,
                 key_dir: Path | None = None):
        self.ctx = ctx or zmq.Context.instance()
        router = self.ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        server_key: str | None = None
        if config.encrypted:
            if key_dir is None:
                raise ValueError("encryption needs a directory for the interchange's key pair")
            public, secret = ensure_server_keys(key_dir)
            router.curve_server = True
            router.curve_secretkey = secret
            router.curve_publickey = public
            server_key = public.decode()
        elif not is_loopback(config.interchange_address):
            log.warning("the interchange listens on %s WITHOUT encryption (encryption: off)",
                        config.interchange_address)
        bind_host = config.interchange_address
        if config.interchange_port:
            router.bind(f"tcp://{bind_host}:{config.interchange_port}")
            self.port = config.interchange_port
        else:
            self.port = router.bind_to_random_port(f"tcp://{bind_host}")
        self.bind_address = f"tcp://{bind_host}:{self.port}"
        local_host = "127.0.0.1" if bind_host in ("0.0.0.0", "*") or is_loopback(bind_host) else bind_host
        address = f"tcp://{local_host}:{self.port}"   # what local managers connect to
        if sys.platform.startswith("linux"):
            # local managers: an abstract unix socket is a little quicker than loopback TCP
            # (same socket, so the same CurveZMQ settings)
            address = f"ipc://@skyfn-ix-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            router.bind(address)
        advertise = config.interchange_advertise or (
            bind_host if bind_host not in ("0.0.0.0", "*") else socket.getfqdn())
        IxState.__init__(self, config, endpoint_id, outbox, router, address=address,
                         public_address=f"tcp://{advertise}:{self.port}", server_key=server_key)
        self.wake_addr = f"inproc://skyfn-wake-{uuid.uuid4().hex}"
        self.wake = self.ctx.socket(zmq.PULL)
        self.wake.bind(self.wake_addr)
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.poller.register(self.wake, zmq.POLLIN)
        self._wakers: dict[int, zmq.Socket] = {}
        self.next_manager_check = 0.0

        # the parts: they keep no reference to this state, their methods take it
        self.out = ResultBatcher(config)
        self.intake = Intake(config, endpoint_id, self.out)
        self.registry = ManagerRegistry(config, self.out)
        self.dispatcher = Dispatcher(self.out)
        self.parked = ParkedTasks(config.local_results_mb, self.out)
        self.direct = None
        if config.direct is not None:
            if key_dir is None:
                raise ValueError("direct sessions need a directory for the interchange's key pair")
            from endpoint_agent.direct.server import DirectServer

            try:
                self.direct = DirectServer(config.direct, endpoint_id, self.ctx, ensure_server_keys(key_dir))
            except Exception:
                self.router.close(0)
                self.wake.close(0)
                raise
            self.poller.register(self.direct.sock, zmq.POLLIN)

        # an aAPP policy (placement_policy) places tasks on managers instead of the built-in routing
        if config.placement_policy:
            from endpoint_agent.interchange.placement import ManagerPlacement, parse_policy

            self.placement = ManagerPlacement(parse_policy(config.placement_policy))
        # data: globus: GlobusFile arguments staged in before tasks run, outputs out after (data/staging.py)
        globus = getattr(getattr(config, "data", None), "globus", None)
        if globus is not None:
            from endpoint_agent.data.staging import TaskStaging

            self.staging = TaskStaging(self, globus, None if key_dir is None else Path(key_dir).parent)

    # the parts' own state, read where it used to live
    @property
    def gate(self):
        return self.intake.gate

    @property
    def results(self) -> list[dict]:
        return self.out.results

    @property
    def updates(self) -> list[dict]:
        return self.out.updates

    @property
    def acks(self) -> list[str]:
        return self.out.acks

    @property
    def manager(self) -> ManagerHandle | None:
        """The first local manager (status of a one-manager agent)."""
        return self.registry.first_local()

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

    # colleague C's InterchangeControl (endpoint_agent.scaling): block_snapshot (the registry's), drain_block
    def drain_block(self, block_id: str) -> None:
        self.registry.drained_blocks.add(str(block_id))
        self.drain(block=str(block_id))

    def on_outbox_idle(self) -> None:
        """The outbox ran dry: wake the loop when results are held for the next send (group
        commit). An empty buffer needs no wake-up: what the loop buffers after this check it
        flushes itself, as it finds the outbox idle."""
        out = self.out
        if out.results or out.updates or out.acks:
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

    # --- the parts' methods, under the names other modules and the tests use ---------
    def snapshot(self) -> dict[str, Any]:
        """A cheap picture for the scaling strategy and status (safe from any thread)."""
        return self.registry.snapshot(self)

    def block_snapshot(self) -> dict[str, Any]:
        """{"pending", "blocks": {block: {"managers", "workers", "free", "tasks", "last_busy"}}}"""
        return self.registry.block_snapshot(self)

    def manager_command(self, block: str, workers: int, *, identity: str | None = None, parent: int | None = None,
                        address: str | None = None) -> list[str]:
        """The command line that starts a manager for this interchange (see endpoint_agent/wire.py)."""
        return self.registry.manager_command(self, block, workers, identity=identity, parent=parent,
                                             address=address)

    def start_local_managers(self, n: int | None = None) -> None:
        self.registry.start_local_managers(self, n)

    def start_manager(self, slot: int = 0) -> None:
        self.registry.start_manager(self, slot)

    def check_managers(self, mono: float) -> None:
        self.registry.check_managers(self, mono)

    def lose_manager(self, m: ManagerHandle, why: str, mono: float) -> None:
        """The manager is gone (or must be treated so): its tasks run elsewhere."""
        self.registry.lose_manager(self, m, why, mono)

    def stop_managers(self, timeout: float = 5.0) -> None:
        self.registry.stop_managers(self, timeout)

    # backwards-compatible names (one local manager)
    check_manager = check_managers
    stop_manager = stop_managers

    def dispatch(self) -> None:
        self.dispatcher.dispatch(self)

    def ingest(self) -> None:
        self.intake.ingest(self)

    def on_cancel(self, task_ids: list[str]) -> None:
        self.intake.on_cancel(self, task_ids)

    def maybe_flush(self) -> None:
        self.out.maybe_flush(self)

    def flush(self) -> None:
        """Hand buffered results, updates and acks to the outbox as one operation."""
        self.out.flush(self)

    def extend_leases(self) -> None:
        """Extend the leases of every pack held, and tell the service (LEASE updates)."""
        self.out.extend_leases(self)

    # what placement.py and endpoint_agent/data/staging.py call on the interchange
    def _add_result(self, rec: dict, pack: int) -> None:
        self.out.add(self, rec, pack)

    def _send_tasks(self, m: ManagerHandle, dq: collections.deque, n: int, route: tuple) -> None:
        self.dispatcher.send_tasks(self, m, dq, n, route)

    def _fail_unfit(self, route: tuple, dq: collections.deque, live: list[ManagerHandle]) -> None:
        self.dispatcher.fail_unfit(self, route, dq, live)

    # --- the loop -----------------------------------------------------------------
    def step(self, max_wait: float) -> None:
        """One round: wait for messages (at most max_wait s; the outbox running dry wakes
        it, so results held for company leave then), take everything available, dispatch,
        flush."""
        out = self.out
        events = dict(self.poller.poll(max_wait * 1000))
        if self.wake in events:
            wake = self.wake
            try:  # ZMQ_EVENTS, not recv until Again: a raised Again costs more than the check
                while wake.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    wake.recv(zmq.NOBLOCK)
            except zmq.Again:
                pass
        direct = self.direct
        if direct is not None and direct.sock in events:
            entries = direct.drain(self)
            if entries:
                self.intake.ingest(self, entries)
        if self.handoff:
            self.intake.ingest(self)
        if self.control:
            self.do_control()
        if self.router in events:
            self.drain_router()
        mono = time.monotonic()
        if mono >= self.next_manager_check:
            self.next_manager_check = mono + MANAGER_CHECK_S
            self.registry.check_managers(self, mono)
        if (self.parked.held or self.parked.expected) and mono >= self.parked.next_check:
            self.parked.check(self, mono)
        if self.n_pending:
            self.dispatcher.dispatch(self)
        if self.direct_replies:  # first: an SDK is waiting on these; the service's copy is not awaited
            direct.flush(self)
        out.maybe_flush(self)

    def do_control(self) -> None:
        while self.control:
            kind, arg = self.control.popleft()
            if kind == "cancel":
                self.intake.on_cancel(self, arg)
            elif kind == "staged":
                self.staging.on_staged(*arg)
            elif kind == "drain":
                self.registry.drain(self, *arg)

    def drain_router(self) -> None:
        router = self.router
        managers = self.managers
        registry = self.registry
        out = self.out
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
                m = registry.unknown(self, identity, op, mono)
                if m is None:
                    continue
            m.last_seen = mono
            if op == wire.RES:
                out.on_results(self, m, wire.loads(body))
            elif op == wire.REQ:
                if not m.draining:
                    m.credit += wire.loads(body)
            elif op == wire.HB:
                registry.on_heartbeat(self, m, wire.loads(body))
            elif op == wire.RUN:
                out.on_running(self, wire.loads(body))
            elif op == wire.LOST:
                registry.on_lost(self, m, wire.loads(body))
            elif op == wire.BACK:
                registry.on_back(self, m, wire.loads(body))
            elif op == wire.REG:
                registry.on_register(self, m, wire.loads(body))
            elif op == wire.BYE:
                registry.on_bye(self, m)

    # --- shutdown -------------------------------------------------------------------
    def close(self) -> None:
        self.closing = True
        if self.staging is not None:
            self.staging.close()
        self.registry.stop_managers(self)
        if self.direct is not None:
            self.direct.close(self)
        for sock in list(self._wakers.values()):
            sock.close(0)
        self.router.close(0)
        self.wake.close(0)
