"""Live placement state: per worker, its slots, what runs on it (by tag), its backlog and
its warm containers. Updated as tasks start and finish; safe to share between threads.

A "worker" is whatever the scheduler places on: an endpoint at service level, a manager
inside an endpoint's interchange. `running` counts invocations started and not finished
(the concurrent invocations); `tags` splits them by function tag; `queued` is work waiting
for the worker that has not started (its queue depth). Every mutation and every decision
(scheduler.py) holds `lock`, so a decision never sees half an update.
"""
from __future__ import annotations

import threading
from typing import Any, Iterable, Mapping, Optional


class WorkerState:
    __slots__ = ("name", "capacity", "running", "queued", "tags", "warm", "online", "pos")

    def __init__(self, name: str, capacity: int = 0, online: bool = True):
        self.name = name
        self.pos = 0                  # index in LiveState.order
        self.capacity = capacity      # slots; 0 = unknown (capacity thresholds do not apply)
        self.running = 0
        self.queued = 0
        self.tags: dict[str, int] = {}
        self.warm: dict[str, int] = {}  # container type -> idle warm containers
        self.online = online

    @property
    def backlog(self) -> int:
        return self.queued + self.running

    def capacity_used(self) -> Optional[float]:
        """Percent of slots in use, or None when the capacity is unknown."""
        return self.running * 100.0 / self.capacity if self.capacity else None

    def as_dict(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "running": self.running, "queued": self.queued,
                "tags": {t: n for t, n in self.tags.items() if n}, "warm": {t: n for t, n in self.warm.items() if n},
                "online": self.online}

    def __repr__(self) -> str:
        return f"WorkerState({self.name!r}, {self.as_dict()})"


class LiveState:
    """Workers in registration order (the order `*` and best_first use)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.workers: dict[str, WorkerState] = {}
        self.order: list[WorkerState] = []
        self.version = 0  # bumped when workers join or leave; schedulers cache name lookups on it
        # tag -> workers running at least one invocation with that tag: lets the scheduler
        # visit only those workers for a block with a positive affinity
        self.by_tag: dict[str, set[WorkerState]] = {}

    # --- membership ------------------------------------------------------------------
    def upsert(self, name: str, *, capacity: Optional[int] = None, online: Optional[bool] = None,
               queued: Optional[int] = None, warm: Optional[Mapping[str, int]] = None) -> None:
        with self.lock:
            w = self._get_or_add(name)
            if capacity is not None:
                if capacity < 0:
                    raise ValueError(f"worker {name!r}: capacity must be >= 0, got {capacity}")
                w.capacity = capacity
            if online is not None:
                w.online = online
            if queued is not None:
                w.queued = max(0, queued)
            if warm is not None:
                w.warm = {t: n for t, n in warm.items() if n > 0}

    def remove(self, name: str) -> bool:
        with self.lock:
            w = self.workers.pop(name, None)
            if w is None:
                return False
            self.order.remove(w)
            for i, other in enumerate(self.order):
                other.pos = i
            for tag in w.tags:
                self.by_tag.get(tag, set()).discard(w)
            self.version += 1
            return True

    def _get_or_add(self, name: str) -> WorkerState:
        w = self.workers.get(name)
        if w is None:
            w = self.workers[name] = WorkerState(name)
            w.pos = len(self.order)
            self.order.append(w)
            self.version += 1
        return w

    # --- task lifecycle --------------------------------------------------------------
    def started(self, name: str, tag: Optional[str] = None) -> None:
        """An invocation (of a function tagged `tag`, or untagged) began on worker `name`."""
        with self.lock:
            self._start(self._get_or_add(name), tag)

    def _start(self, w: WorkerState, tag: Optional[str]) -> None:
        """Record a start; the caller holds the lock."""
        w.running += 1
        if tag is not None:
            n = w.tags.get(tag, 0)
            w.tags[tag] = n + 1
            if not n:
                holders = self.by_tag.get(tag)
                if holders is None:
                    holders = self.by_tag[tag] = set()
                holders.add(w)

    def finished(self, name: str, tag: Optional[str] = None) -> bool:
        """An invocation ended. False (and no change) when none was recorded as running,
        so a duplicate completion (at-least-once delivery) cannot drive counts negative."""
        with self.lock:
            w = self.workers.get(name)
            if w is None or w.running <= 0:
                return False
            if tag is not None:
                n = w.tags.get(tag, 0)
                if n <= 0:
                    return False
                if n == 1:
                    del w.tags[tag]
                    self.by_tag[tag].discard(w)
                else:
                    w.tags[tag] = n - 1
            w.running -= 1
            return True

    def set_running(self, name: str, tags: Mapping[str, int], untagged: int = 0) -> None:
        """Replace what runs on `name` with counts read elsewhere (e.g. the service's counters)."""
        with self.lock:
            w = self._get_or_add(name)
            for tag in w.tags:
                self.by_tag[tag].discard(w)
            w.tags = {t: int(n) for t, n in tags.items() if int(n) > 0}
            for tag in w.tags:
                self.by_tag.setdefault(tag, set()).add(w)
            w.running = sum(w.tags.values()) + max(0, untagged)

    def set_queued(self, name: str, queued: int) -> None:
        with self.lock:
            self._get_or_add(name).queued = max(0, queued)

    def set_warm(self, name: str, warm: Mapping[str, int]) -> None:
        with self.lock:
            self._get_or_add(name).warm = {t: n for t, n in warm.items() if n > 0}

    # --- reading ---------------------------------------------------------------------
    def names(self) -> list[str]:
        with self.lock:
            return [w.name for w in self.order]

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return {w.name: w.as_dict() for w in self.order}

    def __len__(self) -> int:
        return len(self.order)

    @classmethod
    def from_mapping(cls, data: Any, source: str = "state") -> "LiveState":
        """Build a state from `{workers: {name: {capacity, running, queued, tags, warm, online}}}`
        (or the inner mapping alone, or a list of `{name: ..., ...}`), as `skyfn policy check
        --state` reads it. `running` defaults to the sum of `tags`. Errors name the worker and field."""
        if isinstance(data, Mapping) and "workers" in data:
            data = data["workers"]
        items: Iterable[tuple[str, Any]]
        if isinstance(data, Mapping):
            items = data.items()
        elif isinstance(data, list):
            items = []
            for i, entry in enumerate(data, 1):
                if not isinstance(entry, Mapping) or "name" not in entry:
                    raise ValueError(f"{source}: worker #{i} needs a 'name'")
                items.append((str(entry["name"]), {k: v for k, v in entry.items() if k != "name"}))
        else:
            raise ValueError(f"{source}: expected a map of workers (`workers: {{w1: {{capacity: 4}}}}`)")
        state = cls()
        allowed = {"capacity", "running", "queued", "tags", "warm", "online"}
        for name, spec in items:
            spec = spec or {}
            if not isinstance(spec, Mapping):
                raise ValueError(f"{source}: worker {name!r}: expected a map of fields ({', '.join(sorted(allowed))})")
            unknown = set(spec) - allowed
            if unknown:
                raise ValueError(f"{source}: worker {name!r}: unknown field(s) {', '.join(sorted(unknown))} "
                                 f"(expected {', '.join(sorted(allowed))})")

            def count(field: str, value: Any) -> int:
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"{source}: worker {name!r}: {field} must be a whole number >= 0, got {value!r}")
                return value

            def counts(field: str) -> dict[str, int]:
                value = spec.get(field) or {}
                if isinstance(value, list):  # `tags: [init, query]` = one of each
                    out: dict[str, int] = {}
                    for t in value:
                        out[str(t)] = out.get(str(t), 0) + 1
                    return out
                if not isinstance(value, Mapping):
                    raise ValueError(f"{source}: worker {name!r}: {field} must map names to counts")
                return {str(t): count(f"{field}.{t}", n) for t, n in value.items()}

            tags = counts("tags")
            tagged = sum(tags.values())
            running = count("running", spec.get("running", tagged))
            if running < tagged:
                raise ValueError(f"{source}: worker {name!r}: running={running} is less than the {tagged} "
                                 f"tagged invocations listed in tags")
            online = spec.get("online", True)
            if not isinstance(online, bool):
                raise ValueError(f"{source}: worker {name!r}: online must be true or false")
            state.upsert(name, capacity=count("capacity", spec.get("capacity", 0)), online=online,
                         queued=count("queued", spec.get("queued", 0)), warm=counts("warm"))
            state.set_running(name, tags, untagged=running - tagged)
        return state
