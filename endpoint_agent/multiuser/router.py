"""The router of a multi-user endpoint: task packs from the service to the user agent of their
submitter, results back, cancels across, every task written to the audit log.

It reads only a pack's envelope -- `identity`, `user_config`, `owner`, the task ids and
function ids -- and never deserializes a payload, a function body or a result (they travel
as the strings they are). For each pack received from the endpoint's task queue:

1. the submitting identity is mapped to an account (identity.IdentityMapper), the account is
   checked (accounts.lookup_account: not root, not denied, uid not below min_uid), the
   user's variables are checked against the schema and the template is rendered
   (templates.UserConfigTemplate), and the result must be a valid endpoint config that sets
   none of the keys the endpoint sets itself;
2. any refusal ends every task of the pack FAILED with the reason (naming the identity and
   the endpoint, or the variable and the rule), recorded in the audit log as REFUSED; nothing
   is started;
3. otherwise each task's route (user agent, identity, function) is written to the router's
   Redis, the pack is added to that user agent's task stream, and only then is the service's
   message acknowledged: a kill in between sends the pack again, and the service stores a
   task's result once.

Results: one forwarder thread per user agent reads its results stream, keeps only results
and updates of tasks routed to *that* agent (a user agent cannot report on another user's
tasks), sends them to the service's results queue under the endpoint's id, audits final
results, and only then deletes them from the stream. Cancels from the control queue go to
the control stream of the agent each task was routed to.

Lanes (skyfn.protocol.lanes, multiuser/lanes.py): where the service has them, routing a pack
also binds its (identity, config key) to its user agent's lane at the service, and the pack
goes into the lane's queue instead of the router's stream. From then on the service sends
that user's tasks to the lane itself and the user agent returns their results to the service
sealed: the router sees neither. The routing record of those tasks comes from the service's
messages in the lane (multiuser/lane_routes.py), never from the agent; the agent copies each
task's outcome to its results stream (multiuser/lane.py), and the forwarder writes a line per
task from the record and the service's final state, which it asks with the endpoint's
credential; a copy that does not fit the record, or reports another outcome than the
service's, is a disagreement (multiuser/audit_copies.py, audit_confirm.py). A cancel of a task
whose route is not known reads the lanes first; if it is still unknown it goes to every
running agent with a lane (an agent ignores ids it does not hold).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable, Optional

from endpoint_agent.config import parse_config
from endpoint_agent.errors import ConfigError
from endpoint_agent.multiuser.accounts import Account, lookup_account
from endpoint_agent.multiuser.audit import AuditLog
from endpoint_agent.multiuser.audit_copies import CopyJudge, parse
from endpoint_agent.multiuser.configure import MultiUserConfig
from endpoint_agent.multiuser.errors import TaskRefused
from endpoint_agent.multiuser.identity import IdentityMapper
from endpoint_agent.multiuser.routes import (IDENTITIES, REFUSED_BY, ROUTES, route_value, routes_of, times_of,
                                             write_lines, write_unrouted)
from endpoint_agent.multiuser.templates import UserConfigTemplate
from endpoint_agent.multiuser.user_agents import ENDPOINT_KEYS, StartRefused, UserAgent, UserAgents
from endpoint_agent.service.outbox import Outbox
from skyfn.protocol.messages import ControlMessage, ResultPack, TaskPack, TaskResult
from skyfn.protocol.queues.base import TaskQueue
from skyfn.protocol.user_config import config_key

log = logging.getLogger("skyfn.multiuser.router")

AUDIT_HEAD = b'{"audit":'    # a lane agent's audit copies, in its results stream (multiuser/lane.py)
AUDIT_POLL_S = 0.25          # how often the audit copies of a busy lane's agent are read
AUDIT_POLL_IDLE_S = 4.0      # ... doubling up to this while its copies stream stays empty
PLAN_CACHE_S = 30.0           # a (identity, user_config) mapped and rendered is reused this long
FINAL = ("SUCCEEDED", "FAILED", "TIMED_OUT")


class Plan:
    """Where a pack goes: the account and the rendered config (or why it goes nowhere)."""

    __slots__ = ("account", "config", "digest", "refused", "made")

    def __init__(self, account: Optional[Account] = None, config: Optional[dict] = None, digest: str = "",
                 refused: Optional[str] = None):
        self.account, self.config, self.digest, self.refused = account, config, digest, refused
        self.made = time.monotonic()


class Router:
    def __init__(self, *, config: MultiUserConfig, name: str, endpoint_id: str, mapper: IdentityMapper,
                 template: UserConfigTemplate, agents: UserAgents, audit: AuditLog, outbox: Outbox,
                 open_results_queue, router_client, lane_routes=None):
        self.config = config
        self.name = name
        self.endpoint_id = endpoint_id
        self.mapper = mapper
        self.template = template
        self.agents = agents
        self.audit = audit
        self.outbox = outbox
        self.open_results_queue = open_results_queue  # () -> a TaskQueue of the service's results queue
        self.r = router_client
        self.lane_routes = lane_routes  # lane_routes.LaneRoutes: the routes of the lanes' tasks (None: no lanes)
        lanes = getattr(agents, "lanes", None)  # the lanes' service link asks the service its tasks' states
        self.copies = CopyJudge(router_client, audit, lane_routes.catch_up if lane_routes is not None else None,
                                ask=(lambda ids: lanes.link.task_states(endpoint_id, ids).states)
                                if lanes is not None else None)
        self._plans: dict[str, Plan] = {}
        self._forwarders: dict[str, threading.Thread] = {}
        self._halt = threading.Event()
        if lane_routes is not None:  # lanes: their tasks' lines wait for the service's final state
            self.copies.confirmer.start(self._halt)
        self.routed = 0
        self.refused = 0
        self.forwarded_results = 0
        self.dropped_results = 0

    # --- packs in ----------------------------------------------------------------------
    def deliver(self, batch: list[tuple[str, TaskPack, float]], n_tasks: int,
                ack: Optional[Callable[[str], None]] = None) -> None:
        """The poller's hand-off: route each pack (see the module docstring). `ack`: how a
        pack's message is acknowledged once routed (default: on the endpoint's task queue)."""
        ack = ack or (lambda receipt: self.outbox.put(acks=[receipt]))
        for receipt, pack, received in batch:
            plan = self._plan(pack)
            if plan.refused is not None:
                self._refuse(receipt, pack, plan.refused, plan.account, ack)
                continue
            with self.agents.lock:  # not forgotten as idle between choosing it and routing to it
                try:
                    ua = self.agents.get(plan.account, pack.identity.id, plan.config, plan.digest,
                                         config_key(pack.user_config))
                except StartRefused as exc:  # it could not start, or is backed off: the reason says which
                    self._refuse(receipt, pack, str(exc), plan.account, ack)
                    continue
                except (TaskRefused, ConfigError, OSError) as exc:
                    self._refuse(receipt, pack, f"the user agent of {plan.account.name} could not be started on "
                                                f"endpoint {self.name}: {exc}", plan.account, ack)
                    continue
                self._route(ua, pack)
            self.ensure_forwarder(ua)
            ack(receipt)
            self.routed += len(pack.tasks)

    def take_back(self, queue: TaskQueue) -> int:
        """Route again what is left in the queue of a lane closed at start (its bindings were
        made under an earlier run's mapping); returns how many packs were taken."""
        taken = 0
        while True:
            messages = queue.receive(max_messages=50, wait_seconds=0, visibility_timeout=self.config.lease_seconds)
            if not messages:
                return taken
            batch = []
            for m in messages:
                try:
                    batch.append((m.receipt, TaskPack.model_validate_json(m.body), time.time()))
                except ValueError:
                    log.error("a message in closed lane %s is not a TaskPack: dropped", queue.name)
                    queue.delete([m.receipt])
            self.deliver(batch, 0, ack=lambda receipt: queue.delete([receipt]))
            taken += len(batch)

    def _plan(self, pack: TaskPack) -> Plan:
        identity = pack.identity
        if identity is None:
            return Plan(refused=f"task pack {pack.pack_id} carries no submitting identity, so endpoint {self.name} "
                                "(multi-user) cannot choose an account: the service must send it (update the "
                                "service)")
        cache_key = json.dumps([identity.model_dump(), pack.user_config], sort_keys=True, default=str)
        plan = self._plans.get(cache_key)
        if plan is not None and time.monotonic() - plan.made < PLAN_CACHE_S:
            return plan
        plan = self._make_plan(identity.model_dump(), pack.user_config)
        if len(self._plans) > 10_000:
            self._plans.clear()
        self._plans[cache_key] = plan
        return plan

    def _make_plan(self, identity: dict, user_config: Optional[dict]) -> Plan:
        account = None
        try:
            name = self.mapper.map(identity).account_or_raise()
            account = lookup_account(name, self.config.deny_accounts, self.config.min_uid)
            rendered = self.template.render(account.name, user_config,
                                            reserved={"account": {"name": account.name, "home": account.home,
                                                                  "uid": account.uid}})
        except TaskRefused as exc:
            return Plan(account=account, refused=f"{exc} (endpoint {self.name})" if self.name not in str(exc)
                        else str(exc))
        taken = sorted(set(rendered.config) & set(ENDPOINT_KEYS))
        if taken:
            return Plan(account=account, refused=f"the user config template of endpoint {self.name} sets "
                        f"{', '.join(taken)}, which the endpoint sets for each user agent: the administrator "
                        "must remove them from the template")
        try:
            parse_config(rendered.config, f"the user config rendered for {account.name}")
        except ConfigError as exc:
            return Plan(account=account, refused=f"endpoint {self.name}: {exc}")
        return Plan(account=account, config=rendered.config, digest=rendered.digest)

    def _route(self, ua: UserAgent, pack: TaskPack) -> None:
        identity = pack.identity
        body = pack.model_dump_json(exclude_none=True).encode()
        routes = {t.task_id: route_value(ua.key, identity.id, t.function_id,
                                         (pack.function_meta.get(t.function_id) or {}).get("name"))
                  for t in pack.tasks}
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(ROUTES, mapping=routes)  # the record the audit line is written from
        pipe.hset(IDENTITIES, identity.id, identity.model_dump_json())
        if ua.lane_queue is not None:  # its results come back from the service; the route is kept
            pipe.execute()
            ua.lane_queue.send([body])
            return
        ua.queues["tasks"].send_on(pipe, [body])
        pipe.execute()

    def _refuse(self, receipt: str, pack: TaskPack, reason: str, account: Optional[Account],
                ack: Callable[[str], None]) -> None:
        log.warning("refused pack %s (%d task(s)): %s", pack.pack_id, len(pack.tasks), reason)
        now = time.time()
        results = [TaskResult(task_id=t.task_id, state="FAILED", reason=reason, events=[("FAILED", now)])
                   for t in pack.tasks]
        identity = pack.identity.model_dump() if pack.identity is not None else {"id": pack.owner}
        write_unrouted(self.r, self.audit, REFUSED_BY, [
            dict(identity=identity, account=account.name if account else None, uid=account.uid if account else None,
                 function_id=t.function_id, function_name=(pack.function_meta.get(t.function_id) or {}).get("name"),
                 task_id=t.task_id, start=None, end=now, outcome="REFUSED", reason=reason)
            for t in pack.tasks])
        body = ResultPack(endpoint_id=self.endpoint_id, results=results).model_dump_json().encode()
        self.outbox.put(bodies=[body])
        ack(receipt)  # on the endpoint's queue the outbox sends the failures first, in order
        self.refused += len(pack.tasks)

    def _routes(self, task_ids: list[str]) -> dict[str, dict]:
        """The routes of these tasks that exist: task id -> {"k", "i", "f", "n"}."""
        return routes_of(self.r, task_ids)

    # --- cancels -----------------------------------------------------------------------
    def cancel(self, task_ids: list[str]) -> None:
        """Routed tasks: to their agent, audited here. The others may be in a lane: to every
        agent with one (an agent drops ids it does not hold; one that holds the task audits
        the cancel through its copies)."""
        routes = self._routes(task_ids)
        unrouted = [tid for tid in task_ids if tid not in routes]
        if unrouted and self.lane_routes is not None:  # in a lane, not read yet: read the lanes now
            try:
                self.lane_routes.catch_up()
                routes.update(self._routes(unrouted))
                unrouted = [tid for tid in unrouted if tid not in routes]
            except Exception as exc:  # noqa: BLE001 - the service's Redis restarting: to every lane agent
                log.warning("cannot read the lanes before a cancel (%s)", exc)
        if unrouted:  # still unknown (not sent yet, or ended already): every running agent with a lane
            body = ControlMessage(cancel=unrouted).model_dump_json().encode()
            with self.agents.lock:
                lane_agents = [ua for ua in self.agents.agents.values() if ua.lane is not None and ua.alive()]
            for ua in lane_agents:
                ua.queues["control"].send([body])
        by_agent: dict[str, list[str]] = {}
        for tid, route in routes.items():
            by_agent.setdefault(route["k"], []).append(tid)
        now = time.time()
        for key, ids in by_agent.items():
            ua = self.agents.by_prefix(key)
            if ua is None:
                continue
            ua.queues["control"].send([ControlMessage(cancel=ids).model_dump_json().encode()])
            # the service has ended them CANCELLED; a result the agent may still send is not forwarded
            self._audit(ua, [TaskResult(task_id=tid, state="FAILED", events=[("CANCELLED", now)]) for tid in ids],
                        routes, outcome="CANCELLED")

    # --- results out -------------------------------------------------------------------
    def ensure_forwarder(self, ua: UserAgent) -> None:
        t = self._forwarders.get(ua.key)
        if t is not None and t.is_alive():
            return
        t = threading.Thread(target=self._forward, args=(ua,), name=f"skyfn-mu-results-{ua.key}", daemon=True)
        self._forwarders[ua.key] = t
        t.start()

    def _forward(self, ua: UserAgent) -> None:
        """The forwarder of one user agent, while it runs (the endpoint's supervision and the
        router start one for a running agent that has none): it ends once the agent has
        stopped and its stream is empty, so stopped agents cost no reads."""
        results_queue = self.open_results_queue()
        stream = ua.queues["results"]
        delay, poll = 0.2, AUDIT_POLL_S
        try:
            while not self._halt.is_set():
                if self.agents.by_prefix(ua.key) is not ua:
                    return  # stopped idle and forgotten: a new agent gets a new forwarder
                try:
                    if ua.lane is not None:  # audit copies only: read in batches, off the tasks' way
                        messages = stream.receive(max_messages=500, wait_seconds=0)
                        if not messages:
                            if self._stopped_and_drained(ua, stream):
                                return
                            self._halt.wait(poll)
                            poll = min(AUDIT_POLL_IDLE_S, poll * 2)  # an idle agent's copies: read less often
                            continue
                        poll = AUDIT_POLL_S
                    else:
                        messages = stream.receive(max_messages=50, wait_seconds=0.5)
                    delay = 0.2
                except Exception as exc:  # noqa: BLE001 - the router's Redis restarting
                    log.warning("cannot read the results of %s (%s); retrying", ua.key, exc)
                    self._halt.wait(delay)
                    delay = min(5.0, delay * 2)
                    continue
                if not messages:
                    if self._stopped_and_drained(ua, stream):
                        return
                    continue
                copies = [m for m in messages if m.body.startswith(AUDIT_HEAD)]
                if copies:
                    self.audit_copies(ua, copies, stream)
                if len(copies) < len(messages):
                    self.forward_messages(ua, [m for m in messages if not m.body.startswith(AUDIT_HEAD)],
                                          results_queue, stream)
        finally:
            results_queue.close()

    @staticmethod
    def _stopped_and_drained(ua: UserAgent, stream: TaskQueue) -> bool:
        """The agent has stopped (not stopping: its last copies may still come) and left nothing
        in its stream (read after it stopped, so nothing it wrote is missed)."""
        return not ua.stopping and not ua.alive() and stream.depth() == 0

    def forward_messages(self, ua: UserAgent, messages: list, results_queue: TaskQueue, stream: TaskQueue) -> None:
        """Send what these result messages of `ua` may say to the service, audit, then delete them."""
        packs = []
        for m in messages:
            try:
                packs.append(ResultPack.model_validate_json(m.body))
            except ValueError as exc:
                log.error("user agent %s sent a body that is not a ResultPack (%s); dropped", ua.key, exc)
        ids = sorted({r.task_id for p in packs for r in p.results} | {u.task_id for p in packs for u in p.updates})
        routes = self._routes(ids)
        mine = {tid: route for tid, route in routes.items() if route["k"] == ua.key}
        bodies, finals = [], []
        for p in packs:
            results = [r for r in p.results if r.task_id in mine]
            updates = [u for u in p.updates if u.task_id in mine]
            dropped = len(p.results) + len(p.updates) - len(results) - len(updates)
            if dropped:
                self.dropped_results += dropped
                log.warning("user agent %s reported on %d task(s) not routed to it: dropped", ua.key, dropped)
            if results or updates:
                bodies.append(ResultPack(endpoint_id=self.endpoint_id, results=results, updates=updates)
                              .model_dump_json(exclude_none=True).encode())
            finals.extend(r for r in results if r.state in FINAL)
        delay = 0.1
        while bodies:
            try:
                results_queue.send(bodies)
                break
            except Exception as exc:  # noqa: BLE001 - the service's queue is down: retry, never drop
                if self._halt.is_set() and delay > 2.0:
                    return  # stopping: the stream keeps them for the next run
                log.warning("sending results of %s failed (%s); retrying in %.1f s", ua.key, exc, delay)
                time.sleep(delay)
                delay = min(10.0, delay * 2)
        self._audit(ua, finals, mine)
        stream.delete([m.receipt for m in messages])
        self.forwarded_results += len(finals)
        ua.last_active = time.monotonic()

    def audit_copies(self, ua: UserAgent, messages: list, stream: TaskQueue) -> None:
        """Judge the audit copies a lane's user agent sent (multiuser/audit_copies.py): those that
        fit the routing record wait for the service's final state, the rest are disagreements;
        then delete them from its stream."""
        copies, bad = parse([m.body for m in messages])
        if bad:
            log.error("user agent %s sent %d audit message(s) that do not parse; dropped", ua.key, bad)
        self.copies.take(ua, copies)  # their lines: once the service confirms (audit_confirm.py)
        stream.delete([m.receipt for m in messages])
        ua.last_active = time.monotonic()

    def _audit(self, ua: UserAgent, finals: list[TaskResult], routes: dict[str, dict],
               outcome: Optional[str] = None) -> None:
        """Lines of tasks the router routed, from their routes (the agent's result gives the
        outcome, times and reason; `outcome` overrides the state, as for a cancel)."""
        lines = []
        for r in finals:
            start, end = times_of(r.events)
            lines.append((r.task_id, routes[r.task_id], start, end, outcome or r.state, r.reason))
        write_lines(self.r, self.audit, ua, lines)

    def fail_tasks(self, ua: UserAgent, reason: str) -> None:
        """End every task waiting in `ua`'s task stream or lane FAILED with `reason` (it cannot start)."""
        stream = ua.tasks
        while True:
            messages = stream.receive(max_messages=50, wait_seconds=0)
            if not messages:
                return
            now = time.time()
            results, lines = [], []
            for m in messages:
                try:
                    pack = TaskPack.model_validate_json(m.body)
                except ValueError:
                    continue
                identity = pack.identity.model_dump() if pack.identity is not None else {"id": pack.owner}
                for t in pack.tasks:
                    results.append(TaskResult(task_id=t.task_id, state="FAILED", reason=reason,
                                              events=[("FAILED", now)]))
                    lines.append(dict(identity=identity, account=ua.account.name, uid=ua.account.uid,
                                      function_id=t.function_id,
                                      function_name=(pack.function_meta.get(t.function_id) or {}).get("name"),
                                      task_id=t.task_id, start=None, end=now, outcome="FAILED", reason=reason))
            write_unrouted(self.r, self.audit, ua.key, lines)
            body = ResultPack(endpoint_id=self.endpoint_id, results=results).model_dump_json().encode()
            ids = [r.task_id for r in results]
            self.outbox.put(bodies=[body])
            if ids:
                self.r.hdel(ROUTES, *ids)
            stream.delete([m.receipt for m in messages])

    def drain(self, timeout: float) -> None:
        """Wait (bounded) until the user agents' results streams are empty, then stop forwarding."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(ua.queues["results"].depth() == 0 for ua in list(self.agents.agents.values())):
                break
            time.sleep(0.1)
        self._halt.set()
        for t in list(self._forwarders.values()):
            t.join(5)
        self.copies.confirmer.stop()

    def stats(self) -> dict[str, Any]:
        return {"routed": self.routed, "refused": self.refused, "forwarded_results": self.forwarded_results,
                "dropped_results": self.dropped_results, "audit_copies_disagreeing": self.copies.disagreements,
                "audit_lines_unconfirmed": self.copies.confirmer.unconfirmed}
