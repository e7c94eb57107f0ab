"""The agent: wires the service session, the poller, the interchange and the outbox, and runs.

`Agent(name, config).run()` registers with the service (POST /endpoints) to learn its
endpoint id and queues, or uses the ones given (arguments, or config.yaml's
task_queue/results_queue) without contacting the service at all (service/session.py). It then runs the
interchange loop in the calling thread until `stop()` is called or, when running in
the main thread, SIGTERM/SIGINT arrives (lifecycle.py). Stopping is graceful: receiving stops, in-flight
tasks get up to `grace_period` seconds, results are flushed and their task messages
acknowledged, the manager and workers are stopped. Anything unfinished is redelivered
by the queue when its lease expires.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from endpoint_agent.config import EndpointConfig
from endpoint_agent.interchange import Interchange
from endpoint_agent.lifecycle import STATUS_PERIOD_S, Lifecycle
from endpoint_agent.paths import EndpointPaths
from endpoint_agent.service.outbox import Outbox
from endpoint_agent.service.poller import STOP_WAIT_S, ControlPoller, Poller
from endpoint_agent.service.session import ServiceSession, agent_metadata
from skyfn import gc_tuning
from skyfn.protocol.api import QueueDescriptor
from skyfn.protocol.dataflow import PARK_FEATURE

log = logging.getLogger("skyfn.agent")

LOOP_WAIT_S = 0.1


class Agent:
    def __init__(self, name: str, config: EndpointConfig, *, endpoint_id: str | None = None,
                 task_queue: QueueDescriptor | None = None, results_queue: QueueDescriptor | None = None,
                 paths: EndpointPaths | None = None, write_status_file: bool = True,
                 queue_wrapper: Callable[[str, Any], Any] | None = None):
        self.name = name
        self.config = config
        self.paths = paths or EndpointPaths(name)
        self.life = Lifecycle(self.paths, config.grace_period, self.status, write_status_file=write_status_file)
        # queue_wrapper: what a user agent of a multi-user endpoint puts around its queues (session.py)
        self.session = ServiceSession(name, config, self.paths, self.life.stopping, endpoint_id=endpoint_id,
                                      task_queue=task_queue, results_queue=results_queue,
                                      queue_wrapper=queue_wrapper)
        self.interchange: Interchange | None = None
        self.poller: Poller | None = None
        self.control_poller: ControlPoller | None = None
        self.blocks = None  # endpoint_agent.scaling.BlockManager when blocks come from a provider
        self.outbox: Outbox | None = None
        self.data = None  # endpoint_agent.data.plane.EndpointData when the config has a data section

    @property
    def state(self) -> str:
        return self.life.state

    @property
    def endpoint_id(self) -> str | None:
        return self.session.endpoint_id

    def stop(self) -> None:
        """Ask the agent to stop gracefully (thread-safe, signal-safe)."""
        self.life.stop()

    # --- reports ------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        return agent_metadata(self.config)

    def stats(self) -> dict[str, Any]:
        ix = self.interchange
        return {
            "state": self.life.state,
            "workers": (ix.snapshot()["workers"] if ix else 0) or self.config.workers * self.config.managers,
            **self._placement_stats(),
            "in_flight": ix.load() if ix else 0,
            "completed": ix.completed if ix else 0,
            "failed": ix.failed if ix else 0,
            "retried": ix.retried if ix else 0,
            "received_tasks": ix.received_tasks if ix else 0,
            # direct sessions: address and counters only (the session key is a secret)
            "direct": ix.direct.stats() if ix is not None and ix.direct is not None else None,
            "uptime": self.life.uptime(),
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
            **self.life.head(self.session),
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
            "task_queue": self.session.task_queue_summary(),
            **self.stats(),
        }

    def run(self) -> int:
        """Run until stopped; returns the exit code (0 after a graceful stop)."""
        cfg, life, session = self.config, self.life, self.session
        life.grace_deadline = None
        life.catch_signals()
        life.write_status()
        try:
            session.connect(self.metadata, self.stats)
            poll_queue, results_queue, ack_queue = session.open_queues()
        except InterruptedError:
            return 0
        if cfg.data is not None:  # before the managers start: they inherit SKYFN_DATA_STORES
            from endpoint_agent.data.plane import EndpointData

            self.data = EndpointData(cfg.data, self.paths.dir, session.endpoint_id).start()
        self.outbox = Outbox(ack_queue, results_queue, cfg.lease_seconds)
        self.outbox.start()
        ix = self.interchange = Interchange(cfg, session.endpoint_id, self.outbox, key_dir=self.paths.dir / "curve")
        # results held while a send was in flight leave when it completes (group commit)
        self.outbox.on_idle = ix.on_outbox_idle
        # at once: the first heartbeat publishes the direct socket (sessions can open)
        session.start_heartbeats(self.stats, allowed=session.allowed_report(),
                                 direct=ix.direct.info() if ix.direct is not None else None,
                                 features=[PARK_FEATURE] if cfg.local_results_mb > 0 else None)
        if ix.direct is not None and cfg.direct.by_rendezvous:  # no port: SDKs come through the rendezvous
            link, endpoint_id = session.link, session.endpoint_id
            ix.direct.start_reach(lambda: link.direct_listen(endpoint_id))
        self._start_managers(ix)
        self.poller = Poller(poll_queue, capacity=ix.capacity, receive_batch=cfg.receive_batch,
                             receive_wait=cfg.receive_wait, lease_seconds=cfg.lease_seconds,
                             load=ix.load, deliver=ix.deliver)
        ix.room_event = self.poller.room
        self.poller.start()
        if session.control_queue_desc is not None:
            try:
                self.control_poller = ControlPoller(session.wrap("control", session.open(session.control_queue_desc)),
                                                    receive_wait=cfg.receive_wait, cancel=ix.cancel)
                self.control_poller.start()
            except Exception as exc:  # noqa: BLE001 - cancels then only stop queued tasks at the service
                log.error("cannot open the control queue (%s): cancels will not reach running tasks", exc)
        life.state = "running"
        gc_tuning.settle()
        log.info("endpoint %s running: %d workers, capacity %d tasks, consumer %s", session.endpoint_id,
                 cfg.workers, cfg.capacity, session.consumer)
        lease_every = cfg.lease_seconds / 3.0
        next_lease = time.monotonic() + lease_every
        next_status = time.monotonic()
        roster = ix.roster
        try:
            while not life.stopping.is_set():
                ix.step(LOOP_WAIT_S)
                mono = time.monotonic()
                if mono >= next_lease:
                    next_lease = mono + lease_every
                    ix.extend_leases()
                if mono >= next_status or ix.roster != roster:
                    next_status = mono + STATUS_PERIOD_S
                    roster = ix.roster
                    life.write_status()
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
        self.life.state = "stopping"
        self.life.write_status()
        assert self.poller is not None
        self.poller.stop()
        if ix.direct is not None:  # direct sessions end with this run; what they sent may finish
            ix.direct.taking = False
        life = self.life
        if life.grace_deadline is None:
            life.grace_deadline = time.monotonic() + self.config.grace_period
        while time.monotonic() < life.grace_deadline:
            if ix.load() == 0:  # the poller hands nothing on once stopped
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
        self.session.stop_heartbeats()
        if self.outbox is not None and not self.outbox.drain(timeout=15.0):
            log.error("results still unsent after 15 s; their tasks will be redelivered")
        # threads that may wake the interchange end before its sockets close
        for poller in (self.poller, self.control_poller):  # a long poll in progress is left (poller.py)
            if poller is not None:
                poller.join(STOP_WAIT_S)
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
        self.session.close()
        self.life.state = "stopped"
        self.life.write_status()
        log.info("stopped: %d completed, %d failed", self.interchange.completed if self.interchange else 0,
                 self.interchange.failed if self.interchange else 0)
