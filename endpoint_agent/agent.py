"""The agent: wires the service link, the poller, the interchange and the outbox, and runs.

`Agent(name, config).run()` registers with the service (POST /endpoints) to learn its
endpoint id and queues, or uses the ones given (arguments, or config.yaml's
task_queue/results_queue) without contacting the service at all. It then runs the
interchange loop in the calling thread until `stop()` is called or, when running in
the main thread, SIGTERM/SIGINT arrives. Stopping is graceful: receiving stops, in-flight
tasks get up to `grace_period` seconds, results are flushed and their task messages
acknowledged, the manager and workers are stopped. Anything unfinished is redelivered
by the queue when its lease expires.
"""
from __future__ import annotations

import logging
import os
import platform
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable

from endpoint_agent import __version__
from endpoint_agent.config import EndpointConfig, resolve_service
from endpoint_agent.interchange import Interchange
from endpoint_agent.paths import EndpointPaths
from endpoint_agent.service import credential
from endpoint_agent.service.link import Heartbeater, ServiceLink
from endpoint_agent.service.outbox import Outbox
from endpoint_agent.service.poller import ControlPoller, Poller
from endpoint_agent.status import write_status
from skyfn import gc_tuning
from skyfn.protocol.api import QueueDescriptor
from skyfn.protocol.dataflow import PARK_FEATURE

log = logging.getLogger("skyfn.agent")

STATUS_PERIOD_S = 2.0
LOOP_WAIT_S = 0.1


class Agent:
    def __init__(self, name: str, config: EndpointConfig, *, endpoint_id: str | None = None,
                 task_queue: QueueDescriptor | None = None, results_queue: QueueDescriptor | None = None,
                 paths: EndpointPaths | None = None, write_status_file: bool = True,
                 queue_wrapper: Callable[[str, Any], Any] | None = None):
        self.name = name
        # (kind, queue) -> queue: what a user agent of a multi-user endpoint puts around its
        # "tasks", "results" and "control" queues (endpoint_agent/multiuser/lane.py)
        self.queue_wrapper = queue_wrapper
        self.config = config
        self.paths = paths or EndpointPaths(name)
        self.endpoint_id = endpoint_id or config.endpoint_id
        self.task_queue_desc = task_queue or config.task_queue
        self.results_queue_desc = results_queue or config.results_queue
        self.control_queue_desc = config.control_queue
        if (self.task_queue_desc is None) != (self.results_queue_desc is None):
            raise ValueError("give both task_queue and results_queue, or neither (to register with the service)")
        self.write_status_file = write_status_file
        self.consumer = f"{name}@{socket.gethostname()}"
        self._stop = threading.Event()
        self.started = time.time()
        self.state = "starting"
        self.interchange: Interchange | None = None
        self.poller: Poller | None = None
        self.control_poller: ControlPoller | None = None
        self.blocks = None  # endpoint_agent.scaling.BlockManager when blocks come from a provider
        self.outbox: Outbox | None = None
        self.link: ServiceLink | None = None
        self.heartbeater: Heartbeater | None = None
        self.data = None  # endpoint_agent.data.plane.EndpointData when the config has a data section
        self._queues: list = []  # every queue opened, to hand a rotated credential to (Redis)

    # --- control ----------------------------------------------------------------
    def stop(self) -> None:
        """Ask the agent to stop gracefully (thread-safe, signal-safe)."""
        self._stop.set()

    def _on_signal(self, signum, frame) -> None:
        if self._stop.is_set():
            log.warning("second %s: stopping now without waiting for tasks", signal.Signals(signum).name)
            self._grace_deadline = 0.0
        else:
            log.info("%s received: stopping gracefully (grace period %g s)", signal.Signals(signum).name,
                     self.config.grace_period)
        self.stop()

    # --- running ------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        return {"hostname": socket.gethostname(), "pid": os.getpid(), "workers": self.config.workers,
                "provider": self.config.provider, "python": platform.python_version(),
                "platform": sys.platform, "agent_version": __version__}

    def stats(self) -> dict[str, Any]:
        ix = self.interchange
        return {
            "state": self.state,
            "workers": (ix.snapshot()["workers"] if ix else 0) or self.config.workers * self.config.managers,
            **self._placement_stats(),
            "in_flight": ix.load() if ix else 0,
            "completed": ix.completed if ix else 0,
            "failed": ix.failed if ix else 0,
            "retried": ix.retried if ix else 0,
            "received_tasks": ix.received_tasks if ix else 0,
            # direct sessions: address and counters only (the session key is a secret)
            "direct": ix.direct.stats() if ix is not None and ix.direct is not None else None,
            "uptime": round(time.time() - self.started, 1),
        }

    def _placement_stats(self) -> dict[str, Any]:
        """Managers and warm containers per type, for the heartbeat (the status page shows them)."""
        managers = self.interchange.snapshot().get("managers", []) if self.interchange else []
        warm: dict[str, int] = {}
        for mi in managers:
            for ctype, n in mi["containers"].items():
                warm[ctype] = warm.get(ctype, 0) + n
        return {"manager_count": len(managers), "warm_containers": warm}

    def status(self) -> dict[str, Any]:
        ix = self.interchange
        m = ix.manager if ix else None
        snap = ix.snapshot() if ix else {}
        managers = snap.get("managers", [])
        warm: dict[str, int] = {}
        for mi in managers:
            for ctype, n in mi["containers"].items():
                warm[ctype] = warm.get(ctype, 0) + n
        return {
            "name": self.name, "pid": os.getpid(), "endpoint_id": self.endpoint_id, "state": self.state,
            "started": self.started, "updated": time.time(), "consumer": self.consumer,
            "manager_pid": m.proc.pid if m and m.proc else None,
            "worker_pids": [p for mi in managers for p in mi["worker_pids"]],
            "interchange": ix.public_address if ix else None,
            "encrypted": bool(ix and ix.server_key),
            "server_key": ix.server_key if ix else None,
            "managers": managers, "blocks": snap.get("blocks", {}),
            "pending": snap.get("pending", 0), "containers": warm,
            "cold_starts": sum(mi["cold_starts"] for mi in managers),
            "scaling": self.blocks.status() if self.blocks is not None else None,
            "cancelled": ix.cancelled if ix else 0, "managers_lost": ix.managers_lost if ix else 0,
            # dependents sent ahead of their inputs: held, released here, handed back (interchange/parked.py)
            "dataflow": snap.get("dataflow") or {},
            # Globus staging (data: globus:): items waiting, Transfer tasks in flight and submitted
            "globus": ix.staging.stager.snapshot() if ix is not None and ix.staging is not None else None,
            # kind and name only: a queue URL may carry credentials
            "task_queue": ({"kind": self.task_queue_desc.kind, "name": self.task_queue_desc.name}
                           if self.task_queue_desc else None),
            **self.stats(),
        }

    def _write_status(self) -> None:
        if not self.write_status_file:
            return
        try:
            self.paths.ensure()
            write_status(self.paths.status, self.status())
        except OSError as exc:
            log.warning("cannot write %s: %s", self.paths.status, exc)

    def _connect(self) -> None:
        if self.task_queue_desc is not None:
            self.endpoint_id = self.endpoint_id or self.name
            return
        reg = self._connect_with_credential()
        if reg is None:
            url, token = resolve_service(self.config)
            self.link = ServiceLink(url, token)
            log.info("registering endpoint %r with %s", self.name, url)
            reg = self.link.register(self.name, self.metadata(), stop=self._stop, allowed=self.allowed_report())
            if reg.agent_credential:  # from now on the agent speaks as its endpoint (credential.py)
                credential.save(self.paths.credential, reg.agent_credential)
                self.link.use_token(reg.agent_credential)
                self.link.token_source = self._fresh_credential
        self.endpoint_id = reg.endpoint_id
        if self.link is not None and reg.agent_credential is None:
            self._report_allowlist()
        if reg.aws_credentials:  # SQS: the endpoint's own session, refreshed through connect
            endpoint_id, link = reg.endpoint_id, self.link
            credential.use_aws_session(reg.aws_credentials,
                                       lambda: link.connect(endpoint_id, stop=self._stop).aws_credentials)
        self.task_queue_desc = reg.task_queue
        self.results_queue_desc = reg.results_queue
        self.control_queue_desc = getattr(reg, "control_queue", None)
        log.info("registered as endpoint %s (task queue %s %s)", reg.endpoint_id, reg.task_queue.kind,
                 reg.task_queue.name)

    def allowed_report(self) -> list[dict[str, str]] | None:
        """The allowlist the service is told about (None: any function may run here)."""
        entries = self.config.allowed_functions
        return None if entries is None else [e.model_dump(exclude_none=True) for e in entries]

    def _report_allowlist(self) -> None:
        """Connected with a kept credential (no registration): tell the service the allowlist
        now, before any task is received, rather than at the first heartbeat."""
        from endpoint_agent.service.link import ServiceError

        assert self.link is not None and self.endpoint_id is not None
        try:
            self.link.heartbeat(self.endpoint_id, self.stats(), self.allowed_report())
        except (ServiceError, OSError, ValueError) as exc:  # the heartbeats report it again
            log.warning("could not report the allowlist yet (%s); the heartbeats will", exc)

    def _connect_with_credential(self):
        """Connect as the endpoint with a credential kept from an earlier registration (or
        SKYFN_ENDPOINT_CREDENTIAL); None when there is none or the service refuses it (it
        was rotated or revoked: the owner's token registers again)."""
        from endpoint_agent.config import ConfigError, resolve_url
        from endpoint_agent.service.link import ServiceError

        cred = credential.load(self.paths.credential)
        if cred is None:
            return None
        try:
            url = resolve_url(self.config)
        except ConfigError:
            return None
        self.link = ServiceLink(url, cred)
        try:
            reg = self.link.connect(credential.endpoint_of(cred), stop=self._stop)
        except ServiceError as exc:
            log.warning("the endpoint credential was refused (%s); registering with the owner's token", exc)
            credential.forget(self.paths.credential)
            self.link.close()
            self.link = None
            return None
        self.link.token_source = self._fresh_credential
        log.info("connected as endpoint %s with its credential", reg.endpoint_id)
        return reg.model_copy(update={q: credential.complete(getattr(reg, q), cred)
                                      for q in ("task_queue", "results_queue", "control_queue")})

    def _fresh_credential(self):
        """The credential kept for the endpoint now (its owner may have put a rotated one
        there): the service link uses it, and the Redis queues log in with it from now on."""
        cred = credential.load(self.paths.credential)
        if cred is not None:
            secret = cred.rsplit(".", 1)[1]
            for queue in self._queues:
                if hasattr(queue, "set_password"):
                    queue.set_password(secret)
        return cred

    def _open(self, desc: QueueDescriptor):
        from skyfn.protocol.queues import open_queue

        queue = open_queue(desc, consumer=self.consumer, visibility_timeout=self.config.lease_seconds)
        self._queues.append(queue)
        return queue

    def _wrap(self, kind: str, queue):
        return self.queue_wrapper(kind, queue) if self.queue_wrapper is not None else queue

    def _open_queues(self):
        """(poll, results, ack) queue handles, each with its own connection; retried with
        backoff while the queue service is unreachable."""
        assert self.task_queue_desc is not None and self.results_queue_desc is not None
        delay = 0.5
        while True:
            opened = len(self._queues)
            try:
                poll_queue = self._wrap("tasks", self._open(self.task_queue_desc))
                results_queue = self._wrap("results", self._open(self.results_queue_desc))
                for queue, desc in ((poll_queue, self.task_queue_desc), (results_queue, self.results_queue_desc)):
                    # a Redis stream needs its consumer group; SQS queues are the service's to create
                    # (at registration, and the results queue by the stack): the agent role may not
                    if getattr(desc, "kind", None) != "sqs":
                        queue.ensure()
                return poll_queue, results_queue, self._open(self.task_queue_desc)
            except (ImportError, ValueError):
                raise
            except Exception as exc:  # noqa: BLE001 - e.g. redis not up yet
                log.warning("cannot reach the queues (%s); retrying in %.1f s", exc, delay)
            for queue in self._queues[opened:]:
                queue.close()
            del self._queues[opened:]
            if self._wait_or_new_credential(delay):
                delay = 0.5
                continue
            delay = min(30.0, delay * 2)

    def _wait_or_new_credential(self, delay: float) -> bool:
        """Wait `delay` before the next try, cut short (True) when the owner puts another
        credential in the endpoint's file: a credential rotated while the agent started
        is taken up at once, with no restart. Raises InterruptedError on stop."""
        in_use = credential.load(self.paths.credential)
        deadline = time.monotonic() + delay
        while True:
            if self._stop.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
                raise InterruptedError("stopped while connecting to the queues")
            cred = credential.load(self.paths.credential)
            if in_use is not None and cred is not None and cred != in_use:
                log.info("the endpoint credential changed: logging in to the queues with it")
                for attr in ("task_queue_desc", "results_queue_desc", "control_queue_desc"):
                    desc = getattr(self, attr)
                    if desc is not None:
                        setattr(self, attr, credential.complete(desc, cred, replace=True))
                return True
            if time.monotonic() >= deadline:
                return False

    def run(self) -> int:
        """Run until stopped; returns the exit code (0 after a graceful stop)."""
        cfg = self.config
        self._grace_deadline: float | None = None
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        self._write_status()
        try:
            self._connect()
        except InterruptedError:
            return 0
        try:
            poll_queue, results_queue, ack_queue = self._open_queues()
        except InterruptedError:
            return 0
        if cfg.data is not None:  # before the managers start: they inherit SKYFN_DATA_STORES
            from endpoint_agent.data.plane import EndpointData

            self.data = EndpointData(cfg.data, self.paths.dir, self.endpoint_id).start()
        self.outbox = Outbox(ack_queue, results_queue, cfg.lease_seconds)
        self.outbox.start()
        ix = self.interchange = Interchange(cfg, self.endpoint_id, self.outbox, key_dir=self.paths.dir / "curve")
        self.outbox.on_idle = ix.wake_up
        if self.link is not None:  # at once: the first heartbeat publishes the direct socket (sessions can open)
            self.heartbeater = Heartbeater(self.link, self.endpoint_id, cfg.heartbeat_period, self.stats,
                                           allowed=self.allowed_report(),
                                           direct=ix.direct.info() if ix.direct is not None else None,
                                           features=[PARK_FEATURE] if cfg.local_results_mb > 0 else None)
            self.heartbeater.start()
        self._start_managers(ix)
        self.poller = Poller(poll_queue, capacity=ix.capacity, receive_batch=cfg.receive_batch,
                             receive_wait=cfg.receive_wait, lease_seconds=cfg.lease_seconds,
                             load=ix.load, deliver=ix.deliver)
        ix.room_event = self.poller.room
        self.poller.start()
        if self.control_queue_desc is not None:
            try:
                self.control_poller = ControlPoller(self._wrap("control", self._open(self.control_queue_desc)),
                                                    receive_wait=cfg.receive_wait, cancel=ix.cancel)
                self.control_poller.start()
            except Exception as exc:  # noqa: BLE001 - cancels then only stop queued tasks at the service
                log.error("cannot open the control queue (%s): cancels will not reach running tasks", exc)
        self.state = "running"
        gc_tuning.settle()
        log.info("endpoint %s running: %d workers, capacity %d tasks, consumer %s", self.endpoint_id,
                 cfg.workers, cfg.capacity, self.consumer)
        lease_every = cfg.lease_seconds / 3.0
        next_lease = time.monotonic() + lease_every
        next_status = time.monotonic()
        roster = ix.roster
        try:
            while not self._stop.is_set():
                ix.step(LOOP_WAIT_S)
                mono = time.monotonic()
                if mono >= next_lease:
                    next_lease = mono + lease_every
                    ix.extend_leases()
                if mono >= next_status or ix.roster != roster:
                    next_status = mono + STATUS_PERIOD_S
                    roster = ix.roster
                    self._write_status()
            self._drain(ix, next_lease, lease_every)
        finally:
            self._shutdown()
        return 0

    def _start_managers(self, ix: Interchange) -> None:
        """Local managers (no provider blocks), or colleague C's BlockManager."""
        scaling = self.config.scaling
        if scaling is None:
            ix.start_local_managers()
            return
        from endpoint_agent.scaling import BlockManager, build_launcher, build_provider, node_prologue

        wpn = scaling.workers_per_node or self.config.workers
        provider = build_provider(scaling, script_dir=self.paths.dir / "blocks")
        self.blocks = BlockManager(scaling, provider, build_launcher(scaling), ix,
                                   lambda block_id: ix.manager_command(block_id, wpn), workers_per_node=wpn,
                                   prologue=node_prologue(), name=self.name)
        self.blocks.start()
        log.info("blocks from provider %s (%d to %d blocks of %d node(s), %d workers per node); managers connect "
                 "to %s", scaling.provider, scaling.min_blocks, scaling.max_blocks, scaling.nodes_per_block, wpn,
                 ix.public_address)

    def _drain(self, ix: Interchange, next_lease: float, lease_every: float) -> None:
        self.state = "stopping"
        self._write_status()
        assert self.poller is not None
        self.poller.stop()
        if ix.direct is not None:  # direct sessions end with this run; what they sent may finish
            ix.direct.taking = False
        if self._grace_deadline is None:
            self._grace_deadline = time.monotonic() + self.config.grace_period
        while time.monotonic() < self._grace_deadline:
            if ix.load() == 0 and not self.poller.is_alive():
                break
            ix.step(LOOP_WAIT_S)
            mono = time.monotonic()
            if mono >= next_lease:
                next_lease = mono + lease_every
                ix.extend_leases()
        left = ix.load()
        if left:
            log.warning("grace period over: %d task(s) unfinished; their messages are redelivered when leases expire",
                        left)
        ix.flush()

    def _shutdown(self) -> None:
        if self.data is not None:
            self.data.stop()
        if self.poller is not None:
            self.poller.stop()
        if self.control_poller is not None:
            self.control_poller.stop()
        if self.heartbeater is not None:
            self.heartbeater.stop()
        if self.outbox is not None and not self.outbox.drain(timeout=15.0):
            log.error("results still unsent after 15 s; their tasks will be redelivered")
        # threads that may wake the interchange end before its sockets close
        if self.poller is not None:
            self.poller.join(self.config.receive_wait + 5)
        if self.control_poller is not None:
            self.control_poller.join(self.config.receive_wait + 5)
        if self.outbox is not None:
            self.outbox.on_idle = None
            self.outbox.close()
        if self.blocks is not None:
            try:
                self.blocks.stop(cancel=True)
            except Exception as exc:  # noqa: BLE001
                log.error("stopping the blocks failed: %s", exc)
        if self.interchange is not None:
            self.interchange.close()
        if self.link is not None:
            self.link.close()
        self.state = "stopped"
        self._write_status()
        log.info("stopped: %d completed, %d failed", self.interchange.completed if self.interchange else 0,
                 self.interchange.failed if self.interchange else 0)
