"""Memoization at submission (DESIGN.md section 3): which tasks of a submission are
memoized, their keys (skyfn.protocol.memo) and which of them the cache already answers.

A task is memoized when it says so, else when its submission says so, else when its
function was registered with `memoize=True`. The cache is per owner (`memo:<owner>:<key>`
in the hot store): one user's results never answer another's calls. A hit is stored as a
task that SUCCEEDED at once with the cached result (event MEMO_HIT) and is never queued; a
miss carries its key, and the script that stores its SUCCEEDED result fills the cache.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from skyfn.protocol.api import SubmitTasks
from skyfn.protocol.memo import function_digest, memo_key

if TYPE_CHECKING:
    from lambdas.adapters.redis_store.store import TaskStore
    from lambdas.core.tasks.registry import FunctionBody


def keys(req: SubmitTasks, functions: dict[str, "FunctionBody"]) -> list[str | None]:
    """The memo key of each task of `req`, None for tasks that are not memoized."""
    out: list[str | None] = []
    digests: dict[tuple[str, str | None], bytes] = {}
    for t in req.tasks:
        fn = functions[t.function_id]
        wanted = t.memoize if t.memoize is not None else req.memoize if req.memoize is not None else fn.memoize
        if not wanted or t.inputs:  # a payload of Input placeholders says nothing of the arguments
            out.append(None)
            continue
        container = t.container or fn.container
        digest = digests.get((t.function_id, container))
        if digest is None:
            digest = digests[(t.function_id, container)] = function_digest(fn.body, container)
        out.append(memo_key(digest, t.payload))
    return out


def hits(store: "TaskStore", owner: str, task_keys: list[str | None]) -> dict[int, tuple[str, str]]:
    """index -> (memo key, cached result) for the tasks the cache answers (one round trip)."""
    wanted = [(i, k) for i, k in enumerate(task_keys) if k is not None]
    if not wanted:
        return {}
    found = store.memo_lookup(owner, [k for _, k in wanted])
    return {i: (k, result) for (i, k), result in zip(wanted, found) if result is not None}
