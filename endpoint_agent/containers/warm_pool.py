"""The warm pool policy (funcX section 6.2): pure bookkeeping, no processes, no clock of
its own (every method takes `now`), so it is deterministic under test.

A manager with N worker slots asks `place(ctype, now)` for a task of container type
`ctype` (None: a plain worker). In order:
1. an idle worker already warm for `ctype` (the most recently used one)  -> WARM
2. an empty slot: cold-start `ctype` there                                -> COLD
3. the least-recently-used *idle* worker of another type is evicted and
   `ctype` cold-started in its slot (types above their share first)      -> EVICT
4. otherwise (all busy, or `max_per_type` reached) the task waits         -> None
A busy worker is never evicted. `release()` makes a worker idle again; `expire(now)`
returns idle workers idle longer than `idle_timeout` (to be stopped).

Proportional sizing: every task seen is counted per type with exponential decay
(half-life `half_life` s). `targets(now)` shares the N slots among types in proportion
to these counts (largest remainder, capped by `max_per_type`); eviction prefers workers
whose type holds more slots than its target, and `prewarm(now)` proposes cold starts of
under-served types in empty slots (after expiry, or at start).

`schedule(queue, now)` assigns queued tasks to slots, warm matches first (a task whose
type has an idle warm worker jumps ahead of older tasks that would need a cold start),
then types with no worker at all, then extra workers for a type only when its queued
work per worker exceeds a cold start (`note_task`/`note_cold_start` feed the estimates);
the oldest task is served first once it has waited `max_wait`.

`choose_manager()` is the interchange's side: a task of type C goes to a manager with
an idle warm C and the most free workers, else to the manager with the most free workers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Mapping, Optional, Sequence

WARM = "warm"
COLD = "cold"
EVICT = "evict"

EMPTY = "empty"
IDLE = "idle"
BUSY = "busy"


@dataclass
class SlotState:
    index: int
    state: str = EMPTY
    ctype: Optional[str] = None
    last_used: float = 0.0
    started_at: float = 0.0
    tasks: int = 0


@dataclass(frozen=True)
class Decision:
    action: str                    # WARM | COLD | EVICT
    slot: int
    ctype: Optional[str]
    evicted: Optional[str] = None  # the type stopped in that slot (EVICT)


@dataclass
class PoolStats:
    warm_hits: int = 0
    cold_starts: int = 0
    evictions: int = 0
    expirations: int = 0
    prewarms: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class WarmPool:
    def __init__(self, slots: int, idle_timeout: float = 300.0, half_life: float = 60.0,
                 max_per_type: Optional[int] = None, max_wait: float = 60.0, cold_start_s: float = 1.0):
        if slots < 1:
            raise ValueError("slots must be >= 1")
        self.slots = [SlotState(i) for i in range(slots)]
        self.idle_timeout = idle_timeout
        self.half_life = half_life
        self.max_per_type = max_per_type
        self.max_wait = max_wait
        self.demand: dict[Optional[str], float] = {}
        self._demand_at = None  # time the counts were last decayed to
        self.stats = PoolStats()
        self.est_cold = cold_start_s          # EWMA of measured cold starts (note_cold_start)
        self.est_task: dict[Optional[str], float] = {}  # EWMA of task run times per type (note_task)

    def note_cold_start(self, seconds: float) -> None:
        self.est_cold = 0.7 * self.est_cold + 0.3 * seconds if self._cold_seen else seconds
        self._cold_seen = True

    _cold_seen = False

    def note_task(self, ctype: Optional[str], seconds: float) -> None:
        old = self.est_task.get(ctype)
        self.est_task[ctype] = seconds if old is None else 0.8 * old + 0.2 * seconds

    def worth_another(self, ctype: Optional[str], queued: int) -> bool:
        """Start one more worker of `ctype` (whose workers are all busy) for `queued`
        waiting tasks? Yes when their run time spread over the existing workers exceeds a
        cold start; yes while the run time is unknown."""
        n = self.count(ctype)
        if n == 0:
            return True
        est = self.est_task.get(ctype)
        if est is None:
            return True
        return queued * est / n > self.est_cold

    # --- demand ------------------------------------------------------------------
    def _decay(self, now: float) -> None:
        if self._demand_at is not None and now > self._demand_at and self.demand:
            f = 0.5 ** ((now - self._demand_at) / self.half_life)
            for k in list(self.demand):
                self.demand[k] *= f
                if self.demand[k] < 1e-6:
                    del self.demand[k]
        if self._demand_at is None or now > self._demand_at:
            self._demand_at = now

    def observe(self, ctype: Optional[str], now: float, n: int = 1) -> None:
        """Count `n` tasks of `ctype` received at `now` (decayed demand)."""
        self._decay(now)
        self.demand[ctype] = self.demand.get(ctype, 0.0) + n

    def targets(self, now: float) -> dict[Optional[str], int]:
        """Slots per type in proportion to decayed demand (largest remainder, capped)."""
        self._decay(now)
        total = sum(self.demand.values())
        n = len(self.slots)
        if total <= 0:
            return {}
        cap = self.max_per_type or n
        quota = {k: min(cap, n * v / total) for k, v in self.demand.items()}
        out = {k: int(math.floor(q)) for k, q in quota.items()}
        left = n - sum(out.values())
        order = sorted(quota, key=lambda k: (-(quota[k] - out[k]), -self.demand[k], str(k)))
        for k in order:
            if left <= 0:
                break
            if out[k] < cap and quota[k] - out[k] > 0:
                out[k] += 1
                left -= 1
        return {k: v for k, v in out.items() if v > 0}

    # --- queries -------------------------------------------------------------------
    def count(self, ctype: Optional[str]) -> int:
        return sum(1 for s in self.slots if s.state != EMPTY and s.ctype == ctype)

    def warm_idle(self) -> dict[Optional[str], int]:
        out: dict[Optional[str], int] = {}
        for s in self.slots:
            if s.state == IDLE:
                out[s.ctype] = out.get(s.ctype, 0) + 1
        return out

    def free(self) -> int:
        return sum(1 for s in self.slots if s.state != BUSY)

    def advertise(self) -> dict:
        """What a manager tells the interchange: free workers and idle warm ones per type."""
        return {"free": self.free(), "warm": {("" if k is None else k): v for k, v in self.warm_idle().items()}}

    # --- decisions -----------------------------------------------------------------
    def place(self, ctype: Optional[str], now: float) -> Optional[Decision]:
        """Choose a slot for one task of `ctype` and mark it busy; None: the task must wait."""
        d = self.peek(ctype, now)
        if d is not None:
            self.commit(d, now)
        return d

    def peek(self, ctype: Optional[str], now: float) -> Optional[Decision]:
        warm = [s for s in self.slots if s.state == IDLE and s.ctype == ctype]
        if warm:
            s = max(warm, key=lambda s: (s.last_used, -s.index))
            return Decision(WARM, s.index, ctype)
        if self.max_per_type is not None and self.count(ctype) >= self.max_per_type:
            return None
        empty = [s for s in self.slots if s.state == EMPTY]
        if empty:
            return Decision(COLD, empty[0].index, ctype)
        victims = [s for s in self.slots if s.state == IDLE and s.ctype != ctype]
        if not victims:
            return None
        targets = self.targets(now)
        surplus = {}
        for s in victims:
            surplus.setdefault(s.ctype, self.count(s.ctype) - targets.get(s.ctype, 0))
        over = [s for s in victims if surplus[s.ctype] > 0]
        pool = over or victims
        v = min(pool, key=lambda s: (s.last_used, s.index))
        return Decision(EVICT, v.index, ctype, evicted=v.ctype)

    def commit(self, d: Decision, now: float) -> None:
        s = self.slots[d.slot]
        if d.action == WARM:
            self.stats.warm_hits += 1
        else:
            self.stats.cold_starts += 1
            if d.action == EVICT:
                self.stats.evictions += 1
            s.started_at = now
            s.tasks = 0
        s.state = BUSY
        s.ctype = d.ctype
        s.last_used = now
        s.tasks += 1

    def release(self, slot: int, now: float) -> None:
        """The task in `slot` is done: its worker stays warm, idle."""
        s = self.slots[slot]
        if s.state == BUSY:
            s.state = IDLE
            s.last_used = now

    def remove(self, slot: int) -> None:
        """The worker in `slot` is gone (died, stopped): the slot is empty."""
        s = self.slots[slot]
        s.state, s.ctype, s.tasks = EMPTY, None, 0

    def start_idle(self, slot: int, ctype: Optional[str], now: float) -> None:
        """A worker of `ctype` was started in an empty slot without a task (pre-warm)."""
        s = self.slots[slot]
        if s.state != EMPTY:
            raise ValueError(f"slot {slot} is {s.state}")
        s.state, s.ctype, s.last_used, s.started_at, s.tasks = IDLE, ctype, now, now, 0
        self.stats.prewarms += 1
        self.stats.cold_starts += 1

    def expire(self, now: float) -> list[int]:
        """Idle workers idle longer than idle_timeout, to be stopped (their slots become
        empty), least recently used first. Busy workers never expire."""
        stale = sorted((s for s in self.slots if s.state == IDLE and now - s.last_used > self.idle_timeout),
                       key=lambda s: (s.last_used, s.index))
        out = []
        for s in stale:
            out.append(s.index)
            self.remove(s.index)
            self.stats.expirations += 1
        return out

    def prewarm(self, now: float) -> list[tuple[int, Optional[str]]]:
        """(slot, type) cold starts proposed for empty slots, for types below their target
        (most under-served first). The caller starts them and calls start_idle()."""
        targets = self.targets(now)
        empty = [s.index for s in self.slots if s.state == EMPTY]
        deficit = {k: t - self.count(k) for k, t in targets.items() if t - self.count(k) > 0}
        out = []
        while empty and deficit:
            k = max(deficit, key=lambda k: (deficit[k], self.demand.get(k, 0.0), str(k)))
            out.append((empty.pop(0), k))
            deficit[k] -= 1
            if deficit[k] <= 0:
                del deficit[k]
        return out

    def schedule(self, queue: Sequence[tuple[Optional[str], float]], now: float,
                 lookahead: int = 256) -> list[tuple[int, Decision]]:
        """Assign queued tasks [(ctype, enqueued_at), ...] (oldest first) to slots and mark
        them busy. Returns [(queue index, decision)]. Warm matches first within
        `lookahead`; then cold starts/evictions in queue order; a task that waited
        `max_wait` or more goes before any warm match."""
        out: list[tuple[int, Decision]] = []
        taken: set[int] = set()
        window = range(min(len(queue), lookahead))
        for i in window:  # tasks that waited max_wait or more first, oldest first
            ctype, t0 = queue[i]
            if now - t0 < self.max_wait:
                break
            if self.free() == 0:
                return out
            d = self.place(ctype, now)
            if d is not None:
                out.append((i, d))
                taken.add(i)
        for i in window:  # warm matches
            if i in taken:
                continue
            ctype = queue[i][0]
            if any(s.state == IDLE and s.ctype == ctype for s in self.slots):
                d = self.place(ctype, now)
                if d is not None:
                    out.append((i, d))
                    taken.add(i)
        # the rest: types without any worker first (oldest first), then more workers for
        # types whose backlog outweighs a cold start (worth_another)
        queued: dict[Optional[str], int] = {}
        for i in window:
            if i not in taken:
                queued[queue[i][0]] = queued.get(queue[i][0], 0) + 1
        order = [i for i in window if i not in taken and self.count(queue[i][0]) == 0]
        order += [i for i in window if i not in taken and self.count(queue[i][0]) > 0]
        seen: set[int] = set()
        for i in order:
            if i in seen:
                continue
            seen.add(i)
            if not any(s.state in (IDLE, EMPTY) for s in self.slots):
                break
            ctype = queue[i][0]
            if not self.worth_another(ctype, queued[ctype]):
                continue
            d = self.place(ctype, now)
            if d is not None:
                out.append((i, d))
                taken.add(i)
                queued[ctype] -= 1
        return out


# --- the interchange's side ------------------------------------------------------------
@dataclass
class ManagerView:
    free: int                                   # workers not running a task
    warm: Mapping[str, int] = field(default_factory=dict)  # idle warm workers per type ("" = plain)


def choose_manager(managers: Mapping[Hashable, ManagerView], ctype: Optional[str],
                   exclude: Iterable[Hashable] = ()) -> Optional[Hashable]:
    """Warming-aware routing: the manager with an idle warm `ctype` and the most free
    workers; else the manager with the most free workers; None when no manager has a
    free worker. Ties go to the smallest key (deterministic)."""
    key = "" if ctype is None else ctype
    skip = set(exclude)
    cands = [(m, v) for m, v in managers.items() if m not in skip and v.free > 0]
    if not cands:
        return None
    warm = [(m, v) for m, v in cands if v.warm.get(key, 0) > 0]
    pool = warm or cands
    return min(pool, key=lambda mv: (-mv[1].free, str(mv[0])))[0]
