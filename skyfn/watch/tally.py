"""The arithmetic of `skyfn task watch`: the state of each watched task, counts per state
and per endpoint, throughput over a sliding window, the ETA and the last failures.

Pure: no I/O. Times are epoch seconds given by the caller (the service's event timestamps
when known), so it is tested without a service or a clock. Thread-safe: the live display
renders from another thread while the feed applies updates.
"""
from __future__ import annotations

import bisect
import threading
from collections import Counter, deque
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Optional

from skyfn.protocol.states import FINAL_STATES, TaskState

STATES = tuple(s.value for s in TaskState)
FINAL = frozenset(s.value for s in FINAL_STATES)
BAD = FINAL - {TaskState.SUCCEEDED.value}  # FAILED, TIMED_OUT, CANCELLED: the watch exits 1

# Exit codes of the watch: all succeeded, some did not, (--once) some are not final yet.
EXIT_OK, EXIT_FAILED, EXIT_RUNNING = 0, 1, 3

MIN_SPAN = 1.0  # seconds: a rate over less time than this is noise


@dataclass(frozen=True)
class Failure:
    task_id: str
    state: str
    endpoint: str
    reason: str


class Tally:
    """What is known of a fixed set of tasks.

    ``endpoints`` maps each watched task id to the label of its endpoint (the watched set is
    its keys). ``origin`` is when the batch started (its first CREATED event); throughput is
    the number of tasks that finished in the last ``window`` seconds, over that window or
    the time since ``origin`` when shorter.
    """

    def __init__(self, endpoints: dict[str, str], origin: float, window: float = 10.0, keep: int = 5):
        self._lock = threading.Lock()
        self.endpoint = dict(endpoints)
        self.state: dict[str, Optional[str]] = dict.fromkeys(self.endpoint)
        self.counts: Counter[str] = Counter()
        self.per_endpoint: dict[str, Counter[str]] = {}
        self.origin = origin
        self.window = window
        self.failures: deque[Failure] = deque(maxlen=keep)
        self._finished_at: list[float] = []  # sorted

    @property
    def total(self) -> int:
        return len(self.state)

    def update(self, task_id: str, state: str, reason: Optional[str] = None,
               finished_at: Optional[float] = None) -> bool:
        """Apply one observed state; returns whether anything changed. Ids not watched are
        ignored; a final state is never left (push and polling may both report it).
        ``finished_at``: when a final state was reached (None: unknown, not in throughput)."""
        with self._lock:
            if task_id not in self.state:
                return False
            old = self.state[task_id]
            if old == state or old in FINAL:
                return False
            label = self.endpoint[task_id]
            per = self.per_endpoint.setdefault(label, Counter())
            if old is not None:
                self.counts[old] -= 1
                per[old] -= 1
            self.counts[state] += 1
            per[state] += 1
            self.state[task_id] = state
            if state in FINAL and finished_at is not None:
                bisect.insort(self._finished_at, finished_at)
            if state in BAD:
                self.failures.append(Failure(task_id, state, label, reason or state.lower().replace("_", " ")))
            return True

    def outstanding(self) -> list[str]:
        """Watched tasks not final yet (in the order they were given)."""
        with self._lock:
            return [tid for tid, s in self.state.items() if s not in FINAL]

    @property
    def finished(self) -> int:
        with self._lock:
            return sum(self.counts[s] for s in FINAL)

    @property
    def done(self) -> bool:
        return self.finished == self.total

    def throughput(self, now: float) -> float:
        """Tasks finished per second over the last ``window`` seconds."""
        with self._lock:
            return self._throughput(now)

    def _throughput(self, now: float) -> float:
        span = max(MIN_SPAN, min(self.window, now - self.origin))
        n = len(self._finished_at) - bisect.bisect_right(self._finished_at, now - span)
        return n / span

    def eta(self, now: float) -> Optional[float]:
        """Seconds until every task is final at the current throughput (None: no rate yet)."""
        with self._lock:
            return self._eta(now)

    def _eta(self, now: float) -> Optional[float]:
        remaining = self.total - sum(self.counts[s] for s in FINAL)
        if remaining == 0:
            return 0.0
        rate = self._throughput(now)
        return remaining / rate if rate > 0 else None

    def snapshot(self, now: float) -> dict[str, Any]:
        """Everything the views show, as plain data (the JSON of `--once --json`)."""
        with self._lock:
            finished = sum(self.counts[s] for s in FINAL)
            failed = sum(self.counts[s] for s in BAD)
            eta = self._eta(now)
            return {
                "total": self.total,
                "finished": finished,
                "succeeded": self.counts[TaskState.SUCCEEDED.value],
                "failed": failed,
                "remaining": self.total - finished,
                "states": {s: self.counts[s] for s in _ordered(self.counts)},
                "endpoints": {label: {s: c[s] for s in _ordered(c) if c[s]}
                              for label, c in sorted(self.per_endpoint.items())},
                "throughput": round(self._throughput(now), 3),
                "eta_seconds": None if eta is None else round(eta, 1),
                "elapsed_seconds": round(max(0.0, now - self.origin), 1),
                "failures": [asdict(f) for f in self.failures],
                "done": finished == self.total,
            }


def _ordered(counts: Iterable[str]) -> list[str]:
    """The lifecycle's states in order, then any state this SDK does not know yet."""
    return list(STATES) + sorted(set(counts) - set(STATES))


def exit_code(snap: dict[str, Any]) -> int:
    if snap["failed"]:
        return EXIT_FAILED
    return EXIT_OK if snap["done"] else EXIT_RUNNING


def summary(snap: dict[str, Any]) -> str:
    """One line: how many tasks ended how, and how long it took."""
    parts = [f"{n} {s}" for s, n in snap["states"].items() if n]
    head = f"{snap['total']} task{'s' if snap['total'] != 1 else ''}"
    if snap["done"]:
        verdict = "all succeeded" if not snap["failed"] else f"{snap['failed']} did not succeed"
        return f"{head}, {verdict}: {', '.join(parts)} ({snap['elapsed_seconds']:.1f} s)"
    return f"{head}, {snap['remaining']} not finished: {', '.join(parts)}"
