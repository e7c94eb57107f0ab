"""The results Lambda: consumes ResultPacks from the results queue in batches (SQS
event source with partial batch failures) and applies them to the hot store with
compare-and-set scripts: a final state is written once, progress never goes backwards,
duplicates from redelivered packs are counted and dropped. Results of direct sessions
(those with a `session`) are recorded as tasks of their own (lambdas/core/tasks/direct_results.py).

Who sent a pack is never taken from its body (skyfn.protocol.result_seal): a pack is applied
as the endpoint whose results key sealed it (lambdas/core/identity/result_seals.py), or as a
multi-user endpoint's lane whose key sealed it (skyfn.protocol.lanes; checked by
lambdas/core/identity/lanes.py, and then only to tasks of its endpoint that identities bound
to the lane submitted). A pack sealed by neither, or whose seal fails, is logged and
dropped, never retried. The store then applies a result, update, hand-back or direct-session
record only to tasks routed to (sessions granted to) that sender: tasks of other endpoints
count as unknown and are left as they were.

A result or error buffer longer than MAX_INLINE_RESULT_BYTES (skyfn.protocol.limits) fails
its task with the reason naming the cap."""
from __future__ import annotations

import re
import time

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from lambdas.adapters.redis_store.lua_rows import FinishRow, ProgressRow
from lambdas.core import deps
from lambdas.core.identity import lanes, result_seals
from lambdas.core.tasks import blobs, dataflow, direct_results, push, stage_metrics
from skyfn.protocol import result_seal
from skyfn.protocol.lanes import is_sealed
from skyfn.protocol.limits import MAX_INLINE_RESULT_BYTES
from skyfn.protocol.messages import UNPARK, ResultPack
from skyfn.protocol.states import format_events

_ENDPOINT_ID = re.compile(r"[A-Za-z0-9-]{1,64}")

logger = Logger(service="skyfn-results")
metrics = Metrics(namespace="skyfn", service="results")
processor = BatchProcessor(event_type=EventType.SQS)


def apply_pack(pack: ResultPack) -> tuple[int, int, int]:
    """Store a pack's progress updates and results as sent by `pack.endpoint_id`, which the
    caller has authenticated (record_handler sets it from the seal, never from the body);
    returns (stored, duplicates, unknown). A pack without a well-formed endpoint id stores
    nothing: every task it names counts as unknown."""
    if not _ENDPOINT_ID.fullmatch(pack.endpoint_id):
        return 0, 0, len(pack.results) + len(pack.updates)
    store = deps.store()
    if pack.updates:
        unparked = [u.task_id for u in pack.updates if u.state == UNPARK]
        store.progress([ProgressRow(task_id=u.task_id, state=u.state, ts=u.ts, lease_seconds=u.lease_seconds)
                        for u in pack.updates if u.state != UNPARK],
                       pack.endpoint_id)
        if unparked:
            dataflow.unpark(pack.endpoint_id, unparked, store)
    if not pack.results:
        return 0, 0, 0
    rows = [FinishRow(task_id=r.task_id, state=r.state, result=r.result, error=r.error, reason=r.reason,
                      events=format_events(r.events), stdout=r.stdout, stderr=r.stderr)
            for r in pack.results]
    for i, row in enumerate(rows):  # a result in S3 must be at its own task's key under the sender's prefix
        refused = blobs.bad_result(pack.endpoint_id, row.task_id, row.result) or _too_large(row.result, row.error)
        if refused:
            rows[i] = row._replace(state="FAILED", result=None, error=None, reason=refused)
    if any(r.session is not None for r in pack.results):  # tasks of direct sessions among them
        return _with_direct(pack, rows)
    return _finish(pack.endpoint_id, rows)


def _too_large(result: str | None, error: str | None) -> str | None:
    """Why an inline result or error buffer is refused (longer than the cap), or None."""
    for what, buf in (("result", result), ("error", error)):
        if buf is not None and len(buf) > MAX_INLINE_RESULT_BYTES:
            return (f"the task's {what} is {len(buf)} bytes inline, above the cap of {MAX_INLINE_RESULT_BYTES} bytes "
                    "(MAX_INLINE_RESULT_BYTES): return a smaller value, or give the deployment a bucket so that large "
                    "results travel through S3 (skyfn.protocol.blobs)")
    return None


def _finish(endpoint_id: str, rows: list[FinishRow]) -> tuple[int, int, int]:
    # only tasks routed to the pack's endpoint: an agent answers for its own tasks alone
    store = deps.store()
    stored, dup, unknown, notices = store.finish_notify(rows, endpoint_id)
    # tell the submitters' WebSocket connections, small results inside (DESIGN.md 2, step 7)
    push.notify(notices, {row.task_id: (row.state, row.result, row.error, row.reason) for row in rows})
    dataflow.advance(store)  # dependents of these tasks: released, or ended with them
    return stored, dup, unknown


def _with_direct(pack: ResultPack, rows: list[FinishRow]) -> tuple[int, int, int]:
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


def endpoint_pack(raw: str) -> ResultPack | None:
    """The pack of an endpoint-sealed body, as sent by the endpoint whose key sealed it; None
    (logged and dropped) when the seal does not check out."""
    try:
        return result_seals.open_pack(raw)
    except result_seals.SealRefused as exc:
        logger.warning("sealed result pack dropped", extra={"reason": str(exc)})
        return None


def record_handler(record: SQSRecord) -> None:
    refused = 0
    if is_sealed(record.body):
        opened = lane_pack(record.body)
        if opened is None:
            return
        pack, refused = opened
    elif result_seal.is_sealed(record.body):
        pack = endpoint_pack(record.body)
        if pack is None:
            return
    else:  # the queue says nothing of who sent it, and the body's endpoint_id is a claim
        logger.warning("unsealed result pack dropped",
                       extra={"reason": "results are applied only when sealed with an endpoint's results key or a "
                                        "lane's key (skyfn.protocol.result_seal)", "bytes": len(record.body)})
        return
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
