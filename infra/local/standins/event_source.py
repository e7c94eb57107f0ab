"""The SQS event-source mapping of the embedded runtime: a thread long-polls the results
queue (any skyfn.protocol.queues TaskQueue; a Redis stream in the embedded runtime),
invokes the results handler with an SQS-shaped event and, as Lambda does with
ReportBatchItemFailures, deletes every record not listed in `batchItemFailures`.

Failed records stay leased and come back after the visibility timeout. A handler that
raises, returns a malformed response or names an unknown record fails the whole batch
(everything is redelivered). Queue errors (a Redis restart) are retried with backoff;
the consumer group is re-ensured after a reconnect.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from infra.local.standins.events import LocalLambdaContext, queue_arn, sqs_record, stream_id_millis

log = logging.getLogger("skyfn.local.event_source")

Handler = Callable[[dict, Any], Any]
REPAIR_CHECK_S = 1.0


def redis_results_queue(url: str, name: str = "results", visibility_timeout: float = 30.0):
    """The results queue of the embedded runtime: a Redis stream read by the consumer `gateway`."""
    from skyfn.protocol.queues import open_queue

    return open_queue({"kind": "redis", "name": name, "url": url}, consumer="gateway",
                      visibility_timeout=visibility_timeout)


def failed_ids(response: Any, batch_ids: set[str]) -> set[str]:
    """The message ids Lambda would leave on the queue for this handler response."""
    if response is None:
        return set()
    if not isinstance(response, dict):
        raise TypeError(f"the handler returned {type(response).__name__}, not a dict")
    failures = response.get("batchItemFailures") or []
    ids = set()
    for item in failures:
        ident = item.get("itemIdentifier") if isinstance(item, dict) else None
        if not ident or ident not in batch_ids:
            raise ValueError(f"batchItemFailures names {ident!r}, which is not in the batch")
        ids.add(ident)
    return ids


class EventSourceMapping:
    """Poll `queue` and feed `handler` (default: lambdas.results.handler) in batches."""

    def __init__(self, queue_factory: Callable[[], Any], handler: Handler | None = None, *,
                 function_name: str = "skyfn-results", batch_size: int = 100, wait_seconds: float = 1.0,
                 timeout_seconds: float = 60.0, max_backoff: float = 5.0, declare: bool = True):
        self._queue_factory = queue_factory
        self.declare = declare  # create the queue (a Redis stream's group); False: it exists, as Lambda's mapping expects
        self._handler = handler
        self.function_name = function_name
        self.batch_size = batch_size
        self.wait_seconds = wait_seconds
        self.timeout_seconds = timeout_seconds
        self.max_backoff = max_backoff
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._queue = None
        self.stats = {"batches": 0, "records": 0, "deleted": 0, "failed": 0, "errors": 0, "repaired": 0}
        self._next_repair_check = 0.0

    @property
    def handler(self) -> Handler:
        if self._handler is None:
            from infra.local.handlers import results_handler

            self._handler = results_handler()
        return self._handler

    def prepare(self) -> "EventSourceMapping":
        """Load the handler (in this process), without polling yet."""
        self.handler
        return self

    def start(self) -> "EventSourceMapping":
        self.prepare()
        self._queue = self._queue_factory()
        if self.declare:
            self._queue.ensure()
        self._thread = threading.Thread(target=self._run, name=f"esm-{self.function_name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._queue is not None:
            try:
                self._queue.close()
            except Exception:
                pass

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- loop ----------------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            try:
                if backoff and self.declare:
                    self._queue.ensure()  # the group may be gone if Redis restarted without its data
                messages = self._queue.receive(self.batch_size, self.wait_seconds)
                if backoff:
                    log.info("results queue reachable again")
                    backoff = 0.0
            except Exception as exc:
                self.stats["errors"] += 1
                backoff = min(self.max_backoff, backoff * 2 or 0.1)
                log.warning("receiving from the results queue failed (%s: %s); retrying in %.1f s",
                            type(exc).__name__, exc, backoff)
                self._stop.wait(backoff)
                continue
            if messages:
                self.process(messages)
            elif time.monotonic() >= self._next_repair_check:
                self._repair()

    def _repair(self) -> None:
        """An entry with a chosen id far in the future blocks every producer's next add: the
        stream's owner puts its clock back (skyfn.protocol.queues.redis_streams); checked
        once a second while nothing arrives (what such an entry causes)."""
        self._next_repair_check = time.monotonic() + REPAIR_CHECK_S
        repair = getattr(self._queue, "repair_future_ids", None)
        if repair is None:
            return
        try:
            if repair():
                self.stats["repaired"] += 1
        except Exception as exc:  # noqa: BLE001 - the next quiet second tries again
            log.warning("checking the results stream's ids failed (%s: %s)", type(exc).__name__, exc)

    def process(self, messages: list) -> None:
        """Invoke the handler once for `messages` and delete the ones that succeeded."""
        arn = queue_arn(getattr(self._queue, "name", "results"))
        records = [sqs_record(m.message_id, m.receipt, m.body, m.delivery_count, arn,
                              sent_ms=stream_id_millis(m.message_id)) for m in messages]
        by_id = {m.message_id: m for m in messages}
        context = LocalLambdaContext(self.function_name, self.timeout_seconds)
        self.stats["batches"] += 1
        self.stats["records"] += len(messages)
        try:
            failed = failed_ids(self.handler({"Records": records}, context), set(by_id))
        except Exception:
            log.exception("results handler failed on a batch of %d; all stay on the queue for redelivery",
                          len(messages))
            self.stats["failed"] += len(messages)
            return
        done = [m.receipt for m in messages if m.message_id not in failed]
        self.stats["failed"] += len(failed)
        if failed:
            log.info("%d of %d records failed; left for redelivery", len(failed), len(messages))
        if done:
            self._delete(done)

    def _delete(self, receipts: list[str]) -> None:
        delay = 0.05
        for attempt in range(6):
            try:
                self._queue.delete(receipts)
                self.stats["deleted"] += len(receipts)
                return
            except Exception as exc:
                log.warning("deleting %d processed records failed (%s); retry %d", len(receipts), exc, attempt + 1)
                if self._stop.wait(delay):
                    break
                delay = min(self.max_backoff, delay * 2)
        log.error("%d processed records could not be deleted; they will be redelivered "
                  "(the results handler is idempotent)", len(receipts))
