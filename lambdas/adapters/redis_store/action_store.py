"""Globus Flows actions' records (lambdas/core/runs/actions.py) in the hot store:

  ap:<action_id>             hash: u creator (skyfn user), t task id, r request_id, h digest of
                             the request, l label, mon / man monitor_by / manage_by (JSON),
                             st start time, ra release_after, dl deadline, fin the final status
                             (JSON) once the action completed
  apreq:<user>:<request_id>  the action a request_id started (a repeat returns it; other
                             content under the same request_id is a 409)
"""
from __future__ import annotations

from typing import Any, Optional


def _key(action_id: str) -> str:
    return f"ap:{action_id}"


def _request_key(user: str, request_id: str) -> str:
    return f"apreq:{user}:{request_id}"


class ActionStore:
    def __init__(self, client: Any):
        self.r = client

    def started_by(self, user: str, request_id: str) -> Optional[str]:
        """The action the user's request_id started, if any."""
        existing = self.r.get(_request_key(user, request_id))
        return existing.decode() if existing is not None else None

    def record(self, action_id: str) -> dict[str, str]:
        """The action's record ({} when there is none)."""
        return {k.decode(): v.decode() for k, v in self.r.hgetall(_key(action_id)).items()}

    def create(self, action_id: str, record: dict[str, str], ttl: int) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(_key(action_id), mapping=record)
        pipe.expire(_key(action_id), ttl)
        pipe.execute()

    def claim_request(self, user: str, request_id: str, action_id: str, ttl: int) -> bool:
        """Name `action_id` as the one the request_id started, unless one is named already."""
        return bool(self.r.set(_request_key(user, request_id), action_id, nx=True, ex=ttl))

    def delete(self, action_id: str) -> None:
        self.r.delete(_key(action_id))

    def keep_final(self, action_id: str, status: bytes) -> None:
        """Keep a completed action's status with it, unless a release removed it meanwhile."""
        if self.r.exists(_key(action_id)):
            self.r.hset(_key(action_id), "fin", status)

    def release(self, action_id: str, user: str, request_id: str) -> None:
        """Forget the action and its request_id."""
        self.r.delete(_key(action_id), _request_key(user, request_id))
