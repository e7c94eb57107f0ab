"""Direct sessions' records (lambdas/core/tasks/sessions.py), kept for the token's lifetime
and a grace after it, so the results an agent reports later are recorded for the right owner.

  ds:<session>   hash: o owner, e endpoint, f:<function> 1 per function of the session
                 (read by the store's direct-results script: scripts.py)
"""
from __future__ import annotations

from typing import Any, Iterable


def record_key(session_id: str) -> str:
    return f"ds:{session_id}"


class SessionStore:
    def __init__(self, client: Any):
        self.r = client

    def record(self, session_id: str, owner: str, endpoint_id: str, function_ids: Iterable[str], ttl: int) -> None:
        key = record_key(session_id)
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(key, mapping={"o": owner, "e": endpoint_id, **{f"f:{fid}": 1 for fid in function_ids}})
        pipe.expire(key, ttl)
        pipe.execute()
