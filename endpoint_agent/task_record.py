"""The interchange's task record: a list indexed by these fields (a list, not an object,
because the hot path creates and reads one per task). Its own module so that the parts
that read records -- placement, staging -- need not import the interchange."""
from __future__ import annotations

import collections

from typing import Any, Callable

T_ID, T_FN, T_PAYLOAD, T_WALL, T_PACK, T_RECV, T_TRIES, T_ROUTE, T_MGR = range(9)


def new_record(task_id: str, function_id: str, payload: Any, walltime: float | None, pack: int,
               received: float, route: tuple) -> list:
    """A task record as it enters the interchange: no tries yet, on no manager. Fields in the
    order of the T_ names above (test_task_record.py holds the two together)."""
    return [task_id, function_id, payload, walltime, pack, received, 0, route, None]


def fail_queued(host: Any, dq: collections.deque, reason: str, add: Callable[[dict, int], None]) -> int:
    """Fail every task of `dq` that `host` (the interchange's state: `tasks`, `n_pending`) still
    holds, each as a FAILED record with `reason` given to `add(record, pack)`. Returns how many."""
    n = 0
    while dq:
        key = dq.popleft()
        t = host.tasks.pop(key, None)
        if t is None:
            continue
        host.n_pending -= 1
        n += 1
        add({"task_id": t[T_ID], "state": "FAILED", "reason": reason, "events": [["DISPATCHED", t[T_RECV]]]},
            t[T_PACK])
    return n
