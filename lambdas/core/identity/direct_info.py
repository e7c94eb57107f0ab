"""The direct channel an endpoint's agent publishes (skyfn.protocol.api.DirectInfo):
where its direct socket listens, the socket's public key and the session key the service
signs session tokens with.

The agent's own heartbeats publish it (registry.heartbeat; so do its owner's, for agents
that sign in as their owner), each one renewing it for TTL_HEARTBEATS heartbeat timeouts;
an agent heartbeat without it withdraws it, and an agent gone silent loses it when the
reaper marks the endpoint offline. It lives in Redis alone
(`epdirect:<endpoint>`, JSON), apart from the endpoint's record `ep:<endpoint>`, so nothing
that reads the record (EndpointInfo, endpoint lists, the status page) can hand the session
key out. The key is a secret: it is never returned by the API and never logged.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from lambdas.config import settings
from lambdas.core import deps
from skyfn.protocol.api import DirectInfo

TTL_HEARTBEATS = 3  # heartbeat timeouts a published channel outlives the heartbeat that published it


def key(endpoint_id: str) -> str:
    # not under ep:<id>: a scan of ep:* (registry.cached_endpoint_ids) must find endpoints only
    return f"epdirect:{endpoint_id}"


def ttl_seconds() -> int:
    return max(1, math.ceil(TTL_HEARTBEATS * settings().heartbeat_timeout))


def publish(pipe: Any, endpoint_id: str, info: Optional[DirectInfo]) -> None:
    """Queue on the Redis pipeline `pipe` the agent's report: publish `info`, or withdraw
    the channel when the heartbeat carried none."""
    if info is None:
        pipe.delete(key(endpoint_id))
    else:
        pipe.set(key(endpoint_id), info.model_dump_json(), ex=ttl_seconds())


def withdraw(endpoint_ids: list[str]) -> None:
    if endpoint_ids:
        deps.redis_client().delete(*(key(e) for e in endpoint_ids))


def published(endpoint_id: str) -> Optional[DirectInfo]:
    raw = deps.redis_client().get(key(endpoint_id))
    return DirectInfo.model_validate_json(raw) if raw else None
