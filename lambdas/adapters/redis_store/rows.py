"""What the hot task store (lambdas/adapters/redis_store) returns: task rows, the notices
of tasks that became final, and the store's constants."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence


@dataclass
class TaskRow:
    task_id: str
    state: str
    result: str | None
    error: str | None
    reason: str | None
    retries: int
    events: list[tuple[str, float]] | None
    stdout: str | None = None
    stderr: str | None = None
    endpoint_id: str | None = None  # the endpoint the task was routed to
    result_by: str | None = None    # the endpoint whose agent produced its result or error


Status = tuple[str, Any, Any, Any]  # state, result, error, reason


@dataclass
class Notice:
    """One entry of an owner's completion stream (done:<owner>): what the results push
    announces: the task ids that became final together. Every store method that writes a
    final state returns the notices of what it wrote; `statuses` (task id -> Status) are
    what the push may carry inline, filled in by all but the results function's hot path
    (finish_notify: its caller has them)."""
    owner: str
    prev: str
    cursor: str
    ids: list[str]
    statuses: dict[str, Status] = field(default_factory=dict)


FINAL = frozenset({"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED"})
CANCEL_REASON = "cancelled by its owner"
RECENT_MAX = 100_000  # tasks per owner in recent:<owner>

# Items per script call for the batch scripts whose items are independent. A script holds
# Redis for its whole run: 2,000 records in one call held it 30-55 ms and every client behind
# it waited (the probe of benchmarks/soak.py); a slice of 250 holds it a few milliseconds.
SLICE = 250


def slices(items: Sequence[Any]) -> Iterator[Sequence[Any]]:
    """`items` in consecutive slices of at most SLICE."""
    return (items[i:i + SLICE] for i in range(0, len(items), SLICE))


def decoded(v: Any) -> str | None:
    """A Redis reply as text (None for nil/false)."""
    if v is None or v is False:
        return None
    return v.decode() if isinstance(v, bytes) else v
