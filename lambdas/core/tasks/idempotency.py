"""Idempotent submission: one answer per (owner, idempotency key), kept in Redis.

The first request with a key claims it, runs the submission and stores its answer; a
retry with the same key gets that answer back marked `replayed`; a request that arrives
while the claim is held gets the error `busy()` makes (retry later); a submission that
raises releases the claim so a retry can run it again. Requests without a key just run.

An answer is kept 24 h, so its size is paid per request for a day: `pack` may store a
shorter form that `unpack` turns back into the answer (a submission whose ids derive from
its key keeps only their count: lambdas/core/tasks/tasks.py).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import orjson

from lambdas.core import deps


def submit_once(owner: str, key: Optional[str], submit: Callable[[], dict[str, Any]], *,
                busy: Callable[[], Exception], claim_seconds: int = 300,
                check: Optional[Callable[[dict[str, Any]], None]] = None,
                pack: Callable[[dict[str, Any]], bytes] = orjson.dumps,
                unpack: Callable[[bytes], dict[str, Any]] = orjson.loads) -> tuple[dict[str, Any], bool]:
    """(answer, replayed). `check(previous)` may refuse a replay whose request differs."""
    if not key:
        return submit(), False
    store = deps.store()
    previous = store.idempotent_claim_or_get(owner, key, seconds=claim_seconds)
    if previous == b"pending":
        raise busy()
    if previous is not None:
        answer = unpack(previous)
        if check is not None:
            check(answer)
        return answer | {"replayed": True}, True
    try:
        answer = submit()
    except BaseException:
        store.idempotent_release(owner, key)
        raise
    store.idempotent_store(owner, key, pack(answer))
    return answer, False
