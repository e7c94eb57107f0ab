"""The reaper Lambda (scheduled): endpoints without heartbeats go offline, expired
leases go back to QUEUED (or FAILED past their retry budget), tasks dead-lettered by a
queue (an endpoint's, or one of its lanes': lambdas/core/identity/lanes.py) are failed with
the reason. The tasks it fails are pushed to their owners' connections like results
(lambdas/core/tasks/push.py). It also carries task graphs on where the results function left
them (lambdas/core/tasks/dataflow.py: a cascade cut short, a release whose sender died).
Finished records leave the hot store by their own expiry
(lambdas/adapters/redis_store/outbox.py), not here.

Nothing here reads every endpoint: silent endpoints come from the liveness index
(registry.mark_silent_endpoints_offline), dead letters from the endpoints sent work lately
(lambdas/core/tasks/dead_letters.py); a tick's cost follows the work, not the fleet
(docs/fleet.md)."""
from __future__ import annotations

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.typing import LambdaContext

from lambdas.core import deps
from lambdas.core.tasks import dataflow, dead_letters, push, registry

logger = Logger(service="skyfn-reaper")


def reap() -> dict[str, int]:
    store = deps.store()
    offline = registry.mark_silent_endpoints_offline()
    requeued, failed, notices = store.expire_leases()
    push.notify(notices)
    dead = dead_letters.sweep()
    legacy = store.expire_legacy_purge_index()
    graph = dataflow.sweep(store)  # last: the tasks failed above may have dependents
    report = {"offline": len(offline), "requeued": requeued, "lease_failed": failed, "dead_lettered": dead,
              "legacy_purge_index": legacy, **{f"graph_{k}": v for k, v in graph.items()}}
    if any(report.values()):
        logger.info("reaped", extra=report)
    return report


def handler(event: dict, context: LambdaContext) -> dict:
    return reap()
