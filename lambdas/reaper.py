"""The reaper Lambda (scheduled): endpoints without heartbeats go offline, expired
leases go back to QUEUED (or FAILED past their retry budget), tasks dead-lettered by a
queue (an endpoint's, or one of its lanes': lambdas/core/identity/lanes.py) are failed with
the reason. The tasks it fails are pushed to their owners' connections like results
(lambdas/core/tasks/push.py). It also carries task graphs on where the results function left
them (lambdas/core/tasks/dataflow.py: a cascade cut short, a release whose sender died).
Finished records leave the hot store by their own expiry
(lambdas/adapters/redis_store/outbox.py), not here."""
from __future__ import annotations

from typing import Sequence

import orjson
from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext

from lambdas.config import settings
from lambdas.core import deps
from lambdas.core.identity import lanes
from lambdas.core.tasks import dataflow, push, registry
from skyfn.protocol.queues import TaskQueue

logger = Logger(service="skyfn-reaper")


def fail_dead_letters(endpoint_id: str, lane_names: Sequence[str] = (), limit: int = 100) -> int:
    """Tasks of packs that the endpoint's queue, or one of its lanes' queues, dead-lettered
    are failed with a visible reason. A closed lane left empty is no longer looked at."""
    queue, _ = deps.task_queue(endpoint_id)
    failed = _fail_dead(queue, endpoint_id, limit)
    for lane in lane_names:
        lane_queue, _ = deps.lane_queue(endpoint_id, lane)
        failed += _fail_dead(lane_queue, endpoint_id, limit)
        lanes.forget_if_drained(endpoint_id, lane)
    return failed


def _fail_dead(queue: TaskQueue, endpoint_id: str, limit: int) -> int:
    failed = 0
    for msg in queue.dead_letters(limit):
        try:
            pack = orjson.loads(msg.body)
            ids = [t["task_id"] for t in pack.get("tasks", [])]
        except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError):
            logger.warning("undecodable dead letter dropped", extra={"endpoint": endpoint_id, "queue": queue.name})
            continue
        reason = (f"dead-lettered after {msg.delivery_count} deliveries to endpoint {endpoint_id} "
                  f"(max_deliveries={settings().max_deliveries}): its agent kept failing before returning a result")
        # only tasks routed to the endpoint: its agents may write to these queues too
        stored, _, _, notices = deps.store().finish([[tid, "FAILED", None, None, reason, ""] for tid in ids],
                                                    endpoint_id)
        push.notify(notices)
        failed += stored
    return failed


def reap() -> dict[str, int]:
    store = deps.store()
    offline = registry.mark_silent_endpoints_offline()
    requeued, failed, notices = store.expire_leases()
    push.notify(notices)
    dead = 0
    endpoint_ids = registry.cached_endpoint_ids()
    lanes_of = lanes.watched(endpoint_ids) if lanes.enabled() else {}
    for endpoint_id in endpoint_ids:
        dead += fail_dead_letters(endpoint_id, lanes_of.get(endpoint_id, []))
    legacy = store.expire_legacy_purge_index()
    graph = dataflow.sweep(store)  # last: the tasks failed above may have dependents
    report = {"offline": len(offline), "requeued": requeued, "lease_failed": failed, "dead_lettered": dead,
              "legacy_purge_index": legacy, **{f"graph_{k}": v for k, v in graph.items()}}
    if any(report.values()):
        logger.info("reaped", extra=report)
    return report


def handler(event: dict, context: LambdaContext) -> dict:
    return reap()
