"""Task graphs in the hot task store: tasks WAITING for their inputs, their release once the
inputs SUCCEEDED, and the ends that flow along the edges (the scripts and key layout are in
graph_scripts). TaskStore combines this with the rest of the store."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from lambdas.adapters.redis_store.graph_scripts import RELEASE_SWEEP, RELEASE_TAKE, RELEASED, SETTLE, UNPARK, WAIT
from lambdas.adapters.redis_store.rows import Notice, decoded


@dataclass
class Released:
    """A dependent to send: its pack as stored at submission, its inputs and their results
    (opaque buffers; None for one that is gone, or for a parked task one not SUCCEEDED yet:
    its agent puts it in)."""
    task_id: str
    owner: str
    endpoint_id: str
    pack: dict[str, Any]
    inputs: list[str]
    results: list[str | None]
    parked: bool = False


def _notices(raw: Any) -> list[Notice]:
    out = []
    for owner, prev, entry, rows in raw or ():
        statuses = {decoded(r[0]): (decoded(r[1]), None, decoded(r[3]), decoded(r[2])) for r in rows}
        out.append(Notice(decoded(owner), decoded(prev), decoded(entry), list(statuses), statuses))
    return out


class TaskGraph:
    """The graph operations of TaskStore."""

    r: redis.Redis
    result_ttl: float
    unretrieved_ttl: float

    def _register_graph_scripts(self) -> None:
        self._wait = self.r.register_script(WAIT)
        self._settle = self.r.register_script(SETTLE)
        self._release_take = self.r.register_script(RELEASE_TAKE)
        self._released = self.r.register_script(RELEASED)
        self._release_sweep = self.r.register_script(RELEASE_SWEEP)
        self._unpark = self.r.register_script(UNPARK)

    def create_waiting(self, owner: str, submission_id: str, rows: list[list[Any]],
                       created: float, recent_max: int) -> tuple[int, int, list[Notice]]:
        """rows: [task_id, function_id, endpoint_id, max_retries, tag, [input task ids],
        pack JSON, parkable]; an input may be an earlier row. Returns (created, released at
        once or parked, notices of those ended at once because an input had failed, was
        cancelled or is gone)."""
        n, released, raw = self._wait(args=[orjson.dumps(rows), f"{created:.6f}", owner, submission_id, recent_max])
        return int(n), int(released), _notices(raw)

    def settle(self, limit: int = 1000) -> tuple[int, int, list[Notice], int]:
        """Tell the dependents of up to `limit` settled tasks. Returns (settled, released,
        notices of the dependents ended, settled tasks still waiting their turn)."""
        n, released, raw, left = self._settle(args=[f"{time.time():.6f}", limit, self.result_ttl,
                                                    self.unretrieved_ttl])
        return int(n), int(released), _notices(raw), int(left)

    def take_released(self, limit: int = 500, hold: float = 60.0) -> list[Released]:
        """Up to `limit` released dependents to send, each held for `hold` seconds: if they
        are not marked sent (mark_released) by then, RELEASE_SWEEP offers them again."""
        out = []
        for tid, owner, ep, pack, inputs, results, parked in self._release_take(
                args=[f"{time.time():.6f}", limit, hold, self.result_ttl, self.unretrieved_ttl]):
            out.append(Released(decoded(tid), decoded(owner), decoded(ep) or "", orjson.loads(pack),
                                decoded(inputs).split(","), [decoded(x) for x in results], bool(parked)))
        return out

    def unpark(self, task_ids: list[str], endpoint_id: str) -> int:
        """Parked dependents handed back by the agent of `endpoint_id` (tasks routed elsewhere
        are not its to hand back); returns how many are now to be sent again, with their
        inputs' results (the others wait for their inputs as usual)."""
        if not task_ids:
            return 0
        return int(self._unpark(args=[f"{time.time():.6f}", endpoint_id, *task_ids]))

    def mark_released(self, task_ids: list[str]) -> int:
        """The dependents were sent: their packs go and their inputs are unpinned."""
        if not task_ids:
            return 0
        return int(self._released(args=[self.result_ttl, self.unretrieved_ttl, *task_ids]))

    def sweep_releasing(self, limit: int = 5000) -> int:
        """Releases held past their time (their sender died) go back to be sent."""
        return int(self._release_sweep(args=[f"{time.time():.6f}", limit]))

    def graph_backlog(self) -> tuple[int, int]:
        """(settled tasks whose dependents were not told yet, released dependents not sent)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.llen("settled")
        pipe.llen("release")
        settled, release = pipe.execute()
        return int(settled), int(release)
