"""Task states, the allowed transitions between them, and timestamped events.

This is the task lifecycle of DESIGN.md section 3, shared by the service (which
enforces it with compare-and-set writes) and by the agent and SDK (which read it).
"""
from __future__ import annotations

import enum
import time
from typing import Iterable, Optional


class TaskState(str, enum.Enum):
    CREATED = "CREATED"
    WAITING = "WAITING"  # for its inputs (futures passed as arguments): skyfn.protocol.dataflow
    QUEUED = "QUEUED"
    DISPATCHED = "DISPATCHED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    CANCELLED = "CANCELLED"

    def __str__(self) -> str:  # so f-strings and JSON show the bare name
        return self.value


FINAL_STATES = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.TIMED_OUT, TaskState.CANCELLED})

# Forward edges only; QUEUED is re-entered from DISPATCHED/RUNNING when a lease expires.
TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.CREATED: frozenset({TaskState.WAITING, TaskState.QUEUED, TaskState.FAILED, TaskState.CANCELLED}),
    TaskState.WAITING: frozenset({TaskState.QUEUED, TaskState.FAILED, TaskState.CANCELLED}),
    TaskState.QUEUED: frozenset(
        {TaskState.DISPATCHED, TaskState.RUNNING, TaskState.SUCCEEDED, TaskState.FAILED, TaskState.TIMED_OUT, TaskState.CANCELLED}
    ),
    TaskState.DISPATCHED: frozenset(
        {TaskState.QUEUED, TaskState.RUNNING, TaskState.SUCCEEDED, TaskState.FAILED, TaskState.TIMED_OUT, TaskState.CANCELLED}
    ),
    TaskState.RUNNING: frozenset(
        {TaskState.QUEUED, TaskState.SUCCEEDED, TaskState.FAILED, TaskState.TIMED_OUT, TaskState.CANCELLED}
    ),
    TaskState.SUCCEEDED: frozenset(),
    TaskState.FAILED: frozenset(),
    TaskState.TIMED_OUT: frozenset(),
    TaskState.CANCELLED: frozenset(),
}

# Rank used to refuse updates that would move a task backwards (a late DISPATCHED
# report arriving after RUNNING). QUEUED after a lease expiry is the one allowed step back,
# made only by the reaper, never by an agent report.
RANK = {
    TaskState.CREATED: 0,
    TaskState.WAITING: 0.5,
    TaskState.QUEUED: 1,
    TaskState.DISPATCHED: 2,
    TaskState.RUNNING: 3,
    TaskState.SUCCEEDED: 4,
    TaskState.FAILED: 4,
    TaskState.TIMED_OUT: 4,
    TaskState.CANCELLED: 4,
}


def is_final(state: str | TaskState) -> bool:
    return TaskState(state) in FINAL_STATES


def can_transition(current: str | TaskState, new: str | TaskState) -> bool:
    return TaskState(new) in TRANSITIONS[TaskState(current)]


def now() -> float:
    """Event timestamps: seconds since the epoch, microsecond resolution."""
    return round(time.time(), 6)


def format_events(events: list[tuple[str, float]]) -> str:
    """Events are stored compactly as 'STATE@ts;STATE@ts' (append-only string)."""
    return "".join([f"{state}@{ts:.6f};" for state, ts in events])


def parse_events(text: str | None) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    for item in (text or "").split(";"):
        if item:
            state, _, ts = item.partition("@")
            out.append((state, float(ts)))
    return out


# Agent-side events (not states: the task stays DISPATCHED meanwhile) of a task whose
# GlobusFile arguments are staged in before it runs and outputs staged out after it
# (endpoint_agent/staging.py); they travel in TaskResult.events like RUNNING and DONE.
STAGING_IN, STAGED_IN, STAGING_OUT, STAGED_OUT = "STAGING_IN", "STAGED_IN", "STAGING_OUT", "STAGED_OUT"

# Stages of a task's latency breakdown, read back from its events (DESIGN.md section 2).
STAGES = (
    ("service", TaskState.CREATED, TaskState.QUEUED),
    ("waiting", TaskState.WAITING, TaskState.QUEUED),  # for inputs; taken out of "service" below
    ("queue_wait", TaskState.QUEUED, TaskState.DISPATCHED),
    ("stage_in", STAGING_IN, STAGED_IN),
    ("dispatch", TaskState.DISPATCHED, TaskState.RUNNING),
    ("run", TaskState.RUNNING, "DONE"),
    ("stage_out", STAGING_OUT, STAGED_OUT),
    ("return", "DONE", "STORED"),
)


def stage_latencies(events: list[tuple[str, float]]) -> dict[str, float]:
    """Seconds spent in each stage, from the last occurrence of each event.

    DONE is the worker's finish time and STORED the service's store time of the result;
    both are recorded as events alongside the final state.
    """
    last: dict[str, float] = {}
    for state, ts in events:
        last[str(state)] = ts
    out: dict[str, float] = {}
    for name, start, end in STAGES:
        s, e = last.get(str(start)), last.get(str(end))
        if s is not None and e is not None:
            out[name] = max(0.0, e - s)
    span = wait_span(events)  # waiting ends at the release, the first QUEUED after it (a requeue is not waiting)
    if span is not None and span[1] is not None:
        out["waiting"] = max(0.0, span[1] - span[0])
    if "waiting" in out and "service" in out:  # the service's own time is what waiting leaves of it
        out["service"] = max(0.0, out["service"] - out["waiting"])
    return out


def wait_span(events: Iterable) -> Optional[tuple[float, Optional[float]]]:
    """(WAITING, the first QUEUED after it) from a task's events: None for a task that never
    waited for inputs, end None while it still waits (or if it ended without being released)."""
    start = end = None
    for state, ts in events or ():
        if state == TaskState.WAITING.value and start is None:
            start = float(ts)
        elif state == TaskState.QUEUED.value and start is not None:
            end = float(ts)
            break
    return None if start is None else (start, end)
