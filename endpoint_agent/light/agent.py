"""The light agent: `LightAgent(name, config).run()`, an Agent whose tasks run inline.

It registers (or connects with its kept credential), opens its queues, heartbeats every
`heartbeat_period`, long-polls its task and control queues and sends sealed result packs
exactly as endpoint_agent/agent.py does -- the same ServiceSession, Poller, ControlPoller
and Outbox -- but hands its tasks to an InlineEngine (engine.py) running them on a thread
pool shared by the process (pool.py) instead of to an interchange and its managers.

Its own thread only sleeps: `run()` waits for the stop, waking every lease_seconds/3 to
extend the leases of the packs it holds (nothing is sent when it holds none), and every
2 s to rewrite its status file when it writes one (a fleet host's agents write none).
Every other thread of it blocks on a long poll, a condition or a timer. `ready` is set once it runs (its
endpoint id known, its heartbeats started, its poller polling). Stopping is graceful as
the Agent's: receiving stops, running tasks get up to `grace_period`, results are sent and
their task messages acknowledged. A stop does not wait out the long poll under way: it
leaves it after a moment, and what that poll still takes is released (poller.py), as the
Agent's does.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from endpoint_agent.config import EndpointConfig
from endpoint_agent.lifecycle import STATUS_PERIOD_S, Lifecycle
from endpoint_agent.light.engine import InlineEngine
from endpoint_agent.light.pool import SharedPool, shared_pool
from endpoint_agent.paths import EndpointPaths
from endpoint_agent.service.outbox import Outbox
from endpoint_agent.service.poller import STOP_WAIT_S, ControlPoller, Poller
from endpoint_agent.service.session import ServiceSession, agent_metadata
from skyfn.protocol.api import QueueDescriptor

log = logging.getLogger("skyfn.agent.light")


class LightAgent:
    def __init__(self, name: str, config: EndpointConfig, *, endpoint_id: str | None = None,
                 task_queue: QueueDescriptor | None = None, results_queue: QueueDescriptor | None = None,
                 paths: EndpointPaths | None = None, write_status_file: bool = True, pool: SharedPool | None = None,
                 on_ready: Callable[["LightAgent"], None] | None = None):
        if not config.engine.inline:
            raise ValueError("LightAgent runs the inline engine: give a config with engine: {type: inline}")
        self.name = name
        self.config = config
        self.paths = paths or EndpointPaths(name)
        self.pool = pool or shared_pool(config.engine.threads)
        self.life = Lifecycle(self.paths, config.grace_period, self.status, write_status_file=write_status_file)
        self.session = ServiceSession(name, config, self.paths, self.life.stopping, endpoint_id=endpoint_id,
                                      task_queue=task_queue, results_queue=results_queue)
        self.engine: InlineEngine | None = None
        self.poller: Poller | None = None
        self.control_poller: ControlPoller | None = None
        self.outbox: Outbox | None = None
        self.data = None  # endpoint_agent.data.plane.EndpointData when the config has a data section
        self.ready = threading.Event()
        self.on_ready = on_ready  # called (on the agent's thread) once it runs

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
        return {**agent_metadata(self.config), "workers": self.config.engine.threads}

    def stats(self) -> dict[str, Any]:
        """The heartbeat's stats: the Agent's keys, the engine's counts."""
        e = self.engine.stats() if self.engine is not None else {}
        return {"state": self.life.state, "workers": self.config.engine.threads, "manager_count": 0,
                "warm_containers": {}, "in_flight": e.get("in_flight", 0), "completed": e.get("completed", 0),
                "failed": e.get("failed", 0), "retried": 0, "received_tasks": e.get("received_tasks", 0),
                "direct": None, "uptime": self.life.uptime()}

    def status(self) -> dict[str, Any]:
        return {**self.life.head(self.session), "engine": "inline", "threads": self.pool.threads,
                "task_queue": self.session.task_queue_summary(),
                **(self.engine.stats() if self.engine is not None else {}), **self.stats()}

    # --- the run ------------------------------------------------------------------
    def run(self) -> int:
        """Run until stopped; returns the exit code (0 after a graceful stop)."""
        cfg, life, session = self.config, self.life, self.session
        life.grace_deadline = None
        life.catch_signals()
        life.write_status()
        try:
            try:
                session.connect(self.metadata, self.stats)
                poll_queue, results_queue, ack_queue = session.open_queues()
            except InterruptedError:
                return 0
            if cfg.data is not None:
                from endpoint_agent.data.plane import EndpointData

                self.data = EndpointData(cfg.data, self.paths.dir, session.endpoint_id).start()
            self.outbox = Outbox(ack_queue, results_queue, cfg.lease_seconds)
            self.outbox.start()
            engine = self.engine = InlineEngine(cfg, session.endpoint_id, self.outbox, self.pool)
            self.outbox.on_idle = engine.on_idle
            session.start_heartbeats(self.stats, allowed=session.allowed_report())
            self.poller = Poller(poll_queue, capacity=engine.capacity, receive_batch=cfg.receive_batch,
                                 receive_wait=cfg.receive_wait, lease_seconds=cfg.lease_seconds,
                                 load=engine.load, deliver=engine.deliver)
            engine.st.room_event = self.poller.room
            self.poller.start()
            if session.control_queue_desc is not None:
                try:
                    self.control_poller = ControlPoller(session.open(session.control_queue_desc),
                                                        receive_wait=cfg.receive_wait, cancel=engine.cancel)
                    self.control_poller.start()
                except Exception as exc:  # noqa: BLE001 - cancels then only stop queued tasks at the service
                    log.error("cannot open the control queue (%s): cancels will not reach running tasks", exc)
            life.state = "running"
            life.write_status()
            if self.on_ready is not None:
                self.on_ready(self)  # before `ready`: a waiter on `ready` finds what on_ready records
            self.ready.set()
            log.info("endpoint %s (%s) running inline: %d shared threads, capacity %d tasks", session.endpoint_id,
                     self.name, self.pool.threads, cfg.capacity)
            lease_every = cfg.lease_seconds / 3.0
            tick = min(lease_every, STATUS_PERIOD_S) if life.write_status_file else lease_every
            next_lease = time.monotonic() + lease_every
            while not life.stopping.wait(tick):
                if time.monotonic() >= next_lease:
                    next_lease = time.monotonic() + lease_every
                    engine.extend_leases()
                life.write_status()
            self._drain(engine, lease_every)
        finally:
            self._shutdown()
        return 0

    def _drain(self, engine: InlineEngine, lease_every: float) -> None:
        life = self.life
        life.state = "stopping"
        life.write_status()
        assert self.poller is not None
        self.poller.stop()
        if self.control_poller is not None:
            self.control_poller.stop()
        if life.grace_deadline is None:
            life.grace_deadline = time.monotonic() + self.config.grace_period
        next_lease = time.monotonic() + lease_every
        while True:
            left = life.grace_deadline - time.monotonic()
            if left <= 0 or engine.wait_empty(min(left, 1.0)):
                break
            if time.monotonic() >= next_lease:
                next_lease = time.monotonic() + lease_every
                engine.extend_leases()
        left = engine.load()
        if left:
            log.warning("%s: grace period over: %d task(s) unfinished; their messages are redelivered when leases "
                        "expire", self.name, left)
        engine.flush()

    def _shutdown(self) -> None:
        self.ready.clear()
        if self.data is not None:
            self.data.stop()
        if self.poller is not None:
            self.poller.stop()
        if self.control_poller is not None:
            self.control_poller.stop()
        self.session.stop_heartbeats()
        if self.outbox is not None and not self.outbox.drain(timeout=15.0):
            log.error("%s: results still unsent after 15 s; their tasks will be redelivered", self.name)
        for poller in (self.poller, self.control_poller):  # a long poll in progress is left (poller.py)
            if poller is not None:
                poller.join(STOP_WAIT_S)
        if self.outbox is not None:
            self.outbox.on_idle = None
            self.outbox.close()
        self.session.close()
        self.life.state = "stopped"
        self.life.write_status()
        e = self.engine
        log.info("%s stopped: %d completed, %d failed", self.name, e.st.completed if e else 0, e.st.failed if e else 0)
