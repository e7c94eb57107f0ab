"""The lanes a privileged process has closed, watched for a while: the service may have been
sending a task to a lane as it closed it (a submission that read the binding just before),
so what arrives in a closed lane's queue is taken back and routed again by the router.

A lane is closed when its agent is given up or backed off, at start for agents of an earlier
run that no longer run, and when its agent has been idle for `lane_idle_timeout`
(user_agents.py). Hundreds of lanes may close at once (every idle user of a site), so a
closed lane is not read every supervision round: it is looked at when closed, then after
FIRST_LOOK_S, and at doubling gaps until WATCH_S have passed -- eight reads per lane, not one
every 0.5 s for a minute. A lane bound again (the user's next task) leaves the watch
(`take`): the caller takes back what is left in it before binding.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

from skyfn.protocol.queues.base import TaskQueue

WATCH_S = 60.0       # a closed lane's queue is looked at for this long
FIRST_LOOK_S = 0.5   # the gap after the first look; each next gap is twice the last


@dataclass
class _Watch:
    queue: TaskQueue
    until: float
    next_at: float
    gap: float


class ClosedLanes:
    """lane name -> its queue, with when to look at it next (see the module docstring). Used
    under the user agents' lock (UserAgents.lock)."""

    def __init__(self, watch_s: float = WATCH_S, clock: Callable[[], float] = time.monotonic):
        self.watch_s = watch_s
        self.clock = clock
        self._lanes: dict[str, _Watch] = {}

    def add(self, lane: str, queue: TaskQueue) -> None:
        now = self.clock()
        self._lanes[lane] = _Watch(queue, now + self.watch_s, now, FIRST_LOOK_S)

    def take(self, lane: str) -> Optional[TaskQueue]:
        """The queue of `lane` if it is watched, no longer watched (it is about to be bound again)."""
        watch = self._lanes.pop(lane, None)
        return watch.queue if watch is not None else None

    def due(self) -> list[TaskQueue]:
        """The queues to look at now; a lane whose watch has ended leaves after this last look."""
        now = self.clock()
        out = []
        for lane, watch in list(self._lanes.items()):
            if now < watch.next_at:
                continue
            out.append(watch.queue)
            if now >= watch.until:
                self._lanes.pop(lane, None)
            else:
                watch.next_at = min(now + watch.gap, watch.until)
                watch.gap *= 2
        return out

    def __len__(self) -> int:
        return len(self._lanes)

    def __contains__(self, lane: str) -> bool:
        return lane in self._lanes
