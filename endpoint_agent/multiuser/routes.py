"""The routing record of a multi-user endpoint, in the router's Redis (keys only the privileged
process's login reaches), and the audit lines written from it.

A task's route -- which user agent it went to, who submitted it, its function -- is written by
the privileged process when it routes a pack itself (router.py) or reads one the service put in
a lane (lane_routes.py); never from what a user agent says. Audit lines take identity, account,
uid, function and task from the route; the outcome, times and reason of a lane's task come
from the service's final state (audit_confirm.py): a user agent only reports it, and a
report that disagrees is logged as a disagreement.

Keys:
- ROUTES      hash task id -> {"k": user agent key, "i": identity id, "f": function id, "n": name}
- IDENTITIES  hash identity id -> its claims (id, username, email, identity_provider), as the
              service sent them with the task
- AUDITED<id> "<user agent key> <outcome>" once the task's line is written (AUDITED_TTL_S; the
              key is REFUSED_BY for a refused task): a
              copy of a task run again after a kill is recognised, a different outcome is a
              disagreement (UNCONFIRMED: the route is kept; the confirmed line may follow)
"""
from __future__ import annotations

import json
import logging
import math
import time
from typing import Any, Iterable, Optional

from endpoint_agent.multiuser.audit import AuditLog

ROUTES = "mu:routes"
IDENTITIES = "mu:identities"
AUDITED = "mu:audited:"
AUDITED_TTL_S = 7 * 24 * 3600
MAX_REASON = 2000  # characters of a user agent's reason kept in a line
UNCONFIRMED = "UNCONFIRMED"  # the outcome of a line a confirmed one may follow (audit_confirm.py)
REFUSED_BY = "router"  # the mark's key of a refused task: no user agent had it

log = logging.getLogger("skyfn.multiuser.audit")


def route_value(ua_key: str, identity_id: str, function_id: str, name: Optional[str]) -> str:
    return json.dumps({"k": ua_key, "i": identity_id, "f": function_id, "n": name})


def routes_of(r, task_ids: Iterable[str]) -> dict[str, dict]:
    """The routes of these tasks that exist: task id -> {"k", "i", "f", "n"}."""
    ids = list(task_ids)
    if not ids:
        return {}
    return {tid: json.loads(raw) for tid, raw in zip(ids, r.hmget(ROUTES, ids)) if raw is not None}


def audited_of(r, task_ids: list[str]) -> dict[str, tuple[str, str]]:
    """task id -> (user agent key, outcome) of those already written."""
    if not task_ids:
        return {}
    pipe = r.pipeline(transaction=False)
    for tid in task_ids:
        pipe.get(AUDITED + tid)
    out = {}
    for tid, raw in zip(task_ids, pipe.execute()):
        if raw is not None:
            key, _, outcome = (raw.decode() if isinstance(raw, bytes) else raw).partition(" ")
            out[tid] = (key, outcome)
    return out


def claims_of(r, identity_ids: Iterable[str]) -> dict[str, dict]:
    """identity id -> the claims the service sent (just the id when none were kept)."""
    ids = sorted(set(identity_ids))
    raws = r.hmget(IDENTITIES, ids) if ids else []
    return {i: (json.loads(raw) if raw else {"id": i}) for i, raw in zip(ids, raws)}


def times_of(events: Any) -> tuple[Optional[float], Optional[float]]:
    """(start, end) from [(state, timestamp), ...]; what is not a finite number is ignored."""
    stamps: dict[str, float] = {}
    ends = []
    for e in events or ():
        if isinstance(e, (list, tuple)) and len(e) == 2 and isinstance(e[0], str) \
                and isinstance(e[1], (int, float)) and not isinstance(e[1], bool) and math.isfinite(e[1]) \
                and 0 < e[1] < 1e11:
            stamps[e[0]] = float(e[1])
            ends.append(float(e[1]))
    return stamps.get("RUNNING") or stamps.get("DISPATCHED"), max(ends, default=None)


def write_lines(r, audit: AuditLog, ua, items: list[tuple[str, dict, Optional[float], Optional[float], str,
                                                           Optional[str]]], keep_routes: bool = False) -> int:
    """One audit line per (task id, route, start, end, outcome, reason): identity, function and
    task from the route, account and uid from `ua` (the agent the route names); then the task is
    marked audited and its route removed (kept with `keep_routes`: an UNCONFIRMED line, which a
    confirmed one may follow). A task whose final line is written already gets no second one,
    whatever path brought it here again (a pack sent again after a kill and run again, a route
    read again from a lane, a copy read again from the stream): an audit line is once per task.
    Returns how many lines were written."""
    if not items:
        return 0
    claims = claims_of(r, (route["i"] for _, route, *_ in items))
    records = [dict(identity=claims[route["i"]], account=ua.account.name, uid=ua.account.uid, function_id=route["f"],
                    function_name=route.get("n"), task_id=tid, start=start,
                    end=end if end is not None else time.time(), outcome=outcome,
                    reason=reason[:MAX_REASON] + "..." if isinstance(reason, str) and len(reason) > MAX_REASON
                    else reason)
               for tid, route, start, end, outcome, reason in items]
    return _write_once(r, audit, ua.key, records, forget=() if keep_routes else [item[0] for item in items])


def write_unrouted(r, audit: AuditLog, key: str, records: list[dict]) -> int:
    """Lines of tasks the router ends without a route (a refused pack, the tasks of an agent
    that cannot start): each dict is AuditLog.record's keywords. Once per task, as
    write_lines: a pack sent again after a kill is refused again, not audited again. `key`
    names who ended them in the mark (the user agent's key, or REFUSED_BY). Returns how many
    lines were written."""
    return _write_once(r, audit, key, records)


def _write_once(r, audit: AuditLog, key: str, records: list[dict], forget: Iterable[str] = ()) -> int:
    """Write the records (AuditLog.record's keywords) of tasks without a line yet, mark them
    audited by `key`, and remove the routes of `forget`, in one round trip after the marks' read."""
    if not records:
        return 0
    written = audited_of(r, [rec["task_id"] for rec in records])
    fresh = [rec for rec in records if _may_write(written.get(rec["task_id"]), rec["outcome"])]
    if len(fresh) < len(records):
        log.info("%d task(s) already audited: no second line", len(records) - len(fresh))
    pipe = r.pipeline(transaction=False)
    for rec in fresh:
        audit.record(**rec)
        pipe.set(AUDITED + rec["task_id"], f"{key} {rec['outcome']}", ex=AUDITED_TTL_S)
    forget = list(forget)
    if forget:
        pipe.hdel(ROUTES, *forget)
    pipe.execute()
    return len(fresh)


def _may_write(written: Optional[tuple[str, str]], outcome: str) -> bool:
    """A line may be written where none is, or a final one after an UNCONFIRMED one."""
    return written is None or (written[1] == UNCONFIRMED and outcome != UNCONFIRMED)
