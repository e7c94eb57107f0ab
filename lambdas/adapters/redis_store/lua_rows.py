"""The rows that cross between the service's Python and its Lua scripts, with names.

Each row is a NamedTuple: Python builds it by field name and sends it as a JSON list (a
tuple's order); a script that declares `-- row: <Name>` gets `local <Name> = {field = index}`
from the same field order (lua_files.py) and reads `r[<Name>.field]`. A field added, removed
or moved on one side moves on both; tests/unit/test_lua_headers.py fails on a script reading
a field its row does not have.

Every row type is listed in ROWS by the name scripts use.
"""
from __future__ import annotations

from typing import NamedTuple

import orjson


ROWS: dict[str, type] = {}


def row(cls: type) -> type:
    """Register a NamedTuple as a row scripts may declare."""
    ROWS[cls.__name__] = cls
    return cls


def encode(rows) -> bytes:
    """Rows as the JSON list of lists a script decodes (orjson writes a NamedTuple only
    through `default`)."""
    return orjson.dumps(rows, default=tuple)


# --- task graphs (graph.py; lua/wait.lua, settle.lua, release_take.lua) ----------------

@row
class WaitRow(NamedTuple):
    """A task with inputs, to store WAITING (wait.lua; built by lambdas/core/tasks/dataflow.py)."""
    task_id: str
    function_id: str
    endpoint_id: str
    max_retries: int
    tag: str | None
    inputs: list[str]      # its input task ids, in placeholder order; an input may be an earlier row
    pack: str              # JSON: what its pack needs once released, never parsed in Lua
    parkable: bool         # its endpoint's agent releases parked dependents


@row
class EndedRow(NamedTuple):
    """A dependent a graph script ended (an input failed, was cancelled or is gone)."""
    task_id: str
    state: str
    reason: str
    error: str | None


@row
class NoticeRow(NamedTuple):
    """An owner's completion-stream entry a graph script wrote (_announce.lua): its cursor,
    the entry before it, and the EndedRow rows it announces."""
    owner: str
    prev: str
    cursor: str
    ended: list


@row
class ReleasedRow(NamedTuple):
    """A released task taken to send (release_take.lua)."""
    task_id: str
    owner: str
    endpoint_id: str | None
    pack: str              # JSON, as stored by wait.lua
    inputs: str            # csv of its input task ids
    results: list          # each input's result, None when gone (or, parked, not SUCCEEDED yet)
    parked: int            # 1: sent ahead of its inputs, for its agent to release


# --- rows sent to the task store's scripts (lambdas/adapters/redis_store/store.py) -----------

@row
class CreateRow(NamedTuple):
    """A task created QUEUED (create.lua). An empty endpoint_id: routed nowhere yet."""
    task_id: str
    function_id: str
    endpoint_id: str
    max_retries: int
    tag: str | None = None        # the function's tag: its count in load:<endpoint> ('_' without)
    memo_key: str | None = None   # caches its result under memo:<owner>:<key> when it SUCCEEDS


@row
class MemoHitRow(NamedTuple):
    """A task answered from the memo cache, created SUCCEEDED (memo_hit.lua)."""
    task_id: str
    function_id: str
    endpoint_id: str
    result: str
    memo_key: str
    tag: str | None = None


@row
class FinishRow(NamedTuple):
    """A final state for a task (finish.lua): from its agent, or the service's own failure."""
    task_id: str
    state: str
    result: str | None = None
    error: str | None = None
    reason: str | None = None
    events: str = ""              # the agent's events, 'STATE@ts;...'
    stdout: str | None = None
    stderr: str | None = None


@row
class ProgressRow(NamedTuple):
    """A task's progress from its agent (progress.lua): DISPATCHED, RUNNING or LEASE."""
    task_id: str
    state: str
    ts: float
    lease_seconds: float


@row
class DirectRow(NamedTuple):
    """A task of a direct session, created final (direct.lua)."""
    task_id: str
    session: str
    function_id: str
    state: str
    result: str | None
    error: str | None
    reason: str | None
    events: str                   # 'STATE@ts;...' from CREATED on, without the final state
    stdout: str | None
    stderr: str | None
    created: str                  # the created time, '%.6f'


# --- rows the task store's scripts return ----------------------------------------------------

@row
class DoneNotice(NamedTuple):
    """A completion-stream entry a script added (done:<owner>): the results push's Notice."""
    owner: str
    prev: str                     # the entry before it
    cursor: str                   # its own id
    ids: str                      # the task ids, comma-separated


@row
class ExpiredNotice(NamedTuple):
    """DoneNotice of tasks failed past their retry budget (expire.lua), with each one's reason."""
    owner: str
    prev: str
    cursor: str
    ids: str
    reasons: list


@row
class StatusReply(NamedTuple):
    """A task's state as status.lua reads it (false for what the record does not have)."""
    state: str
    result: str
    error: str
    reason: str
    retries: str
    events: str
    stdout: str
    stderr: str
    endpoint_id: str
    result_by: str


@row
class CancelReply(NamedTuple):
    """What cancel.lua did: 'OK' (cancelled, now or before) or the final state it found."""
    outcome: str
    endpoint_id: str              # the task's endpoint when cancelled (false otherwise)
    prev: str | None = None       # the completion-stream entry, only when cancelled now
    cursor: str | None = None
