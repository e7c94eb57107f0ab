"""The arithmetic of `skyfn task watch`: the state of each watched task, counts per state
and per endpoint, throughput over a sliding window, the ETA, the last failures, and the time
tasks with inputs spent WAITING for them (their "waiting" stage: WAITING -> the QUEUED that
released them, read from their events; skyfn.protocol.dataflow).

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
WAITING = TaskState.WAITING.value  # for its inputs

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
        self.waits: dict[str, tuple[float, Optional[float]]] = {}  # task -> (WAITING, released or None)
        self._unreleased: set[str] = set()  # seen past WAITING, but not when (read without events)

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
            wait = self.waits.get(task_id)
            if wait is not None and wait[1] is None and state != WAITING:
                self._unreleased.add(task_id)
            if state in FINAL and finished_at is not None:
                bisect.insort(self._finished_at, finished_at)
            if state in BAD:
                self.failures.append(Failure(task_id, state, label, reason or state.lower().replace("_", " ")))
            return True

    def note_wait(self, task_id: str, start: float, end: Optional[float]) -> None:
        """What a task's events (read with its state) say of its wait for inputs
        (``wait_span``); a known end is kept."""
        with self._lock:
            if task_id in self.state and (end is not None or self.waits.get(task_id, (0, None))[1] is None):
                self.waits[task_id] = (start, end)
            self._unreleased.discard(task_id)  # its events are read: nothing more to ask

    def take_unreleased(self) -> list[str]:
        """Tasks seen leaving WAITING by a read without events (so not when): whose events
        to read once. A task that never was released (its input failed) is asked once."""
        with self._lock:
            out, self._unreleased = sorted(self._unreleased), set()
            return out

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
                "waits": self._waits(now),
                "done": finished == self.total,
            }

    def _waits(self, now: float) -> dict[str, Any]:
        """The waiting stage over the tasks whose wait is known: those released (WAITING ->
        QUEUED) and, so far, those still WAITING. A task seen past WAITING without the events
        telling when is left out until they do."""
        spans = []
        for tid, (start, end) in self.waits.items():
            if end is not None:
                spans.append(end - start)
            elif self.state[tid] == WAITING:
                spans.append(now - start)
        spans = [max(0.0, s) for s in spans]
        return {"tasks": len(spans), "mean_seconds": round(sum(spans) / len(spans), 3) if spans else None,
                "max_seconds": round(max(spans), 3) if spans else None}


def _ordered(counts: Iterable[str]) -> list[str]:
    """The lifecycle's states in order, then any state this SDK does not know yet."""
    return list(STATES) + sorted(set(counts) - set(STATES))


def exit_code(snap: dict[str, Any]) -> int:
    if snap["failed"]:
        return EXIT_FAILED
    return EXIT_OK if snap["done"] else EXIT_RUNNING


def seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 60 else f"{int(value // 60)} min {int(value % 60):02d} s"


def waits_text(snap: dict[str, Any]) -> Optional[str]:
    """The waiting stage in words ("waited for inputs: 3 tasks, mean 1.2 s, max 2.0 s"), or
    None when no watched task waited for inputs."""
    w = snap.get("waits") or {}
    if not w.get("tasks"):
        return None
    return (f"waited for inputs: {w['tasks']} task{'s' if w['tasks'] != 1 else ''}, "
            f"mean {seconds(w['mean_seconds'])}, max {seconds(w['max_seconds'])}")


def summary(snap: dict[str, Any]) -> str:
    """One line: how many tasks ended how, how long it took, and how long they waited for inputs."""
    parts = [f"{n} {s}" for s, n in snap["states"].items() if n]
    head = f"{snap['total']} task{'s' if snap['total'] != 1 else ''}"
    waited = waits_text(snap)
    tail = f"; {waited}" if waited else ""
    if snap["done"]:
        verdict = "all succeeded" if not snap["failed"] else f"{snap['failed']} did not succeed"
        return f"{head}, {verdict}: {', '.join(parts)} ({snap['elapsed_seconds']:.1f} s){tail}"
    return f"{head}, {snap['remaining']} not finished: {', '.join(parts)}{tail}"
