"""Manager placement by an aAPP policy inside the interchange (opt-in: `placement_policy`
in the endpoint config). The same engine as the service's endpoint groups
(skyfn.placement), here over the interchange's managers.

Workers of the policy are managers, named by their manager id; `*` means every
registered manager that can fit the task (cores, GPUs) and is not draining. A manager's
capacity is its worker count; what runs on it is the tasks the interchange has assigned
to it, by function tag (the tag travels in the TaskSpec). Its idle warm containers (from
its heartbeats) feed `warm_first`. The state is rebuilt from the interchange's own
records at each dispatch round — never drifts — and each placement in the round counts
on the previous ones. Without a policy the interchange keeps its built-in routing.

A task is placed only on a manager with a free worker (no prefetch beyond workers), so
that co-location is what affinity sees. One that cannot be placed waits for the next
round — a manager may free a worker, start or join — unless the policy itself refused
every manager (affinity or invalidate rules, nothing merely full or unknown): then the
task fails with the decision's reason, which is what `followup: fail` asks for.
"""
from __future__ import annotations

import collections
from typing import Any, Optional, Protocol

from skyfn.placement import LiveState, Policy, Scheduler, load_policy
from skyfn.placement.scheduler import CAPACITY, CONCURRENCY, FORBIDDEN, MISSING


class PlacedManager(Protocol):
    """What placement reads of a manager (the interchange's ManagerHandle, state.py)."""

    id: str
    identity: bytes
    workers: int
    credit: int
    assigned: Any
    warm: Any

    def fits(self, route: tuple) -> bool: ...


class PlacementHost(Protocol):
    """What placement reads and calls on the interchange (interchange.py). A Protocol, so
    this module imports nothing of the interchange: the interchange imports it."""

    tasks: dict
    pending: dict
    managers: dict
    n_pending: int

    def _fail_unfit(self, route: tuple, dq: collections.deque, live: list) -> None: ...

    def _send_tasks(self, m: Any, dq: collections.deque, n: int, route: tuple) -> None: ...

    def _add_result(self, rec: dict, pack: int) -> None: ...

    def _room(self) -> None: ...


POLICY_REFUSALS = frozenset({CAPACITY, CONCURRENCY, MISSING, FORBIDDEN})


def parse_policy(text: str) -> Policy:
    """Validate the endpoint config's `placement_policy` (raises PolicyError with lines)."""
    return load_policy(text, source="placement_policy")


class ManagerPlacement:
    def __init__(self, policy: Policy, seed: Optional[int] = None):
        self.policy = policy
        self.state = LiveState()
        self.scheduler = Scheduler(policy, self.state, seed=seed, respect_capacity=True)
        self.refused = 0   # tasks failed because the policy refused every manager

    def sync(self, live: list[PlacedManager], tasks: dict[int, list], route_field: int) -> None:
        """Mirror the managers: capacity, warm containers, assigned tasks by tag."""
        state = self.state
        ids = {m.id for m in live}
        for name in state.names():
            if name not in ids:
                state.remove(name)
        for m in live:
            counts: dict[str, int] = {}
            untagged = 0
            for key in m.assigned:
                t = tasks.get(key)
                route = t[route_field] if t is not None else ()
                tag = route[3] if len(route) > 3 else None
                if tag is None:
                    untagged += 1
                else:
                    counts[tag] = counts.get(tag, 0) + 1
            state.upsert(m.id, capacity=m.workers, online=True, warm=m.warm)
            state.set_running(m.id, counts, untagged=untagged)

    def dispatch(self, ix: PlacementHost, live: list[PlacedManager]) -> None:
        from endpoint_agent.task_record import T_ROUTE
        from endpoint_agent.wire import NO_CONTAINER

        self.sync(live, ix.tasks, T_ROUTE)
        by_id = {m.id: m for m in live}
        state = self.state
        for route, dq in list(ix.pending.items()):
            if not dq:
                continue
            if not any(m.fits(route) for m in live):
                ix._fail_unfit(route, dq, live)
                continue
            for m in live:
                state.upsert(m.id, online=m.fits(route))
            tag = route[3] if len(route) > 3 else None
            ctype = None if route[0] == NO_CONTAINER else route[0]
            chosen: dict[bytes, collections.deque] = {}
            while dq:
                key = dq[0]
                if key not in ix.tasks:  # cancelled while pending
                    dq.popleft()
                    continue
                d = self.scheduler.place(tag, container=ctype)
                if not d.ok:
                    codes = set().union(*(t.codes for t in d.trace))
                    if codes and codes <= POLICY_REFUSALS:
                        self._refuse(ix, dq, d.reason)
                    break
                m = by_id[d.worker]
                if m.credit - len(chosen.get(m.identity, ())) <= 0:
                    state.finished(m.id, tag)
                    break
                dq.popleft()
                chosen.setdefault(m.identity, collections.deque()).append(key)
            for ident, keys in chosen.items():
                m = ix.managers.get(ident)
                if m is not None:
                    ix._send_tasks(m, keys, len(keys), route)
                while keys:  # not sent (manager gone, socket error): back to the front
                    dq.appendleft(keys.pop())

    def _refuse(self, ix: PlacementHost, dq: collections.deque, reason: str) -> None:
        from endpoint_agent.task_record import fail_queued

        self.refused += fail_queued(ix, dq, f"placement: {reason}"[:2000], ix._add_result)
        ix._room()

    def snapshot(self) -> dict[str, Any]:
        return {"workers": self.state.snapshot(), "refused": self.refused}
