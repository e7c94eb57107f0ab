"""The privileged process of a multi-user endpoint: `skyfn-endpoint start NAME` for a config
that says `multi_user: true`, run as root.

It is built from the same parts as an agent (endpoint_agent.agent.Agent): the service
session (endpoint_agent/service/session.py: registration, endpoint credential, heartbeats,
queue handles) and the lifecycle (endpoint_agent/lifecycle.py: state, signals, status
file). Its work is routing rather than running: instead of an interchange with managers
and workers it runs

- the router's Redis (router_redis.py), the queues between it and its user agents;
- the user agents (user_agents.py), one per (account, rendered config), each an ordinary
  agent started as its account;
- the router (router.py): packs in from the service's task queue, results back through the
  outbox and the forwarders, cancels across; the audit log, written from the routing record
  (routes.py; lane_routes.py reads the routes of the tasks the service sends to lanes).

The process never deserializes a payload and holds none of the users' data credentials:
each user agent's data stores are started by that agent, as its account.

Stopping (SIGTERM) stops receiving, stops the user agents gracefully (they finish what they
run), forwards their last results, then ends the router's Redis, whose append-only file keeps
any task routed but not yet run for the next start. After a SIGKILL, the next start keeps the
router's Redis and the user agents that still run.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from endpoint_agent.config import parse_config
from endpoint_agent.lifecycle import STATUS_PERIOD_S, Lifecycle
from endpoint_agent.multiuser.accounts import load_environment_file
from endpoint_agent.multiuser.audit import AuditLog
from endpoint_agent.multiuser.configure import MultiUserConfig
from endpoint_agent.multiuser.identity import IdentityMapper
from endpoint_agent.multiuser.lane_routes import LaneRoutes
from endpoint_agent.multiuser.lanes import Lanes
from endpoint_agent.multiuser.router import Router
from endpoint_agent.multiuser.router_redis import RouterRedis
from endpoint_agent.multiuser.templates import UserConfigTemplate
from endpoint_agent.multiuser.user_agents import UserAgents
from endpoint_agent.paths import EndpointPaths
from endpoint_agent.service.outbox import Outbox
from endpoint_agent.service.poller import STOP_WAIT_S, ControlPoller, Poller
from endpoint_agent.service.session import ServiceSession, agent_metadata

log = logging.getLogger("skyfn.multiuser")

SUPERVISE_EVERY_S = 0.5


class MultiUserEndpoint:
    def __init__(self, name: str, config: MultiUserConfig, *, paths: EndpointPaths | None = None):
        self.name = name
        self.config = parse_config(config.endpoint_settings(), "multi-user endpoint settings")
        self.paths = paths or EndpointPaths(name)
        self.life = Lifecycle(self.paths, self.config.grace_period, self.status)
        self.session = ServiceSession(name, self.config, self.paths, self.life.stopping)
        self.poller: Poller | None = None
        self.control_poller: ControlPoller | None = None
        self.outbox: Outbox | None = None
        self.mu = config
        # loaded before anything starts, so a bad file is an error at start, not at the first task
        self.mapper = IdentityMapper.from_file(Path(config.identity_mapping_file), name)
        self.template = UserConfigTemplate.from_files(Path(config.user_config_template),
                                                      config.path("user_config_schema"))
        self.environment = load_environment_file(Path(config.user_environment_file))
        self.runtime_dir = Path(config.runtime_directory.format(name=name))
        self.router_redis: RouterRedis | None = None
        self.agents: UserAgents | None = None
        self.router: Router | None = None
        self.audit: AuditLog | None = None
        self.lanes: Lanes | None = None
        self.lane_routes: LaneRoutes | None = None
        self._wake = threading.Event()  # supervise now (a task arrived for a stopped agent), or stop

    def stop(self) -> None:
        """Ask the endpoint to stop gracefully (thread-safe, signal-safe)."""
        self.life.stop()
        self._wake.set()

    def metadata(self) -> dict[str, Any]:
        return {**agent_metadata(self.config), "multi_user": True, "workers": 0}

    def stats(self) -> dict[str, Any]:
        agents = self.agents.snapshot() if self.agents is not None else []
        return {"state": self.life.state, "multi_user": True, "workers": 0, "in_flight": 0,
                "user_agents_running": len([a for a in agents if a["alive"]]),
                "user_agents_known": len(agents), "lanes_bound": len([a for a in agents if a["lane"]]),
                "user_agents_stopped_idle": self.agents.stopped_idle if self.agents is not None else 0,
                "lanes_unbound_idle": self.agents.unbound_idle if self.agents is not None else 0,
                **(self.router.stats() if self.router is not None else {}),
                "uptime": self.life.uptime()}

    def status(self) -> dict[str, Any]:
        return {**self.life.head(self.session), "multi_user": True,
                "user_agents": self.agents.snapshot() if self.agents is not None else [],
                "router_redis": {"port": self.router_redis.port, "pid": self.router_redis.pid}
                if self.router_redis is not None else None, **self.stats()}

    def run(self) -> int:
        cfg, session = self.config, self.session
        self.life.catch_signals()
        self.life.write_status()
        try:
            session.connect(self.metadata, self.stats)
            poll_queue, results_queue, ack_queue = session.open_queues()
        except InterruptedError:
            return 0
        self.router_redis = RouterRedis(self.paths.dir / "router").start()
        self.audit = AuditLog(Path(self.mu.audit_log))
        self.outbox = Outbox(ack_queue, results_queue, cfg.lease_seconds)
        self.outbox.start()
        self.lanes = self._lanes()
        self.agents = UserAgents(router=self.router_redis, lanes=self.lanes, state_dir=self.paths.dir / "router",
                                 runtime_dir=self.runtime_dir, endpoint_id=session.endpoint_id, name=self.name,
                                 python=self.mu.user_agent_python, environment=self.environment,
                                 working_directory=self.mu.working_directory, idle_timeout=self.mu.idle_timeout,
                                 lease_seconds=cfg.lease_seconds, deny=self.mu.deny_accounts, min_uid=self.mu.min_uid,
                                 fail_tasks=lambda ua, reason: self.router.fail_tasks(ua, reason),
                                 peer_gid=self.mu.peer_gid, lane_idle_timeout=self.mu.lane_idle_timeout)
        self.agents.prepare()
        if self.lanes is not None:
            self.lane_routes = LaneRoutes(self.agents, self.lanes.client, self.router_redis.client)
            self.agents.may_hold = self.lane_routes.may_hold  # a stopped lane agent: looked at when a task came
            self.agents.lane_closed = self.lane_routes.forget
            self.lane_routes.wake = self._wake.set  # ... and at once, not at the next round
        self.router = Router(config=self.mu, name=self.name, endpoint_id=session.endpoint_id, mapper=self.mapper,
                             template=self.template, agents=self.agents, audit=self.audit, outbox=self.outbox,
                             open_results_queue=lambda: session.open(session.results_queue_desc),
                             router_client=self.router_redis.client, lane_routes=self.lane_routes)
        self.agents.take_back = self.router.take_back
        for ua in self.agents.adopt():
            self.router.ensure_forwarder(ua)
        if self.lane_routes is not None:
            self.lane_routes.start()
        self._take_back_closed_lanes()
        session.start_heartbeats(self.stats)
        self.poller = Poller(poll_queue, capacity=self.mu.max_routed_packs, receive_batch=cfg.receive_batch,
                             receive_wait=cfg.receive_wait, lease_seconds=cfg.lease_seconds, load=lambda: 0,
                             deliver=self.router.deliver)
        self.poller.start()
        if session.control_queue_desc is not None:
            self.control_poller = ControlPoller(session.open(session.control_queue_desc), receive_wait=cfg.receive_wait,
                                                cancel=self.router.cancel)
            self.control_poller.start()
        self.life.state = "running"
        log.info("multi-user endpoint %s (%s) running; router Redis on port %d", self.name, session.endpoint_id,
                 self.router_redis.port)
        next_status = 0.0
        roster: list = []
        try:
            while not self.life.stopping.is_set():
                self._wake.wait(SUPERVISE_EVERY_S)
                self._wake.clear()
                if self.life.stopping.is_set():
                    break
                try:
                    roster, next_status = self._supervise(roster, next_status)
                except Exception:  # noqa: BLE001 - one round failing (a store restarting) never stops the endpoint
                    log.exception("a supervision round failed; the next one runs in %.1f s", SUPERVISE_EVERY_S)
        finally:
            self._stop_all()
        return 0

    def _supervise(self, roster: list, next_status: float) -> tuple[list, float]:
        """One round: the user agents (one user's failure is that user's alone: user_agents.py),
        closed lanes, forwarders, the status file."""
        self.agents.supervise()
        self._take_back_closed_lanes()
        for ua in list(self.agents.agents.values()):
            if ua.alive():
                self.router.ensure_forwarder(ua)
        now_roster = self.agents.snapshot()
        if time.monotonic() >= next_status or now_roster != roster:
            roster = now_roster
            next_status = time.monotonic() + STATUS_PERIOD_S
            self.life.write_status()
        return roster, next_status

    def _lanes(self) -> Lanes | None:
        """Lanes at the service (skyfn.protocol.lanes) when the endpoint has a service link and
        its task queue is a Redis stream; else every task goes through the router's Redis."""
        session = self.session
        desc = session.task_queue_desc
        if session.link is None or desc is None or desc.kind != "redis":
            return None
        lanes = Lanes(session.link, session.endpoint_id, desc.url, self.config.lease_seconds)
        lanes.available = self.mu.lanes  # off: binds nothing new, still closes the lanes of an earlier run
        return lanes

    def _take_back_closed_lanes(self) -> None:
        """Route again what arrived in lanes closed lately (multiuser/closed_lanes.py)."""
        with self.agents.lock:
            if not self.agents.closed_lanes:
                return
            due = self.agents.closed_lanes.due()
            for queue in due:
                try:
                    if self.router.take_back(queue):
                        log.info("routed again what was left in closed lane %s", queue.name)
                except Exception as exc:  # noqa: BLE001 - the service's Redis restarting: a later look
                    log.warning("cannot take back closed lane %s (%s)", queue.name, exc)

    def _stop_all(self) -> None:
        self.life.state = "stopping"
        self.life.write_status()
        for thread in (self.poller, self.control_poller):
            if thread is not None:
                thread.stop()
        self.session.stop_heartbeats()
        if self.agents is not None:
            self.agents.stop_all(timeout=self.config.grace_period + 30)
        if self.router is not None:
            self.router.drain(timeout=15.0)
        if self.lane_routes is not None:
            self.lane_routes.stop()
        if self.outbox is not None:
            if not self.outbox.drain(timeout=15.0):
                log.error("results still unsent after 15 s; their tasks will be redelivered")
        for poller in (self.poller, self.control_poller):  # a long poll in progress is left (poller.py)
            if poller is not None:
                poller.join(STOP_WAIT_S)
        if self.outbox is not None:
            self.outbox.close()
        if self.router_redis is not None:
            self.router_redis.stop()
        if self.lanes is not None:
            self.lanes.shut()
        if self.audit is not None:
            self.audit.close()
        self.session.close()
        self.life.state = "stopped"
        self.life.write_status()
        log.info("stopped multi-user endpoint %s", self.name)
