"""The audit line of a lane's task, written from the service's final state.

A lane's user agent copies each task's outcome to the router (multiuser/lane.py); a copy that
fits the routing record (audit_copies.py) is only a *claim* of that outcome. It waits here, in
the router's Redis (a restart goes on where it was), and the privileged process asks the
service -- with the endpoint's own credential, POST /endpoints/{id}/task-states
(skyfn.protocol.task_states) -- the state of the tasks waiting, in batches of at most
MAX_TASK_STATES, at most one call each ASK_EVERY_S; a task not final yet is asked again
later (after as long as it has waited, at most ASK_AGAIN_S), so copies of tasks that run
long (an agent may send them early) never hold back the lines of others:

- final at the service: the task's line is written with the service's outcome, times and
  reason (identity, function, account from the routing record, as always); every copy that
  reported another outcome is logged as a disagreement. A copy never decides a line: the
  first one only makes the router ask.
- not final, or unknown to the service, after WAIT_S (or the service cannot be asked): the
  line is written with outcome UNCONFIRMED and a reason naming why (the service's state, or
  the error) and what the agent reported. The route is kept: a later copy, once the service's
  state is final, still writes the task's true line -- an UNCONFIRMED line blocks nothing.
  A task gets one UNCONFIRMED line at most; a later timeout of a copy is a disagreement.

Keys (the privileged process's alone; user agents' logins reach none):
- PENDING  hash task id -> {"k": agent key, "a": account, "u": uid, "c": {outcome: reason},
           "t": when its first copy came (epoch seconds)}
- WAITING  zset task id -> when to ask the service about it next (epoch seconds)
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable, NamedTuple, Optional

from endpoint_agent.multiuser.audit import AuditLog
from endpoint_agent.multiuser.routes import UNCONFIRMED, audited_of, routes_of, write_lines
from skyfn.protocol.task_states import MAX_TASK_STATES, UNKNOWN, TaskStateOf

log = logging.getLogger("skyfn.multiuser.audit")

PENDING = "mu:pending"
WAITING = "mu:waiting"
ASK_EVERY_S = 1.0
ASK_AGAIN_S = 5.0
WAIT_S = 120.0
FINAL = ("SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED")

Ask = Callable[[list[str]], dict[str, TaskStateOf]]  # task ids -> the service's answer


class _Account(NamedTuple):
    name: str
    uid: int


class _Agent(NamedTuple):  # what a line and a disagreement need of the agent a task was routed to
    key: str
    account: _Account


class Confirmer:
    """Keeps the copies waiting and writes their lines (see the module docstring). `lock` is
    the judge's: a copy is judged and kept, and a line written, one at a time."""

    def __init__(self, router_client, audit: AuditLog, ask: Optional[Ask], lock: threading.Lock,
                 disagree: Callable[[object, dict, str], None]):
        self.r = router_client
        self.audit = audit
        self.ask = ask
        self.lock = lock
        self.disagree = disagree  # (agent, claim, reason): the judge's disagreement line
        self.confirmed = 0
        self.unconfirmed = 0
        self._thread: Optional[threading.Thread] = None

    def keep(self, ua, claims: list[tuple[str, str, Optional[str]]]) -> None:
        """Keep (task id, outcome, reason) of `ua`'s copies until the service's state is known.
        Called under the lock."""
        if not claims:
            return
        ids = sorted({tid for tid, _, _ in claims})
        now = time.time()
        entries = {tid: json.loads(raw) if raw else {"k": ua.key, "a": ua.account.name, "u": ua.account.uid, "c": {},
                                                     "t": now}
                   for tid, raw in zip(ids, self.r.hmget(PENDING, ids))}
        for tid, outcome, reason in claims:
            entries[tid]["c"].setdefault(outcome, reason)  # the same outcome again: a task run again
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(PENDING, mapping={tid: json.dumps(e) for tid, e in entries.items()})
        pipe.zadd(WAITING, {tid: now for tid in ids}, nx=True)
        pipe.execute()

    def waiting(self) -> int:
        return self.r.zcard(WAITING)

    def round(self) -> int:
        """Ask the service about the copies due and write what can be written; how many tasks
        were settled (a line written, or dropped)."""
        due = self.r.zrangebyscore(WAITING, "-inf", time.time(), start=0, num=MAX_TASK_STATES)
        if not due:
            return 0
        ids = [tid.decode() if isinstance(tid, bytes) else tid for tid in due]
        try:
            if self.ask is None:
                raise RuntimeError("the endpoint has no service link to ask")
            answer, error = self.ask(ids), None
        except Exception as exc:  # noqa: BLE001 - the service down: asked again next round, bounded by WAIT_S
            answer, error = {}, f"the service could not be asked ({exc})"
            log.warning("cannot ask the service the states of %d audited task(s): %s", len(ids), exc)
        now = time.time()
        with self.lock:
            raws = dict(zip(ids, self.r.hmget(PENDING, ids)))
            unconfirmed_before = {tid for tid, (_, outcome) in audited_of(self.r, ids).items()
                                  if outcome == UNCONFIRMED}
            routes = routes_of(self.r, ids)
            settled, later, final_lines, open_lines = [], {}, {}, {}
            for tid in ids:
                raw = raws.get(tid)
                if raw is None or tid not in routes:  # nothing to write it from any more
                    settled.append(tid)
                    continue
                entry = json.loads(raw)
                ua = _Agent(entry["k"], _Account(entry["a"], entry["u"]))
                claims: dict[str, Optional[str]] = entry["c"]
                got = answer.get(tid)
                state = got.state if got is not None else None
                if state in FINAL:
                    for claimed in sorted(set(claims) - {state}):
                        self.disagree(ua, {"task_id": tid, "state": claimed, "reason": claims[claimed]},
                                      f"the service's final state of task {tid} is {state}; this copy reports "
                                      f"{claimed}")
                    final_lines.setdefault(ua, []).append((tid, routes[tid], got.start, got.end, state, got.reason))
                elif now - entry["t"] >= WAIT_S:
                    why = error or (f"the service does not know task {tid} as one of this endpoint's" if
                                    state in (None, UNKNOWN) else f"the service's state of task {tid} is {state}")
                    reported = ", ".join(sorted(claims))
                    if tid in unconfirmed_before:
                        for claimed in sorted(claims):
                            self.disagree(ua, {"task_id": tid, "state": claimed, "reason": claims[claimed]},
                                          f"{why} after {WAIT_S:.0f} s; this copy reports {claimed}")
                    else:
                        open_lines.setdefault(ua, []).append(
                            (tid, routes[tid], None, None, UNCONFIRMED,
                             f"{why} after {WAIT_S:.0f} s; the user agent reported {reported}"))
                else:
                    # not final yet: soon for a copy just ahead of its result, seldom for a long task's
                    later[tid] = now + min(ASK_AGAIN_S, max(ASK_EVERY_S, now - entry["t"]))
                    continue
                settled.append(tid)
            for ua, lines in final_lines.items():
                self.confirmed += write_lines(self.r, self.audit, ua, lines)
            for ua, lines in open_lines.items():
                self.unconfirmed += write_lines(self.r, self.audit, ua, lines, keep_routes=True)
            pipe = self.r.pipeline(transaction=False)
            if settled:
                pipe.hdel(PENDING, *settled)
                pipe.zrem(WAITING, *settled)
            if later:
                pipe.zadd(WAITING, later, xx=True)
            pipe.execute()
        return len(settled)

    # --- the thread ------------------------------------------------------------------------
    def start(self, halt: threading.Event) -> "Confirmer":
        self._thread = threading.Thread(target=self._run, args=(halt,), name="skyfn-mu-audit-confirm", daemon=True)
        self._thread.start()
        return self

    def _run(self, halt: threading.Event) -> None:
        while not halt.wait(ASK_EVERY_S):
            try:
                self.round()
            except Exception:  # noqa: BLE001 - the router's Redis restarting: next round
                log.exception("confirming audit copies failed; again in %.1f s", ASK_EVERY_S)

    def stop(self) -> None:
        """After the router's halt is set: one last round (what the service has settled is
        written now; the rest waits in the router's Redis for the next start)."""
        if self._thread is not None:
            self._thread.join(ASK_EVERY_S + 15)
        try:
            self.round()
        except Exception as exc:  # noqa: BLE001
            log.warning("audit copies left waiting for the next start: %s", exc)
