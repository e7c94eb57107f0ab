"""Task graphs in the hot task store (skyfn.protocol.dataflow): tasks WAITING for their
inputs, the edges between them, their release once the inputs SUCCEEDED, and the failures
and cancels that flow along the edges. Their scripts are lua/wait.lua, settle.lua,
release_take.lua, released.lua, release_sweep.lua and unpark.lua. TaskStore combines this
with the rest of the store.

Keys and fields (besides the package docstring's):
  t:<task>   in  the task's inputs, comma-separated, in placeholder order
             dn  inputs not yet SUCCEEDED (while WAITING)
             wp  what its pack needs once released (JSON, never parsed in Lua), until sent
             wd  1 while it has dependents not yet told of its end
             pn  unreleased dependents that will read its result: while above 0 the record
                 gets no expiry (a read or its archival would otherwise start one)
             pk  1 while the dependent is parked: sent to its endpoint ahead of its inputs,
                 which all run there, for the agent to release (it keeps wp and its pins
                 until it ends, or until the agent hands it back: unpark)
  w:<task>   list of the dependents waiting for it (one entry per edge)
  settled    list of tasks with dependents that reached a final state: settle tells the
             dependents (release on SUCCEEDED; FAILED / CANCELLED along the edges otherwise)
  release    list of dependents whose inputs all SUCCEEDED (now QUEUED), to send; and of
             parked dependents (still WAITING), to send ahead
  releasing  zset task -> deadline: taken by a sender; back to `release` if not sent by then

Everything a client adds here has an owner that ends it: a dependent ends with its inputs'
ends, `w:` goes when its task settles, a pin when its dependent is sent or ends.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import orjson
import redis

from lambdas.adapters.redis_store import lua_files, lua_rows
from lambdas.adapters.redis_store.lua_rows import EndedRow, NoticeRow, ReleasedRow, WaitRow
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
    for n in map(NoticeRow._make, raw or ()):
        statuses = {}
        for e in map(EndedRow._make, n.ended):
            statuses[decoded(e.task_id)] = (decoded(e.state), None, decoded(e.error), decoded(e.reason))
        out.append(Notice(decoded(n.owner), decoded(n.prev), decoded(n.cursor), list(statuses), statuses))
    return out


def _as_released(raw: Any) -> Released:
    r = ReleasedRow._make(raw)
    return Released(decoded(r.task_id), decoded(r.owner), decoded(r.endpoint_id) or "", orjson.loads(r.pack),
                    decoded(r.inputs).split(","), [decoded(x) for x in r.results], bool(r.parked))


class TaskGraph:
    """The graph operations of TaskStore."""

    r: redis.Redis
    result_ttl: float
    unretrieved_ttl: float

    def _register_graph_scripts(self) -> None:
        self._wait = lua_files.register(self.r, "wait")
        self._settle = lua_files.register(self.r, "settle")
        self._release_take = lua_files.register(self.r, "release_take")
        self._released = lua_files.register(self.r, "released")
        self._release_sweep = lua_files.register(self.r, "release_sweep")
        self._unpark = lua_files.register(self.r, "unpark")

    def create_waiting(self, owner: str, submission_id: str, rows: Sequence[WaitRow],
                       created: float, recent_max: int) -> tuple[int, int, list[Notice]]:
        """Store tasks with inputs (an input may be an earlier row). Returns (created,
        released at once or parked, notices of those ended at once because an input had
        failed, was cancelled or is gone)."""
        keys = ["outbox", "release", f"recent:{owner}", f"first:{owner}", f"done:{owner}",
                *(f"t:{r.task_id}" for r in rows)]
        n, released, raw = self._wait(keys=keys, args=[lua_rows.encode(rows), f"{created:.6f}", owner,
                                                       submission_id, recent_max])
        return int(n), int(released), _notices(raw)

    def settle(self, limit: int = 1000) -> tuple[int, int, list[Notice], int]:
        """Tell the dependents of up to `limit` settled tasks. Returns (settled, released,
        notices of the dependents ended, settled tasks still waiting their turn)."""
        n, released, raw, left = self._settle(keys=["settled", "outbox", "release"],
                                              args=[f"{time.time():.6f}", limit, self.result_ttl,
                                                    self.unretrieved_ttl])
        return int(n), int(released), _notices(raw), int(left)

    def take_released(self, limit: int = 500, hold: float = 60.0) -> list[Released]:
        """Up to `limit` released dependents to send, each held for `hold` seconds: if they
        are not marked sent (mark_released) by then, sweep_releasing offers them again."""
        raw = self._release_take(keys=["release", "releasing"],
                                 args=[f"{time.time():.6f}", limit, hold, self.result_ttl, self.unretrieved_ttl])
        return [_as_released(x) for x in raw]

    def unpark(self, task_ids: list[str], endpoint_id: str) -> int:
        """Parked dependents handed back by the agent of `endpoint_id` (tasks routed elsewhere
        are not its to hand back); returns how many are now to be sent again, with their
        inputs' results (the others wait for their inputs as usual)."""
        if not task_ids:
            return 0
        return int(self._unpark(keys=["leases", "release", *(f"t:{t}" for t in task_ids)],
                                args=[f"{time.time():.6f}", endpoint_id, *task_ids]))

    def mark_released(self, task_ids: list[str]) -> int:
        """The dependents were sent: their packs go and their inputs are unpinned."""
        if not task_ids:
            return 0
        return int(self._released(keys=["releasing", *(f"t:{t}" for t in task_ids)],
                                  args=[self.result_ttl, self.unretrieved_ttl, *task_ids]))

    def sweep_releasing(self, limit: int = 5000) -> int:
        """Releases held past their time (their sender died) go back to be sent."""
        return int(self._release_sweep(keys=["releasing", "release"], args=[f"{time.time():.6f}", limit]))

    def graph_backlog(self) -> tuple[int, int]:
        """(settled tasks whose dependents were not told yet, released dependents not sent)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.llen("settled")
        pipe.llen("release")
        settled, release = pipe.execute()
        return int(settled), int(release)

    def owners_of(self, task_ids: Sequence[str]) -> dict[str, str | None]:
        """Task id -> its owner, None for a task whose record is gone (one round trip):
        whose tasks a submission names as inputs."""
        pipe = self.r.pipeline(transaction=False)
        for tid in task_ids:
            pipe.hget(f"t:{tid}", "o")
        return {tid: decoded(o) for tid, o in zip(task_ids, pipe.execute())}
