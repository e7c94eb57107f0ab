"""Recording the tasks of direct sessions (skyfn.protocol.direct, step 4): the agent reports
each direct result through its results queue with its session id; the service has never
seen these tasks, so the results function creates them here, final, in one store script
for the whole pack (TaskStore.record_direct).

The owner is the session record's (lambdas/core/tasks/sessions.py), never anything the agent
says; a result whose session is unknown, expired past its grace, another endpoint's, or
does not name the function it ran is dropped and counted. A task's events start with
CREATED and QUEUED at its DISPATCHED time (it never waited in a queue of ours), then the
agent's DISPATCHED, RUNNING, DONE, then the final state and STORED, so stage breakdowns
read as for any task. Nothing is pushed: the SDK received these results from the agent.
"""
from __future__ import annotations

from typing import Sequence

from lambdas.adapters.redis_store.lua_rows import DirectRow, FinishRow
from lambdas.core import deps
from skyfn.protocol.messages import TaskResult
from skyfn.protocol.states import format_events


def _dispatched(result: TaskResult, now: float) -> float:
    for state, ts in result.events:
        if state == "DISPATCHED":
            return ts
    return result.events[0][1] if result.events else now


def rows(results: Sequence[TaskResult], outcomes: Sequence[FinishRow], now: float) -> list[DirectRow]:
    """Store rows of `results` (TaskStore.record_direct); `outcomes`, the results' rows as
    the results function checked them (FinishRow)."""
    out = []
    for r, o in zip(results, outcomes):
        at = _dispatched(r, now)
        events = f"CREATED@{at:.6f};QUEUED@{at:.6f};" + format_events(r.events)
        out.append(DirectRow(task_id=r.task_id, session=r.session, function_id=r.function_id or "", state=o.state,
                             result=o.result, error=o.error, reason=o.reason, events=events, stdout=r.stdout,
                             stderr=r.stderr, created=f"{at:.6f}"))
    return out


def record(endpoint_id: str, results: Sequence[TaskResult], outcomes: Sequence[FinishRow],
           now: float) -> tuple[int, int, int]:
    """Record direct `results` sent by `endpoint_id`'s agent: (stored, duplicates, unknown)."""
    if not results:
        return 0, 0, 0
    return deps.store().record_direct(rows(results, outcomes, now), endpoint_id)
