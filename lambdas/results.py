"""The results Lambda: consumes ResultPacks from the results queue in batches (SQS
event source with partial batch failures) and applies them to the hot store with
compare-and-set scripts: a final state is written once, progress never goes backwards,
duplicates from redelivered packs are counted and dropped. Results of direct sessions
(those with a `session`) are recorded as tasks of their own (lambdas/core/tasks/direct_results.py).

A pack sealed by a multi-user endpoint's lane (skyfn.protocol.lanes) is applied only when
its MAC checks out under the lane's key (lambdas/core/identity/lanes.py), and then only to
tasks of its endpoint that identities bound to the lane submitted; a seal that fails is
logged and dropped, never retried."""
from __future__ import annotations

import time

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from lambdas.core import deps
from lambdas.core.identity import lanes
from lambdas.core.tasks import blobs, dataflow, direct_results, push, stage_metrics
from skyfn.protocol.lanes import is_sealed
from skyfn.protocol.messages import UNPARK, ResultPack
from skyfn.protocol.states import format_events

logger = Logger(service="skyfn-results")
metrics = Metrics(namespace="skyfn", service="results")
processor = BatchProcessor(event_type=EventType.SQS)


def apply_pack(pack: ResultPack) -> tuple[int, int, int]:
    """Store a pack's progress updates and results; returns (stored, duplicates, unknown)."""
    store = deps.store()
    if pack.updates:
        unparked = [u.task_id for u in pack.updates if u.state == UNPARK]
        store.progress([[u.task_id, u.state, u.ts, u.lease_seconds] for u in pack.updates if u.state != UNPARK],
                       pack.endpoint_id)
        if unparked:
            dataflow.unpark(pack.endpoint_id, unparked, store)
    if not pack.results:
        return 0, 0, 0
    rows = [[r.task_id, r.state, r.result, r.error, r.reason, format_events(r.events), r.stdout, r.stderr]
            for r in pack.results]
    for row in rows:  # a result in S3 must be at its own task's key under the sender's prefix
        refused = blobs.bad_result(pack.endpoint_id, row[0], row[2])
        if refused:
            row[1:5] = ["FAILED", None, None, refused]
    if any(r.session is not None for r in pack.results):  # tasks of direct sessions among them
        return _with_direct(pack, rows)
    return _finish(pack.endpoint_id, rows)


def _finish(endpoint_id: str, rows: list[list]) -> tuple[int, int, int]:
    # only tasks routed to the pack's endpoint: an agent answers for its own tasks alone
    store = deps.store()
    stored, dup, unknown, notices = store.finish_notify(rows, endpoint_id)
    # tell the submitters' WebSocket connections, small results inside (DESIGN.md 2, step 7)
    push.notify(notices, {row[0]: (row[1], row[2], row[3], row[4]) for row in rows})
    dataflow.advance(store)  # dependents of these tasks: released, or ended with them
    return stored, dup, unknown


def _with_direct(pack: ResultPack, rows: list[list]) -> tuple[int, int, int]:
    """Queued tasks are finished as ever; direct ones are recorded, never pushed."""
    queued = [row for r, row in zip(pack.results, rows) if r.session is None]
    direct = [(r, row) for r, row in zip(pack.results, rows) if r.session is not None]
    counts = _finish(pack.endpoint_id, queued) if queued else (0, 0, 0)
    recorded = direct_results.record(pack.endpoint_id, [r for r, _ in direct], [row for _, row in direct], time.time())
    return counts[0] + recorded[0], counts[1] + recorded[1], counts[2] + recorded[2]


def lane_pack(raw: str) -> tuple[ResultPack, int] | None:
    """The part of a lane's sealed pack the lane may answer for -- results and updates of
    tasks that identities bound to the lane submitted -- and how many others it held. None
    when the seal does not check out: logged and dropped, as redelivering it cannot help."""
    try:
        sealed = lanes.check_sealed(raw)
    except lanes.SealRefused as exc:
        logger.warning("sealed result pack dropped", extra={"reason": str(exc)})
        return None
    pack = sealed.pack
    owners = sealed.owners
    results = [r for r in pack.results if owners.get(r.task_id) in sealed.identities]
    updates = [u for u in pack.updates if owners.get(u.task_id) in sealed.identities]
    refused = len(pack.results) - len(results) + len(pack.updates) - len(updates)
    if refused:
        logger.warning("results of tasks not bound to the lane dropped",
                       extra={"lane": sealed.lane, "endpoint": pack.endpoint_id, "unknown": refused})
    return pack.model_copy(update={"results": results, "updates": updates}), refused


def record_handler(record: SQSRecord) -> None:
    refused = 0
    if is_sealed(record.body):
        opened = lane_pack(record.body)
        if opened is None:
            return
        pack, refused = opened
    else:
        pack = ResultPack.model_validate_json(record.body)
    stored, dup, unknown = apply_pack(pack)
    unknown += refused
    if dup or unknown:
        logger.info("results ignored", extra={"duplicates": dup, "unknown": unknown, "endpoint": pack.endpoint_id})
    metrics.add_metric(name="ResultsStored", unit=MetricUnit.Count, value=stored)
    metrics.add_metric(name="ResultsDuplicate", unit=MetricUnit.Count, value=dup)
    if stored:  # latency per stage of what this pack finished (EMF; the dashboard graphs it)
        stage_metrics.record(metrics, [r.task_id for r in pack.results])


@metrics.log_metrics
def handler(event: dict, context: LambdaContext) -> dict:
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
