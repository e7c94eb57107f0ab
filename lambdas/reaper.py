"""The reaper Lambda (scheduled): endpoints without heartbeats go offline, expired
leases go back to QUEUED (or FAILED past their retry budget), tasks dead-lettered by a
queue are failed with the reason, and results past their TTL leave the hot store. The
tasks it fails are pushed to their owners' connections like results (lambdas/core/tasks/push.py)."""
from __future__ import annotations

import orjson
from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext

from lambdas.config import settings
from lambdas.core import deps
from lambdas.core.tasks import push, registry

logger = Logger(service="skyfn-reaper")


def fail_dead_letters(endpoint_id: str, limit: int = 100) -> int:
    """Tasks of packs that a queue dead-lettered are failed with a visible reason."""
    queue, _ = deps.task_queue(endpoint_id)
    failed = 0
    for msg in queue.dead_letters(limit):
        try:
            pack = orjson.loads(msg.body)
            ids = [t["task_id"] for t in pack.get("tasks", [])]
        except (orjson.JSONDecodeError, TypeError, KeyError):
            logger.warning("undecodable dead letter dropped", extra={"endpoint": endpoint_id})
            continue
        reason = (f"dead-lettered after {msg.delivery_count} deliveries to endpoint {endpoint_id} "
                  f"(max_deliveries={settings().max_deliveries}): its agent kept failing before returning a result")
        stored, _, _, notices = deps.store().finish([[tid, "FAILED", None, None, reason, ""] for tid in ids])
        push.notify(notices)
        failed += stored
    return failed


def reap() -> dict[str, int]:
    store = deps.store()
    offline = registry.mark_silent_endpoints_offline()
    requeued, failed, notices = store.expire_leases()
    push.notify(notices)
    dead = 0
    for endpoint_id in registry.cached_endpoint_ids():
        dead += fail_dead_letters(endpoint_id)
    purged = store.purge()
    report = {"offline": len(offline), "requeued": requeued, "lease_failed": failed, "dead_lettered": dead,
              "purged": purged}
    if any(report.values()):
        logger.info("reaped", extra=report)
    return report


def handler(event: dict, context: LambdaContext) -> dict:
    return reap()
