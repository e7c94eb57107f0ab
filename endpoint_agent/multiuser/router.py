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
sealed: the router sees neither. The agent copies what the audit log needs to its results
stream (multiuser/lane.py); the forwarder writes those lines, one per task. Cancels of tasks
the router did not route go to every agent with a lane (an agent ignores ids it does not hold).
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
from endpoint_agent.multiuser.configure import MultiUserConfig
from endpoint_agent.multiuser.errors import TaskRefused
from endpoint_agent.multiuser.identity import IdentityMapper
from endpoint_agent.multiuser.templates import UserConfigTemplate
from endpoint_agent.multiuser.user_agents import ENDPOINT_KEYS, UserAgent, UserAgents
from endpoint_agent.service.outbox import Outbox
from skyfn.protocol.messages import ControlMessage, ResultPack, TaskPack, TaskResult
from skyfn.protocol.queues.base import TaskQueue
from skyfn.protocol.user_config import config_key

log = logging.getLogger("skyfn.multiuser.router")

AUDIT_HEAD = b'{"audit":'    # a lane agent's audit copies, in its results stream (multiuser/lane.py)
AUDITED = "mu:audited:"      # task id -> 1 once its audit line is written (a task run again is written once)
AUDITED_TTL_S = 7 * 24 * 3600
AUDIT_POLL_S = 0.25          # how often the audit copies of a lane's agent are read
ROUTES = "mu:routes"          # hash task id -> {"k": user agent, "i": identity id, "f": function id, "n": name}
IDENTITIES = "mu:identities"  # hash identity id -> its claims (for the audit log)
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
                 open_results_queue, router_client):
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
        self._plans: dict[str, Plan] = {}
        self._forwarders: dict[str, threading.Thread] = {}
        self._halt = threading.Event()
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
        if ua.lane_queue is not None:  # its results come back from the service: no route to keep
            self.r.hset(IDENTITIES, identity.id, identity.model_dump_json())
            ua.lane_queue.send([body])
            return
        routes = {t.task_id: json.dumps({"k": ua.key, "i": identity.id, "f": t.function_id,
                                         "n": (pack.function_meta.get(t.function_id) or {}).get("name")})
                  for t in pack.tasks}
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(ROUTES, mapping=routes)
        pipe.hset(IDENTITIES, identity.id, identity.model_dump_json())
        ua.queues["tasks"].send_on(pipe, [body])
        pipe.execute()

    def _refuse(self, receipt: str, pack: TaskPack, reason: str, account: Optional[Account],
                ack: Callable[[str], None]) -> None:
        log.warning("refused pack %s (%d task(s)): %s", pack.pack_id, len(pack.tasks), reason)
        now = time.time()
        results = [TaskResult(task_id=t.task_id, state="FAILED", reason=reason, events=[("FAILED", now)])
                   for t in pack.tasks]
        identity = pack.identity.model_dump() if pack.identity is not None else {"id": pack.owner}
        for t in pack.tasks:
            meta = pack.function_meta.get(t.function_id) or {}
            self.audit.record(identity=identity, account=account.name if account else None,
                              uid=account.uid if account else None, function_id=t.function_id,
                              function_name=meta.get("name"), task_id=t.task_id, start=None, end=now,
                              outcome="REFUSED", reason=reason)
        body = ResultPack(endpoint_id=self.endpoint_id, results=results).model_dump_json().encode()
        self.outbox.put(bodies=[body])
        ack(receipt)  # on the endpoint's queue the outbox sends the failures first, in order
        self.refused += len(pack.tasks)

    def _routes(self, task_ids: list[str]) -> dict[str, dict]:
        """The routes of these tasks that exist: task id -> {"k", "i", "f", "n"}."""
        if not task_ids:
            return {}
        return {tid: json.loads(raw) for tid, raw in zip(task_ids, self.r.hmget(ROUTES, task_ids)) if raw is not None}

    # --- cancels -----------------------------------------------------------------------
    def cancel(self, task_ids: list[str]) -> None:
        """Routed tasks: to their agent, audited here. The others may be in a lane: to every
        agent with one (an agent drops ids it does not hold; one that holds the task audits
        the cancel through its copies)."""
        routes = self._routes(task_ids)
        unrouted = [tid for tid in task_ids if tid not in routes]
        if unrouted:
            body = ControlMessage(cancel=unrouted).model_dump_json().encode()
            for ua in list(self.agents.agents.values()):
                if ua.lane is not None and ua.alive():
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
            self.r.hdel(ROUTES, *ids)

    # --- results out -------------------------------------------------------------------
    def ensure_forwarder(self, ua: UserAgent) -> None:
        t = self._forwarders.get(ua.key)
        if t is not None and t.is_alive():
            return
        t = threading.Thread(target=self._forward, args=(ua,), name=f"skyfn-mu-results-{ua.key}", daemon=True)
        self._forwarders[ua.key] = t
        t.start()

    def _forward(self, ua: UserAgent) -> None:
        results_queue = self.open_results_queue()
        stream = ua.queues["results"]
        delay = 0.2
        try:
            while not self._halt.is_set():
                if self.agents.by_prefix(ua.key) is not ua:
                    return  # stopped idle and forgotten: a new agent gets a new forwarder
                try:
                    if ua.lane is not None:  # audit copies only: read in batches, off the tasks' way
                        messages = stream.receive(max_messages=500, wait_seconds=0)
                        if not messages:
                            self._halt.wait(AUDIT_POLL_S)
                            continue
                    else:
                        messages = stream.receive(max_messages=50, wait_seconds=0.5)
                    delay = 0.2
                except Exception as exc:  # noqa: BLE001 - the router's Redis restarting
                    log.warning("cannot read the results of %s (%s); retrying", ua.key, exc)
                    self._halt.wait(delay)
                    delay = min(5.0, delay * 2)
                    continue
                if not messages:
                    continue
                copies = [m for m in messages if m.body.startswith(AUDIT_HEAD)]
                if copies:
                    self.audit_copies(ua, copies, stream)
                if len(copies) < len(messages):
                    self.forward_messages(ua, [m for m in messages if not m.body.startswith(AUDIT_HEAD)],
                                          results_queue, stream)
        finally:
            results_queue.close()

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
        if finals:
            self.r.hdel(ROUTES, *[r.task_id for r in finals])
        stream.delete([m.receipt for m in messages])
        self.forwarded_results += len(finals)
        ua.last_active = time.monotonic()

    def audit_copies(self, ua: UserAgent, messages: list, stream: TaskQueue) -> None:
        """Write the audit lines a lane's user agent copied (multiuser/lane.py): one per task,
        the first copy of a task that ran again after a kill, as the agent's account."""
        copies = []
        for m in messages:
            try:
                copies.extend(c for c in json.loads(m.body)["audit"] if isinstance(c, dict) and c.get("task_id"))
            except (ValueError, KeyError, TypeError):
                log.error("user agent %s sent an audit copy that does not parse; dropped", ua.key)
        if copies:
            pipe = self.r.pipeline(transaction=False)
            for c in copies:
                pipe.set(AUDITED + str(c["task_id"]), 1, nx=True, ex=AUDITED_TTL_S)
            firsts = pipe.execute()
            ids = sorted({str(c["identity_id"]) for c in copies if c.get("identity_id")})
            claims = dict(zip(ids, self.r.hmget(IDENTITIES, ids))) if ids else {}
            for c, first in zip(copies, firsts):
                if not first:
                    continue
                raw = claims.get(str(c.get("identity_id")))
                identity = json.loads(raw) if raw else {"id": c.get("identity_id")}
                events = [e for e in c.get("events") or [] if isinstance(e, (list, tuple)) and len(e) == 2]
                times = {state: ts for state, ts in events}
                try:
                    self.audit.record(identity=identity, account=ua.account.name, uid=ua.account.uid,
                                      function_id=c.get("function_id"), function_name=c.get("function_name"),
                                      task_id=str(c["task_id"]), start=times.get("RUNNING") or times.get("DISPATCHED"),
                                      end=max((ts for _, ts in events), default=time.time()),
                                      outcome=str(c.get("state")), reason=c.get("reason"))
                except (ValueError, TypeError) as exc:  # what the agent copied does not make a record
                    log.error("user agent %s sent an audit copy of task %s that is not valid (%s); dropped",
                              ua.key, c.get("task_id"), exc)
            self.forwarded_results += sum(1 for f in firsts if f)
        stream.delete([m.receipt for m in messages])
        ua.last_active = time.monotonic()

    def _audit(self, ua: UserAgent, finals: list[TaskResult], routes: dict[str, dict],
               outcome: Optional[str] = None) -> None:
        ids = sorted({routes[r.task_id]["i"] for r in finals})
        claims = dict(zip(ids, self.r.hmget(IDENTITIES, ids))) if ids else {}
        for r in finals:
            route = routes[r.task_id]
            raw = claims.get(route["i"])
            identity = json.loads(raw) if raw else {"id": route["i"]}
            times = {state: ts for state, ts in r.events}
            start = times.get("RUNNING") or times.get("DISPATCHED")
            end = max((ts for _, ts in r.events), default=time.time())
            self.audit.record(identity=identity, account=ua.account.name, uid=ua.account.uid,
                              function_id=route["f"], function_name=route.get("n"), task_id=r.task_id,
                              start=start, end=end, outcome=outcome or r.state, reason=r.reason)

    def fail_tasks(self, ua: UserAgent, reason: str) -> None:
        """End every task waiting in `ua`'s task stream or lane FAILED with `reason` (it cannot start)."""
        stream = ua.tasks
        while True:
            messages = stream.receive(max_messages=50, wait_seconds=0)
            if not messages:
                return
            now = time.time()
            results = []
            for m in messages:
                try:
                    pack = TaskPack.model_validate_json(m.body)
                except ValueError:
                    continue
                identity = pack.identity.model_dump() if pack.identity is not None else {"id": pack.owner}
                for t in pack.tasks:
                    results.append(TaskResult(task_id=t.task_id, state="FAILED", reason=reason,
                                              events=[("FAILED", now)]))
                    self.audit.record(identity=identity, account=ua.account.name, uid=ua.account.uid,
                                      function_id=t.function_id,
                                      function_name=(pack.function_meta.get(t.function_id) or {}).get("name"),
                                      task_id=t.task_id, start=None, end=now, outcome="FAILED", reason=reason)
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

    def stats(self) -> dict[str, Any]:
        return {"routed": self.routed, "refused": self.refused, "forwarded_results": self.forwarded_results,
                "dropped_results": self.dropped_results}
