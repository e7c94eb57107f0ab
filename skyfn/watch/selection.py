"""Which tasks `skyfn task watch` watches, and what they are at the start.

Task ids come from the command line, from a file or stdin (one a line), and/or from
`--since` (your tasks created since then: GET /tasks, as `skyfn report` lists them),
optionally of one endpoint. The first read is one POST /tasks/status per 20,000 ids with
the tasks' events, a peek without results (watching consumes nothing); ids the service does not know as yours are refused by name. Each task's
endpoint comes from the GET /tasks listing (POST /tasks/status does not carry it).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any, Iterable, Optional

from skyfn.protocol.limits import MAX_STATUS_IDS
from skyfn.report.since import parse_since

MAX_LIST = 20_000  # GET /tasks answers at most this many (lambdas/core/tasks/task_list.py)
UNKNOWN_ENDPOINT = "?"


class WatchError(ValueError):
    """Bad input: the message names the problem and the fix."""


@dataclass
class Selection:
    """The watched tasks: each id's endpoint label, the first statuses, the status cursor."""
    endpoints: dict[str, str]
    statuses: dict[str, dict[str, Any]]
    cursor: Optional[str]
    origin: float
    notes: list[str] = field(default_factory=list)


def read_ids(args: Iterable[str], path: Optional[str], stdin: Optional[IO[str]] = None) -> list[str]:
    """Ids from the arguments, then from `path` ('-': stdin): one a line, blank lines and
    '#' comments skipped, duplicates dropped."""
    ids = [a.strip() for a in args or () if a.strip()]
    if path is not None:
        if path == "-":
            text = (stdin or sys.stdin).read()
        else:
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except FileNotFoundError:
                raise WatchError(f"--file {path}: no such file (give a file of task ids, one a line, "
                                 "or '-' for stdin)") from None
            except (OSError, UnicodeDecodeError) as exc:
                raise WatchError(f"--file {path}: cannot read it ({exc.__class__.__name__}): give a text "
                                 "file of task ids, one a line") from None
        from_file = [ln.strip() for ln in text.splitlines()]
        from_file = [ln for ln in from_file if ln and not ln.startswith("#")]
        if not from_file:
            where = "stdin" if path == "-" else path
            raise WatchError(f"no task ids in {where}: it should hold one task id a line")
        ids += from_file
    return list(dict.fromkeys(ids))


def since_time(since: str) -> float:
    try:
        return parse_since(since)
    except ValueError:
        raise WatchError(f"--since {since!r}: use an age like 90s, 10m, 2h, 1d, epoch seconds "
                         "or an ISO 8601 time (2024-05-01T12:00:00Z)") from None


def check(ids: list[str], since: Optional[str], once: bool = False, as_json: bool = False) -> None:
    """Refuse bad input before anything is asked of the service."""
    if not ids and since is None:
        raise WatchError("nothing to watch: give task ids, --file FILE (one id a line, '-' for stdin) "
                         "or --since 10m (your recent tasks)")
    if since is not None:
        since_time(since)
    if as_json and not once:
        raise WatchError("--json prints one snapshot: add --once (or drop --json for the live view)")


def select(client, ids: list[str], since: Optional[str], endpoint: Optional[str]) -> Selection:
    """Resolve the watched set and read it once (see the module docstring)."""
    check(ids, since)
    start = since_time(since) if since is not None else None
    endpoint_id = _endpoint_id(client, endpoint) if endpoint else None
    notes: list[str] = []
    listed: dict[str, dict] = {}
    if start is not None:
        tasks = client.tasks(since=start, endpoint_id=endpoint_id, limit=MAX_LIST)
        if len(tasks) >= MAX_LIST:
            notes.append(f"watching the newest {MAX_LIST:,} of your tasks since --since {since}")
        listed = {t["task_id"]: t for t in tasks}
        if not listed and not ids:
            on = f" on endpoint {endpoint}" if endpoint else ""
            raise WatchError(f"no tasks of yours created since --since {since}{on}: widen --since "
                             "(e.g. --since 1h) or give task ids")
    watched = list(dict.fromkeys([*ids, *listed]))
    statuses, cursor = _first_read(client, watched)
    created = {tid: _created(st) for tid, st in statuses.items()}
    missing = [tid for tid in watched if tid not in listed]
    if missing:  # given ids: their endpoints, from one listing reaching back to the oldest
        oldest = min((created[t] for t in missing if created[t] is not None), default=None)
        if oldest is not None:
            for t in client.tasks(since=max(0.0, oldest - 1.0), limit=MAX_LIST):
                if t["task_id"] in statuses:
                    listed.setdefault(t["task_id"], t)
    if endpoint_id is not None:
        watched = [tid for tid in watched if (listed.get(tid) or {}).get("endpoint_id") == endpoint_id]
        if not watched:
            raise WatchError(f"none of the {len(statuses)} given tasks is on endpoint {endpoint}: "
                             "drop --endpoint or give that endpoint's tasks")
    names = {e["endpoint_id"]: e.get("name") or e["endpoint_id"] for e in client.list_endpoints()}
    endpoints = {}
    for tid in watched:
        eid = (listed.get(tid) or {}).get("endpoint_id")
        endpoints[tid] = names.get(eid, eid) if eid else UNKNOWN_ENDPOINT
    known = [created[tid] if created[tid] is not None else (listed.get(tid) or {}).get("created")
             for tid in watched]
    origin = min((float(c) for c in known if c is not None), default=time.time())
    return Selection(endpoints, {tid: statuses[tid] for tid in watched}, cursor, origin, notes)


def _endpoint_id(client, endpoint: str) -> str:
    from skyfn.client import EndpointNotFound

    try:
        return client.endpoint_id(endpoint)
    except EndpointNotFound as exc:
        raise WatchError(f"--endpoint {endpoint}: {exc}") from None


def _first_read(client, ids: list[str]) -> tuple[dict[str, dict], Optional[str]]:
    statuses: dict[str, dict] = {}
    unknown: list[str] = []
    cursors = []
    ask = list(ids)
    while ask:
        answer = client.status(ask[:MAX_STATUS_IDS], include_events=True, peek=True, results=False)
        statuses.update(answer.get("tasks") or {})
        unknown += answer.get("unknown") or []
        cursors.append(answer.get("cursor"))
        ask = (answer.get("later") or []) + ask[MAX_STATUS_IDS:]  # `later`: read from the history in parts
    named = set(unknown)
    unknown += [tid for tid in ids if tid not in statuses and tid not in named]
    if unknown:
        raise WatchError(_unknown_message(unknown))
    cursors = [c for c in cursors if c]
    # several reads: the earliest position, so nothing finished between them is skipped
    return statuses, min(cursors, key=_cursor_key) if cursors else None


def _unknown_message(unknown: list[str]) -> str:
    shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
    files = [u for u in unknown if os.path.isfile(u)]
    if files:
        return f"unknown task id {files[0]!r}: it is a file; pass it as --file {files[0]}"
    return (f"unknown task id{'s' if len(unknown) > 1 else ''}: {shown} (no task of yours has "
            f"{'these ids' if len(unknown) > 1 else 'this id'}: check the ids, or select with --since 10m)")


def _created(status: dict) -> Optional[float]:
    for state, ts in status.get("events") or ():
        if state == "CREATED":
            return float(ts)
    return None


def _cursor_key(cursor: str):
    from skyfn.protocol.push import cursor_key

    return cursor_key(cursor)
