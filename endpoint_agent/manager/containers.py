"""Containers in the manager: its `containers` settings and the warm-pool choice.

Worker slots have a container type ("none": a plain process). `configure` reads the
settings the agent passes (`--containers JSON`): the routing ("warm": a task goes to an
idle worker of its type, else the warm pool may turn an idle worker of another type into
one -- a cold start; "random": funcX's baseline, each task bound to a random slot), the
idle timeout of a warm container, and the runtime that wraps worker commands (from
endpoint_agent.containers when present). `SimplePool` is the warm-pool choice of which
idle worker to convert.
"""
from __future__ import annotations

import collections
import logging
import random
import time
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # pragma: no cover
    from endpoint_agent.manager.state import WorkerProc

log = logging.getLogger("skyfn.manager")


class SimplePool:
    """The manager's warm-pool choice for a chunk-based worker pool: reuse an idle worker of
    the type; else turn the least recently used idle worker of another type into one, types
    above their share first, never one whose type still has a backlog and no more than its
    share. Shares are proportional to the tasks received per type; with
    endpoint_agent.containers present its WarmPool's decayed demand (`targets`) is used."""

    def __init__(self, slots: int = 1, half_life: float = 60.0) -> None:
        self.received: collections.Counter = collections.Counter()
        self.cold_starts = 0
        self.demand = None
        try:
            from endpoint_agent.containers.warm_pool import WarmPool

            self.demand = WarmPool(max(1, slots), half_life=half_life)
        except Exception:  # noqa: BLE001 - plain counts then
            self.demand = None

    def note(self, ctype: str, n: int) -> None:
        self.received[ctype] += n
        if self.demand is not None:
            self.demand.observe(ctype, time.monotonic(), n)

    def shares(self, total: int) -> dict[str, int]:
        if self.demand is not None:
            return {k: v for k, v in self.demand.targets(time.monotonic()).items()}
        total_recv = sum(self.received.values()) or 1
        return {k: max(1, round(total * v / total_recv)) for k, v in self.received.items()}

    def victim(self, ctype: str, idle: list["WorkerProc"], counts: dict[str, int], backlog: dict[str, int],
               total: int) -> "WorkerProc | None":
        shares = self.shares(total)
        cands = sorted((w for w in idle if w.ctype != ctype), key=lambda w: w.last_used)  # LRU first
        over = [w for w in cands if counts.get(w.ctype, 0) > shares.get(w.ctype, 0)]
        for w in over + cands:
            if not backlog.get(w.ctype) or w in over or counts.get(ctype, 0) == 0:
                return w
        return None


class ContainerSetup(NamedTuple):
    idle_timeout: float
    routing: str
    rng: random.Random
    runtime: Any       # an endpoint_agent.containers runtime, or None: plain processes
    pool: SimplePool


def configure(settings: dict[str, Any], n_workers: int) -> ContainerSetup:
    """The manager's container setup from its settings ({} when none are configured)."""
    idle_timeout = float(settings.get("idle_timeout", 300.0))
    routing = settings.get("routing") or "warm"
    if routing not in ("warm", "random"):
        log.error("containers.routing %r is not one of: warm, random; using warm", routing)
        routing = "warm"
    rng = random.Random(settings.get("routing_seed"))
    pool = SimplePool(n_workers, float(settings.get("demand_half_life", 60.0)))
    if not settings:
        return ContainerSetup(idle_timeout, routing, rng, None, pool)
    try:
        from endpoint_agent.containers import runtime_from_settings
    except ImportError:
        log.error("containers configured but endpoint_agent.containers is missing; workers run without them")
        return ContainerSetup(idle_timeout, routing, rng, None, pool)
    try:
        runtime = runtime_from_settings(settings)
    except Exception as exc:  # noqa: BLE001 - ContainerError / ContainerConfigError say why
        log.error("container runtime unusable (%s); workers run without containers", exc)
        runtime = None
    return ContainerSetup(idle_timeout, routing, rng, runtime, pool)
