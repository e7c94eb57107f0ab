"""Sizing of the AWS app's archival path (issue 24): the one place for the figures that the
service stack deploys, tests/aws/test_archival_capacity.py asserts, docs/deploy.md
("Archival capacity") explains and benchmarks/cost.py prices.

The history function (lambdas/history.py) drains the hot store's outbox in batches of
HISTORY_BATCH until the outbox is empty or less than HISTORY_DRAIN_MARGIN_S of its
timeout remain. An EventBridge rule starts `DeployConfig.history_drainers` invocations
every minute (one target each), which drain concurrently (each batch is one atomic LPOP).
So while there is a backlog each drainer is busy (timeout - margin) of every minute, and

    capacity (tasks/s) = drainers x batch / seconds_per_batch x (timeout - margin) / 60

Pure Python (no aws_cdk import), like infra/aws/config.py.
"""
from __future__ import annotations

import math

from infra.aws.config import EVENTBRIDGE_MAX_TARGETS, FUNCTIONS

# --- what the archive must sustain ----------------------------------------------------
TARGET_TASKS_PER_S = 10_000     # issue 24: the AWS app archives at least this many tasks/s
SAFETY_FACTOR = 2.0             # ... with this much headroom over the measured batch time

# --- the drain (deployed by infra/aws/stacks/service.py) --------------------------------
SCHEDULE_PERIOD_S = 60          # the history rule fires every minute (EventBridge's finest rate)
HISTORY_BATCH = 2_000           # SKYFN_HISTORY_BATCH: outbox entries per drain batch
HISTORY_DRAIN_MARGIN_S = 5      # SKYFN_HISTORY_DRAIN_MARGIN_S: stop taking batches this close to the timeout
HISTORY_TIMEOUT_S = FUNCTIONS["history"].timeout_s
HISTORY_MEMORY_MB = FUNCTIONS["history"].memory_mb
DEFAULT_DRAINERS = 4            # DeployConfig.history_drainers
MAX_DRAINERS = EVENTBRIDGE_MAX_TARGETS

# Wall-clock seconds one drain batch of HISTORY_BATCH (2,000) no-op tasks takes (LPOP, read
# the records, build and zlib the pages, BatchWriteItem, mark archived + expiry). Measured
# 0.078 s on one core here against moto (`benchmarks/archive.py --json`: 25,700 tasks/s,
# 13.5 us of drainer CPU per task); 0.2 s allows for the 0.58 vCPU Lambda gives 1024 MB and
# for DynamoDB's network round trips. Every capacity figure scales with 1 / SECONDS_PER_BATCH.
SECONDS_PER_BATCH = 0.2

# --- DynamoDB pages (lambdas/adapters/history_pages.py) ---------------------------------
# Bytes of one no-op task in a page body (zlib of its JSON item): 16.5 measured by
# benchmarks/archive.py (synthetic events); 80 leaves room for real events, errors and
# reasons, which compress less.
PAGE_BYTES_PER_TASK = 80
PAGE_TASKS = 1_000               # tasks per page at most (history_pages.PAGE_TASKS; tests/unit/test_cost_model.py)
PAGE_BUCKET_S = 1               # a page's partition key: one owner's tasks of one second of task ids
PAGE_OVERHEAD_BYTES = 120       # a page's key, sort key, n, expires_at and attribute names
MARKER_BYTES = 80               # a marker item (m#<owner>, <minute>#<bucket>, expires_at)
WRITE_UNIT_BYTES = 1024         # one write request unit per started KB of an item
PARTITION_WCU_PER_S = 1_000     # DynamoDB's limit per partition (and per partition key value)
ON_DEMAND_INITIAL_WCU_PER_S = 4_000  # a new on-demand table serves this many at once (then doubles its peak)

# --- the hot store -------------------------------------------------------------------------
# A finished no-op task's share of the hot store's memory with results read as they come:
# 671 and 721 bytes (`redis_bytes_per_task` of two `benchmarks/soak.py` runs at 5,100 tasks/s;
# the record itself is 536 bytes, the rest its share of the outbox, indexes and streams).
REDIS_BYTES_PER_TASK = 720


def duty_cycle(timeout_s: float = HISTORY_TIMEOUT_S, margin_s: float = HISTORY_DRAIN_MARGIN_S,
               period_s: float = SCHEDULE_PERIOD_S) -> float:
    """Fraction of each period a drainer takes batches while there is a backlog."""
    return max(0.0, min(1.0, (timeout_s - margin_s) / period_s))


def drain_capacity(drainers: int, batch: int = HISTORY_BATCH, seconds_per_batch: float | None = None,
                   timeout_s: float = HISTORY_TIMEOUT_S, margin_s: float = HISTORY_DRAIN_MARGIN_S,
                   period_s: float = SCHEDULE_PERIOD_S) -> float:
    """Tasks/s the drainers archive while the outbox has a backlog (seconds_per_batch:
    SECONDS_PER_BATCH unless given)."""
    per_batch = SECONDS_PER_BATCH if seconds_per_batch is None else seconds_per_batch
    return drainers * batch / per_batch * duty_cycle(timeout_s, margin_s, period_s)


def max_seconds_per_batch(drainers: int = DEFAULT_DRAINERS, target: float = TARGET_TASKS_PER_S,
                          safety: float = SAFETY_FACTOR) -> float:
    """The slowest batch at which `drainers` still archive `target` x `safety` tasks/s."""
    return drainers * HISTORY_BATCH * duty_cycle() / (target * safety)


def reserved_concurrency(drainers: int) -> int:
    """Reserved concurrency of the history function: twice the drainers, so an invocation
    that starts before the previous minute's has returned (EventBridge's delivery is not
    to the second; retries) is never throttled, and the history function can never take
    more than this from the account's concurrency."""
    return 2 * drainers


def page_write_units(tasks: int, bytes_per_task: float = PAGE_BYTES_PER_TASK) -> int:
    """Write request units of one page holding `tasks` tasks."""
    return max(1, math.ceil((PAGE_OVERHEAD_BYTES + tasks * bytes_per_task) / WRITE_UNIT_BYTES))


def write_units_per_task(tasks_per_page: int, bytes_per_task: float = PAGE_BYTES_PER_TASK,
                         markers_per_page: float = 1.0) -> float:
    """Write request units per archived task: its share of its page and of the page's marker."""
    marker = markers_per_page * max(1, math.ceil(MARKER_BYTES / WRITE_UNIT_BYTES))
    return (page_write_units(tasks_per_page, bytes_per_task) + marker) / tasks_per_page


def redis_bytes(rate: float, result_ttl_s: float, archive_lag_s: float,
                bytes_per_task: float = REDIS_BYTES_PER_TASK) -> float:
    """Steady-state Redis memory of finished tasks whose results are read as they come:
    each record lives until it is archived (archive lag) and then result_ttl after its read."""
    return rate * (result_ttl_s + archive_lag_s) * bytes_per_task
