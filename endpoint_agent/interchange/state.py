"""The interchange's shared state: what every part of the interchange reads and writes.

The interchange (interchange.py) is composed of parts with one job each: the intake of
task packs and cancels (intake.py), the manager registry and its supervision
(managers.py), dispatch to managers (dispatch.py) and result batching to the
outbox (results.py). They share one `IxState` -- the Interchange is one -- holding the
task records (endpoint_agent/task_record.py), the pending queues per route, the packs, the managers and
the counters. Its few methods are the bookkeeping every part needs: queueing a task key,
the load and the capacity, and telling the poller there is room.

The parts keep no reference to the state: their methods take it as their first
argument, so no reference cycle keeps an interchange (and its sockets) alive past its
last use. Imports go one way: this module imports no part, the parts import it (and one
another, without cycles), and only interchange.py imports the parts.
"""
from __future__ import annotations

import collections
import subprocess
import time
from typing import Any

from endpoint_agent import wire
from endpoint_agent.config import EndpointConfig
from endpoint_agent.direct.receipt import DirectReceipt
from endpoint_agent.service.outbox import Outbox
from endpoint_agent.task_record import T_ROUTE

PLAIN = (wire.NO_CONTAINER, 0, 0)  # route of a task with no container and no resources
LOCAL_BLOCK = "local"


class ManagerHandle:
    """The interchange's view of one manager."""

    def __init__(self, identity: bytes, proc: subprocess.Popen | None = None, slot: int | None = None):
        self.identity = identity
        self.id = identity.decode(errors="replace")
        self.proc = proc
        self.slot = slot              # index of a local manager the agent restarts
        self.registered = False
        self.credit = 0
        self.known: set[str] = set()   # function ids whose bodies it has
        self.assigned: set[int] = set()  # task keys it holds
        self.block = LOCAL_BLOCK if proc is not None else "?"
        self.hostname = ""
        self.pid = proc.pid if proc is not None else None
        self.workers = 0
        self.cores = 0
        self.accelerators: list[str] = []
        self.warm: dict[str, int] = {}
        self.containers: dict[str, int] = {}
        self.cold_starts = 0
        self.running: list[int] = []
        self.free_hb = 0
        self.worker_pids: list[int] = []
        self.draining = False
        self.last_busy: float | None = None  # monotonic time it last held a task
        self.started = time.monotonic()
        self.last_seen = time.monotonic()
        self.last_heartbeat: float | None = None  # wall clock

    def free_workers(self) -> int:
        return max(0, self.workers - len(self.assigned))

    def fits(self, route: tuple) -> bool:
        return route[1] <= self.cores and route[2] <= len(self.accelerators)

    def info(self) -> dict[str, Any]:
        return {"id": self.id, "block": self.block, "hostname": self.hostname, "pid": self.pid,
                "workers": self.workers, "free_workers": self.free_workers(), "running": len(self.running),
                "assigned": len(self.assigned), "warm": dict(self.warm), "containers": dict(self.containers),
                "cold_starts": self.cold_starts, "cores": self.cores, "accelerators": list(self.accelerators),
                "last_heartbeat": self.last_heartbeat, "draining": self.draining, "local": self.proc is not None,
                "worker_pids": list(self.worker_pids)}


class IxState:
    """The interchange's records. `router` is its ROUTER socket (every part sends on it,
    from the interchange's thread only); the addresses and the server key are what
    managers are started with."""

    def __init__(self, config: EndpointConfig, endpoint_id: str, outbox: Outbox, router: Any = None, *,
                 address: str = "", public_address: str = "", server_key: str | None = None):
        self.config = config
        self.endpoint_id = endpoint_id
        self.outbox = outbox
        self.router = router
        self.address = address                # what local managers connect to
        self.public_address = public_address  # what managers on other nodes connect to
        self.server_key = server_key          # CurveZMQ public key (Z85) when encrypted

        # from other threads: appended there, popped here (deque is thread-safe for that)
        self.handoff: collections.deque = collections.deque()
        self.control: collections.deque = collections.deque()
        self.given = 0   # tasks delivered by the poller (written by the poller thread only)
        self.taken = 0   # tasks taken from the handoff (written by the interchange's thread only)

        self.tasks: dict[int, list] = {}          # key -> task record (endpoint_agent/task_record.py)
        self.packs: dict[int, list] = {}          # seq -> [receipt, remaining, owner]
        self.direct_packs: dict[int, DirectReceipt] = {}  # seq -> receipt, of the packs from direct sessions
        self.direct_replies: dict[bytes, list[dict]] = {}  # SDK identity -> results to send it this step
        self.result_upload: dict | None = None    # presigned S3 form of the latest pack (large results)
        self.pending: dict[tuple, collections.deque] = {PLAIN: collections.deque()}
        self.n_pending = 0
        self.functions: dict[str, str] = {}

        self.managers: dict[bytes, ManagerHandle] = {}
        self.room_event = None  # set by the agent to the poller's event
        self.placement = None   # an aAPP ManagerPlacement (placement.py) instead of the built-in routing
        self.staging = None     # a TaskStaging (endpoint_agent/data/staging.py) when data: globus is configured
        self.parked = None      # the ParkedTasks (parked.py): dependents sent ahead of their inputs

        self.completed = 0
        self.failed = 0
        self.cancelled = 0
        self.received_packs = 0
        self.received_tasks = 0
        self.retried = 0
        self.managers_lost = 0
        self.roster = 0  # bumped when a manager registers or goes (status.json is rewritten)
        self.closing = False

    def pend(self, key: int, t: list) -> None:
        """The task `key` (record `t`) waits for a manager on its route's queue."""
        dq = self.pending.get(t[T_ROUTE])
        if dq is None:
            dq = self.pending[t[T_ROUTE]] = collections.deque()
        dq.append(key)
        self.n_pending += 1

    def _pend_front(self, key: int, t: list) -> None:
        dq = self.pending.get(t[T_ROUTE])
        if dq is None:
            dq = self.pending[t[T_ROUTE]] = collections.deque()
        dq.appendleft(key)
        self.n_pending += 1

    def load(self) -> int:
        """Tasks held: received and without a result sent to the outbox yet."""
        return len(self.tasks) + (self.given - self.taken)

    def capacity(self) -> int:
        """Tasks the agent should hold: every connected worker plus the prefetch."""
        workers = sum(m.workers for m in list(self.managers.values()) if m.registered and not m.draining)
        return max(self.config.capacity, workers + int(self.config.prefetch or 0))

    def _room(self) -> None:
        ev = self.room_event
        if ev is not None and not ev.is_set() and self.load() < self.capacity():
            ev.set()

