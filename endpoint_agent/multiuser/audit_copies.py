"""The audit copies of a lane's user agent, judged against the routing record.

A user agent with a lane sends its results to the service itself and copies, to its stream in
the router's Redis, one line per final task (multiuser/lane.py). Everything it sends there is a
claim: its login can write anything to that stream. So a copy may report only the *outcome* of
a task routed to *that* agent; the line written says what the routing record says for the rest
(multiuser/routes.py: identity, function, task, and the account and uid of the agent the task
was routed to), and what the service says for the outcome: a copy that fits the record waits
until the service's state of the task is final (audit_confirm.py), and the line takes the
service's outcome, times and reason; a copy reporting another outcome is a disagreement.

A copy that does not fit the record is written as a *disagreement* (AuditLog.disagreement),
never as a task's line, and changes nothing of a task's line:
- a task that was not routed to this agent (unknown, or another user's) -- it cannot write,
  pre-empt or block another user's line, which is written only from the routing record and
  the service's state, once a copy of the agent the task was routed to (or the router itself)
  says it ended;
- another identity, function id or name than the route's;
- an outcome that is not a final state;
- an outcome other than the service's final state (audit_confirm.py), or, after the line,
  than the line's (the same outcome again is a task run again after a kill: dropped quietly).
"""
from __future__ import annotations

import json
import logging
import threading
from typing import Any, Optional

from endpoint_agent.multiuser.audit import AuditLog
from endpoint_agent.multiuser.audit_confirm import Ask, Confirmer
from endpoint_agent.multiuser.routes import REFUSED_BY, audited_of, routes_of

log = logging.getLogger("skyfn.multiuser.audit")

OUTCOMES = ("SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED")  # what a copy may report
MAX_TASK_ID = 128
CLAIMED = ("task_id", "identity_id", "function_id", "function_name", "state", "reason")


def parse(bodies: list[bytes]) -> tuple[list[dict], int]:
    """(copies, how many bodies did not parse) of audit stream messages `{"audit": [...]}`."""
    copies, bad = [], 0
    for body in bodies:
        try:
            items = json.loads(body)["audit"]
            if not isinstance(items, list):
                raise TypeError("audit is not a list")
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        copies.extend(c for c in items if isinstance(c, dict))
    return copies, bad


class CopyJudge:
    """Writes what the copies of user agents may say (see the module docstring)."""

    def __init__(self, router_client, audit: AuditLog, catch_up=None, ask: Optional[Ask] = None):
        self.r = router_client
        self.audit = audit
        self.catch_up = catch_up  # () -> int: read the lanes up to now (lane_routes.LaneRoutes.catch_up)
        self.lock = threading.Lock()
        # ask: task ids -> the service's states (ServiceLink.task_states with the endpoint's credential)
        self.confirmer = Confirmer(router_client, audit, ask, self.lock, self._disagree)
        self.disagreements = 0

    @property
    def written(self) -> int:
        return self.confirmer.confirmed + self.confirmer.unconfirmed

    def take(self, ua, copies: list[dict]) -> int:
        """Judge `ua`'s copies: those that fit the record wait for the service's final state
        (self.confirmer writes their lines), the others are disagreements. Returns how many
        copies wait."""
        valid = [c for c in copies if isinstance(c.get("task_id"), str) and 0 < len(c["task_id"]) <= MAX_TASK_ID]
        for c in copies:
            if c not in valid:
                self._disagree(ua, c, "an audit copy without a valid task id")
        ids = sorted({c["task_id"] for c in valid})
        if self.catch_up is not None and len(routes_of(self.r, ids)) < len(ids):
            try:
                self.catch_up()  # a lane's task read after its copy came: its route is there now
            except Exception as exc:  # noqa: BLE001 - the service's Redis down: judged on what is known
                log.warning("cannot read the lanes before judging audit copies of %s: %s", ua.key, exc)
        with self.lock:  # not between the confirmer's reading of a route and its line
            routes = routes_of(self.r, ids)
            audited = audited_of(self.r, [tid for tid in ids if tid not in routes])
            claims = []
            for c in valid:
                problem = self._problem(ua, c, routes.get(c["task_id"]), audited.get(c["task_id"]))
                if problem is not None:
                    if problem:
                        self._disagree(ua, c, problem)
                    continue
                reason = c.get("reason") if isinstance(c.get("reason"), str) else None
                claims.append((c["task_id"], c["state"], reason))
            self.confirmer.keep(ua, claims)
        return len(claims)

    def _problem(self, ua, c: dict, route: Optional[dict], audited: Optional[tuple[str, str]]) -> Optional[str]:
        """None: it waits for the service's state; "": drop it quietly; else the disagreement."""
        tid, state = c["task_id"], c.get("state")
        if route is None:
            if audited is None:
                return f"task {tid} was not routed to user agent {ua.key} (an unknown task, or another user's)"
            key, outcome = audited
            if key == REFUSED_BY:
                return f"task {tid} was refused by the endpoint and never ran"
            if key != ua.key:
                return f"task {tid} was routed to another user agent"
            if state == outcome:
                return ""  # a copy again (the task ran again after a kill, or two copies in one batch)
            return f"task {tid} is already audited as {outcome}; this copy reports {state!r}"
        if route["k"] != ua.key:
            return f"task {tid} was routed to another user agent"
        wrong = [f"{what} {c.get(field)!r} (the routing record says {route[rk]!r})"
                 for what, field, rk in (("identity", "identity_id", "i"), ("function", "function_id", "f"),
                                         ("function name", "function_name", "n"))
                 if c.get(field) is not None and c.get(field) != route.get(rk)]
        if wrong:
            return f"the copy of task {tid} names {', '.join(wrong)}"
        if state not in OUTCOMES:
            return f"the copy of task {tid} reports {state!r}, not one of {', '.join(OUTCOMES)}"
        return None

    def _disagree(self, ua, c: Any, reason: str) -> None:
        self.disagreements += 1
        claimed = {k: c.get(k) for k in CLAIMED} if isinstance(c, dict) else c
        log.warning("user agent %s: %s: logged as a disagreement, not as a task's line", ua.key, reason)
        self.audit.disagreement(account=ua.account.name, uid=ua.account.uid, user_agent=ua.key, reason=reason,
                                claimed=claimed)
