"""Dead letters, the reaper's share (lambdas/reaper.py): tasks of packs that an endpoint's
queue, or one of its lanes' queues (lambdas/core/identity/lanes.py), dead-lettered are failed
with the reason, and pushed to their owners like results (lambdas/core/tasks/push.py).

Only the endpoints on the dead-letter watch are looked at
(lambdas/adapters/redis_store/dead_letter_watch.py): those sent a pack lately, or whose lane
closed. A message is dead-lettered only while it is in its queue, so once an endpoint's
queues (its own and its lanes') are found empty, with nothing sent to it for WATCH_GRACE_S,
it leaves the watch until the next pack sent to it. A tick costs a look per endpoint that
had work lately and nothing per idle endpoint."""
from __future__ import annotations

import time
from typing import Sequence

import orjson
from aws_lambda_powertools import Logger

from lambdas.adapters.redis_store.lua_rows import FinishRow
from lambdas.config import settings
from lambdas.core import deps
from lambdas.core.identity import lanes
from lambdas.core.tasks import push, registry
from skyfn.protocol.queues import TaskQueue

logger = Logger(service="skyfn-reaper", child=True)

LIMIT = 100           # dead letters taken from one queue a tick
WATCH_GRACE_S = 60.0  # an endpoint stays watched this long after its last send (clocks apart)


def fail_dead_letters(endpoint_id: str, lane_names: Sequence[str] = (), limit: int = LIMIT) -> int:
    """Tasks of packs that the endpoint's queue, or one of its lanes' queues, dead-lettered
    are failed with a visible reason. A closed lane left empty is no longer looked at."""
    return _look(endpoint_id, lane_names, limit)[0]


def _look(endpoint_id: str, lane_names: Sequence[str], limit: int) -> tuple[int, bool]:
    """(tasks failed, whether the endpoint's queues and dead letters are all empty now)."""
    queue, _ = deps.task_queue(endpoint_id)
    failed, taken = _fail_dead(queue, endpoint_id, limit)
    empty = taken < limit and queue.depth() == 0
    for lane in lane_names:
        lane_queue, _ = deps.lane_queue(endpoint_id, lane)
        got, taken = _fail_dead(lane_queue, endpoint_id, limit, lane)
        failed += got
        lanes.forget_if_drained(endpoint_id, lane)
        empty = empty and taken < limit and lane_queue.depth() == 0
    return failed, empty


def _fail_dead(queue: TaskQueue, endpoint_id: str, limit: int, lane: str | None = None) -> tuple[int, int]:
    """Fail the tasks the queue's dead letters name; a lane's only where identities bound to
    the lane submitted them (its user agent's login may write its own dead letters).
    Returns (tasks failed, dead letters taken)."""
    failed = 0
    letters = queue.dead_letters(limit)
    for msg in letters:
        try:
            pack = orjson.loads(msg.body)
            ids = [t["task_id"] for t in pack.get("tasks", [])]
        except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError):
            logger.warning("undecodable dead letter dropped", extra={"endpoint": endpoint_id, "queue": queue.name})
            continue
        if lane is not None:
            named = len(ids)
            ids = lanes.bound_tasks(endpoint_id, lane, ids)
            if len(ids) < named:
                logger.warning("dead letter names tasks not bound to its lane; those left alone",
                               extra={"endpoint": endpoint_id, "lane": lane, "refused": named - len(ids)})
        reason = (f"dead-lettered after {msg.delivery_count} deliveries to endpoint {endpoint_id} "
                  f"(max_deliveries={settings().max_deliveries}): its agent kept failing before returning a result")
        # only tasks routed to the endpoint: its agents may write to these queues too
        stored, _, _, notices = deps.store().finish([FinishRow(task_id=tid, state="FAILED", reason=reason) for tid in ids],
                                                    endpoint_id)
        push.notify(notices)
        failed += stored
    return failed, len(letters)


def sweep() -> int:
    """The reaper's turn: the dead letters of the endpoints watched; those found empty, and
    sent nothing for WATCH_GRACE_S, leave the watch. Returns the tasks failed."""
    watch = deps.dead_letter_watch()
    now = time.time()
    watch.build_once(registry.cached_endpoint_ids)  # a store from before the watch: once
    due = watch.due()
    if not due:
        return 0
    lanes_of = lanes.watched(due) if lanes.enabled() else {}
    failed = 0
    for endpoint_id in due:
        got, empty = _look(endpoint_id, lanes_of.get(endpoint_id, []), LIMIT)
        failed += got
        if empty:
            watch.settle(endpoint_id, now - WATCH_GRACE_S)
    return failed
