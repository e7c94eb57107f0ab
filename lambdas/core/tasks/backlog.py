"""Backpressure for the hot store (issue 24): how far the history archiver is behind, and
the refusal of new tasks while it is too far behind.

The gauge reads, in one pipelined round trip (lambdas/adapters/redis_store/backlog_store.py),
the length of the history outbox (records written to Redis and not yet archived:
lambdas/history.py drains it), the memory Redis uses
and its maxmemory (INFO memory), and DBSIZE, which stands for the number of task records:
every task is one `t:<id>` hash and the other keys (per owner, endpoint, idempotency key or
session, not per task) are few next to them under load, so DBSIZE slightly over-counts and
bytes_per_task ((used memory - memory at startup) / keys) includes the outbox, the streams
and the indexes spread over the tasks: what a task costs the store, all in. The reading is
cached per process for `max_age` seconds (0.5 by default), so the check on the submission
path costs a round trip at most twice a second per API process, none on most requests.

Every path that creates tasks calls `check()` before it stores anything or claims its
idempotency key: over the bound (SKYFN_BACKLOG_MAX outbox records, or
SKYFN_BACKLOG_MEMORY_FRACTION of maxmemory when Redis has one) it raises Backlogged:
HTTP 429 `backlog` with a Retry-After of 1 to 5 s, longer the further over the bound.
Redis runs with maxmemory-policy noeviction (infra/hot_store.py): nothing accepted is ever
evicted. `publish()` emits the gauge as CloudWatch metrics (EMF; namespace skyfn, service
history): OutboxLength, RedisUsedBytes, RedisBytesPerTask; the HistoryBacklog alarm of the
CDK app watches OutboxLength, and `skyfn local status` shows the same gauge.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Optional

from aws_lambda_powertools import Logger

from lambdas.config import settings
from lambdas.core import deps
from lambdas.core.errors import Backlogged

logger = Logger(service="skyfn-backlog")  # its own handler: the API and the history drain both log here
MAX_RETRY_AFTER = 5  # seconds: Retry-After grows from 1 s at the bound to this at 20 % over it


@dataclass(frozen=True)
class Backlog:
    outbox: int           # history outbox entries not yet archived
    used_bytes: int       # Redis used_memory
    max_bytes: int        # Redis maxmemory; 0: no limit
    task_records: int     # DBSIZE: the task records, and the few keys that are not tasks
    bytes_per_task: float  # (used_memory - used_memory_startup) / task_records; 0 without records

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# (figures port, monotonic time read, Backlog): the last reading of this process
_last: Optional[tuple[Any, float, Backlog]] = None


def read(figures: Any) -> Backlog:
    """One uncached reading through `figures` (backlog_store.BacklogFigures): one round trip."""
    f = figures.read()
    per_task = max(0, f.used_bytes - f.startup_bytes) / f.keys if f.keys else 0.0
    return Backlog(outbox=f.outbox, used_bytes=f.used_bytes, max_bytes=f.max_bytes, task_records=f.keys,
                   bytes_per_task=round(per_task, 1))


def gauge(figures: Any = None, max_age: float = 0.5) -> Backlog:
    """The hot store's backlog, read at most every `max_age` seconds per process (0: now);
    `figures`: the port it is read through (the process's own by default)."""
    global _last
    figures = figures if figures is not None else deps.backlog_figures()
    now = time.monotonic()
    last = _last
    if last is not None and last[0] is figures and now - last[1] < max_age:
        return last[2]
    b = read(figures)
    _last = (figures, now, b)
    return b


def reset() -> None:
    """Forget the cached reading (tests)."""
    global _last
    _last = None


def _memory_bound(b: Backlog) -> float:
    return settings().backlog_memory_fraction * b.max_bytes


def overloaded(b: Backlog) -> str | None:
    """Why new tasks must wait (a sentence), or None while the backlog is under its bounds."""
    s = settings()
    if b.outbox > s.backlog_max:
        return (f"the history outbox holds {b.outbox:,} records not yet archived, over its bound of "
                f"{s.backlog_max:,} (SKYFN_BACKLOG_MAX): the archiver is behind")
    if b.max_bytes and b.used_bytes > _memory_bound(b):
        return (f"the hot store uses {b.used_bytes / 2**20:,.0f} MiB of its {b.max_bytes / 2**20:,.0f} MiB, over "
                f"{s.backlog_memory_fraction:.0%} of it (SKYFN_BACKLOG_MEMORY_FRACTION)")
    return None


def pressure(b: Backlog) -> float:
    """The backlog over its nearest bound: 1.0 at the bound (the larger of the two ratios)."""
    s = settings()
    ratio = b.outbox / s.backlog_max
    if b.max_bytes:
        ratio = max(ratio, b.used_bytes / _memory_bound(b))
    return ratio


def retry_after(b: Backlog) -> int:
    """Seconds a refused client should wait: 1 just over the bound, one more per 5 % over it,
    at most MAX_RETRY_AFTER."""
    over = max(0.0, pressure(b) - 1.0)
    return min(MAX_RETRY_AFTER, 1 + math.floor(over * 20))


def check(figures: Any = None) -> None:
    """Raise Backlogged (429 backlog, Retry-After) while the backlog is over its bounds;
    called before a submission stores anything or claims its idempotency key."""
    b = gauge(figures)
    why = overloaded(b)
    if why is None:
        return
    wait = retry_after(b)
    raise Backlogged(f"the service is not taking new tasks for now: {why}. Nothing was stored: retry this request "
                     f"after {wait} s (Retry-After; the skyfn SDK waits and retries by itself), or submit at a "
                     "lower rate", wait, {"retry_after": wait, **b.as_dict()})


def publish(b: Backlog) -> None:
    """Emit the gauge as CloudWatch metrics (EMF on stdout; namespace skyfn, dimension
    service=history) and log a warning while it is over its bounds."""
    from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit

    metrics = EphemeralMetrics(namespace="skyfn", service="history")  # its own set, flushed here
    metrics.add_metric(name="OutboxLength", unit=MetricUnit.Count, value=b.outbox)
    metrics.add_metric(name="RedisUsedBytes", unit=MetricUnit.Bytes, value=b.used_bytes)
    metrics.add_metric(name="RedisBytesPerTask", unit=MetricUnit.Bytes, value=b.bytes_per_task)
    metrics.flush_metrics()
    why = overloaded(b)
    if why is not None:
        logger.warning(f"backpressure: {why}; submissions answer 429 backlog", extra=b.as_dict())
