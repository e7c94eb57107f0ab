"""The EventBridge schedules of the embedded runtime: each schedule is a daemon thread
that invokes its handler with a `Scheduled Event` at a fixed rate (reaper every 5 s,
history every 0.5 s by default: under load each drain takes half a second's tasks, not a
burst of four times as many beside the task path). An invocation that raises is logged and
the schedule goes on; one that overruns its period skips the missed ticks instead of piling up.

A schedule given a `target` ("module:handler") runs it in its own Lambda environment
(infra/local/standins/lambda_pool.py), as AWS runs each scheduled function apart from the API and
the results function: its CPU and its GIL are not theirs. `nice` lowers that process's
priority: the history archive (a bulk copy into DynamoDB) yields the machine's cores to
the task path during a burst and catches up when it ends, which on AWS its own Lambda
does without taking anything from the others."""
from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from infra.local.standins.events import LocalLambdaContext, scheduled_event

log = logging.getLogger("skyfn.local.scheduler")

Handler = Callable[[dict, Any], Any]


@dataclass
class Schedule:
    name: str
    period: float
    handler: Handler | Callable[[], Handler] | None = None
    lazy: bool = False  # handler is a factory returning the handler (resolved on start)
    target: str | None = None  # "module:attr": run in its own environment instead of `handler`
    nice: int = 0  # added to the niceness of the target's environment
    env: dict | None = None  # the target's environment: ours plus this, or (inherit=False) this alone
    inherit: bool = True
    event: dict | None = None  # what the rule's target passes (its Input); default: a Scheduled Event
    timeout_seconds: float = 60.0
    runs: int = 0
    failures: int = 0
    last_error: str | None = None
    _thread: threading.Thread | None = field(default=None, repr=False)
    _pool: Any = field(default=None, repr=False)


HISTORY_NICE = 10


def default_schedules(reaper_period: float = 5.0, history_period: float = 0.5) -> list[Schedule]:
    return [Schedule("skyfn-reaper", reaper_period, target="lambdas.reaper:handler"),
            Schedule("skyfn-history", history_period, target="lambdas.history:handler", nice=HISTORY_NICE)]


class Scheduler:
    def __init__(self, schedules: list[Schedule]):
        self.schedules = schedules
        self._stop = threading.Event()

    def prepare(self) -> "Scheduler":
        """Start each schedule's environment (those of all schedules at once, side by side),
        not the schedules yet; one that fails to start fails this (none is left started)."""
        from infra.local.standins.lambda_pool import LambdaPool

        pending = [s for s in self.schedules if s.target is not None and s._pool is None]
        pools = {id(s): LambdaPool(s.target, min_workers=1, max_workers=1, nice=s.nice, env=s.env,
                                   inherit=s.inherit) for s in pending}  # one environment: never overlaps itself
        errors: list[BaseException] = []

        def start_pool(s: Schedule) -> None:
            try:
                s._pool = pools[id(s)].start()
            except BaseException as exc:  # noqa: BLE001 - raised below, after the others have started
                errors.append(exc)

        threads = [threading.Thread(target=start_pool, args=(s,), name=f"start-{s.name}", daemon=True)
                   for s in pending]
        for t in threads:
            t.start()
        for s in self.schedules:
            if s.target is None and s.lazy:
                s.handler, s.lazy = s.handler(), False
        for t in threads:
            t.join()
        if errors:
            for s in pending:
                if s._pool is not None:
                    s._pool.close()
                    s._pool = None
            raise errors[0]
        return self

    def start(self) -> "Scheduler":
        """Run the schedules (preparing their environments first, if not yet)."""
        self.prepare()
        for s in self.schedules:
            s._thread = threading.Thread(target=self._run, args=(s,), name=f"schedule-{s.name}", daemon=True)
            s._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        for s in self.schedules:
            if s._thread is not None:
                s._thread.join(timeout)
            if s._pool is not None:
                s._pool.close()
                s._pool = None

    def alive(self) -> bool:
        return all(s._thread is not None and s._thread.is_alive() for s in self.schedules)

    def _run(self, s: Schedule) -> None:
        next_at = time.monotonic() + s.period
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            self.invoke(s)
            next_at += s.period
            now = time.monotonic()
            if next_at < now:  # overran: skip the missed ticks
                next_at = now + s.period - ((now - next_at) % s.period)

    def pids(self) -> dict[str, list[int]]:
        """The processes of the schedules that run in their own environment."""
        return {s.name: s._pool.pids() for s in self.schedules if s._pool is not None}

    @staticmethod
    def invoke(s: Schedule) -> None:
        s.runs += 1
        try:
            if s._pool is not None:
                s._pool.invoke(s.event or scheduled_event(s.name), s.name, s.timeout_seconds, str(uuid.uuid4()))
            else:
                s.handler(s.event or scheduled_event(s.name), LocalLambdaContext(s.name, s.timeout_seconds))
        except Exception as exc:
            s.failures += 1
            s.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("scheduled handler %s failed; the schedule continues", s.name)
