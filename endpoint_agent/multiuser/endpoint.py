"""The privileged process of a multi-user endpoint: `skyfn-endpoint start NAME` for a config
that says `multi_user: true`, run as root.

It is an agent (endpoint_agent.agent.Agent: the same registration, endpoint credential,
heartbeats, queue handles, signals and status file) whose work is routing rather than
running: instead of an interchange with managers and workers it runs

- the router's Redis (router_redis.py), the queues between it and its user agents;
- the user agents (user_agents.py), one per (account, rendered config), each an ordinary
  agent started as its account;
- the router (router.py): packs in from the service's task queue, results back through the
  outbox and the forwarders, cancels across; the audit log.

The process never deserializes a payload and holds none of the users' data credentials:
each user agent's data stores are started by that agent, as its account.

Stopping (SIGTERM) stops receiving, stops the user agents gracefully (they finish what they
run), forwards their last results, then ends the router's Redis, whose append-only file keeps
any task routed but not yet run for the next start. After a SIGKILL, the next start keeps the
router's Redis and the user agents that still run.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from endpoint_agent.agent import STATUS_PERIOD_S, Agent
from endpoint_agent.config import parse_config
from endpoint_agent.multiuser.accounts import load_environment_file
from endpoint_agent.multiuser.audit import AuditLog
from endpoint_agent.multiuser.configure import MultiUserConfig
from endpoint_agent.multiuser.identity import IdentityMapper
from endpoint_agent.multiuser.lanes import Lanes
from endpoint_agent.multiuser.router import Router
from endpoint_agent.multiuser.router_redis import RouterRedis
from endpoint_agent.multiuser.templates import UserConfigTemplate
from endpoint_agent.multiuser.user_agents import UserAgents
from endpoint_agent.paths import EndpointPaths
from endpoint_agent.service.link import Heartbeater
from endpoint_agent.service.outbox import Outbox
from endpoint_agent.service.poller import ControlPoller, Poller

log = logging.getLogger("skyfn.multiuser")

SUPERVISE_EVERY_S = 0.5


class MultiUserEndpoint(Agent):
    def __init__(self, name: str, config: MultiUserConfig, *, paths: EndpointPaths | None = None):
        super().__init__(name, parse_config(config.endpoint_settings(), "multi-user endpoint settings"),
                         paths=paths or EndpointPaths(name))
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

    def metadata(self) -> dict[str, Any]:
        return {**super().metadata(), "multi_user": True, "workers": 0}

    def stats(self) -> dict[str, Any]:
        agents = self.agents.snapshot() if self.agents is not None else []
        return {"state": self.state, "multi_user": True, "workers": 0, "in_flight": 0,
                "user_agents_running": len([a for a in agents if a["alive"]]),
                **(self.router.stats() if self.router is not None else {}),
                "uptime": round(time.time() - self.started, 1)}

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "pid": os.getpid(), "endpoint_id": self.endpoint_id, "state": self.state,
                "started": self.started, "updated": time.time(), "consumer": self.consumer, "multi_user": True,
                "user_agents": self.agents.snapshot() if self.agents is not None else [],
                "router_redis": {"port": self.router_redis.port, "pid": self.router_redis.pid}
                if self.router_redis is not None else None, **self.stats()}

    def run(self) -> int:
        cfg = self.config
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        self._write_status()
        try:
            self._connect()
            poll_queue, results_queue, ack_queue = self._open_queues()
        except InterruptedError:
            return 0
        self.router_redis = RouterRedis(self.paths.dir / "router").start()
        self.audit = AuditLog(Path(self.mu.audit_log))
        self.outbox = Outbox(ack_queue, results_queue, cfg.lease_seconds)
        self.outbox.start()
        self.lanes = self._lanes()
        self.agents = UserAgents(router=self.router_redis, lanes=self.lanes, state_dir=self.paths.dir / "router",
                                 runtime_dir=self.runtime_dir, endpoint_id=self.endpoint_id, name=self.name,
                                 python=self.mu.user_agent_python, environment=self.environment,
                                 working_directory=self.mu.working_directory, idle_timeout=self.mu.idle_timeout,
                                 lease_seconds=cfg.lease_seconds, deny=self.mu.deny_accounts, min_uid=self.mu.min_uid,
                                 fail_tasks=lambda ua, reason: self.router.fail_tasks(ua, reason))
        self.agents.prepare()
        self.router = Router(config=self.mu, name=self.name, endpoint_id=self.endpoint_id, mapper=self.mapper,
                             template=self.template, agents=self.agents, audit=self.audit, outbox=self.outbox,
                             open_results_queue=lambda: self._open(self.results_queue_desc),
                             router_client=self.router_redis.client)
        for ua in self.agents.adopt():
            self.router.ensure_forwarder(ua)
        self._take_back_closed_lanes()
        if self.link is not None:
            self.heartbeater = Heartbeater(self.link, self.endpoint_id, cfg.heartbeat_period, self.stats)
            self.heartbeater.start()
        self.poller = Poller(poll_queue, capacity=self.mu.max_routed_packs, receive_batch=cfg.receive_batch,
                             receive_wait=cfg.receive_wait, lease_seconds=cfg.lease_seconds, load=lambda: 0,
                             deliver=self.router.deliver)
        self.poller.start()
        if self.control_queue_desc is not None:
            self.control_poller = ControlPoller(self._open(self.control_queue_desc), receive_wait=cfg.receive_wait,
                                                cancel=self.router.cancel)
            self.control_poller.start()
        self.state = "running"
        log.info("multi-user endpoint %s (%s) running; router Redis on port %d", self.name, self.endpoint_id,
                 self.router_redis.port)
        next_status = 0.0
        roster: list = []
        try:
            while not self._stop.wait(SUPERVISE_EVERY_S):
                self.agents.supervise()
                self._take_back_closed_lanes()
                for ua in list(self.agents.agents.values()):
                    if ua.alive():
                        self.router.ensure_forwarder(ua)
                now_roster = self.agents.snapshot()
                if time.monotonic() >= next_status or now_roster != roster:
                    roster = now_roster
                    next_status = time.monotonic() + STATUS_PERIOD_S
                    self._write_status()
        finally:
            self._stop_all()
        return 0

    def _lanes(self) -> Lanes | None:
        """Lanes at the service (skyfn.protocol.lanes) when the endpoint has a service link and
        its task queue is a Redis stream; else every task goes through the router's Redis."""
        desc = self.task_queue_desc
        if self.link is None or desc is None or desc.kind != "redis":
            return None
        lanes = Lanes(self.link, self.endpoint_id, desc.url, self.config.lease_seconds)
        lanes.available = self.mu.lanes  # off: binds nothing new, still closes the lanes of an earlier run
        return lanes

    def _take_back_closed_lanes(self) -> None:
        if not self.agents.closed_lanes:
            return
        now = time.monotonic()
        kept = []
        for queue, until in self.agents.closed_lanes:
            try:
                if self.router.take_back(queue):
                    log.info("routed again what was left in closed lane %s", queue.name)
            except Exception as exc:  # noqa: BLE001 - the service's Redis restarting: next time
                log.warning("cannot take back closed lane %s (%s)", queue.name, exc)
            if now < until:
                kept.append((queue, until))
        self.agents.closed_lanes = kept

    def _stop_all(self) -> None:
        self.state = "stopping"
        self._write_status()
        for thread in (self.poller, self.control_poller, self.heartbeater):
            if thread is not None:
                thread.stop()
        if self.agents is not None:
            self.agents.stop_all(timeout=self.config.grace_period + 30)
        if self.router is not None:
            self.router.drain(timeout=15.0)
        if self.outbox is not None:
            if not self.outbox.drain(timeout=15.0):
                log.error("results still unsent after 15 s; their tasks will be redelivered")
            self.outbox.close()
        if self.router_redis is not None:
            self.router_redis.stop()
        if self.lanes is not None:
            self.lanes.shut()
        if self.audit is not None:
            self.audit.close()
        if self.link is not None:
            self.link.close()
        self.state = "stopped"
        self._write_status()
        log.info("stopped multi-user endpoint %s", self.name)
