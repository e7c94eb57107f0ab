"""The direct channel an endpoint's agent publishes (skyfn.protocol.api.DirectInfo):
where its direct socket listens, the socket's public key and the session key the service
signs session tokens with.

The agent's own heartbeats publish it (registry.heartbeat; so do its owner's, for agents
that sign in as their owner), each one renewing it for TTL_HEARTBEATS heartbeat timeouts;
an agent heartbeat without it withdraws it, and an agent gone silent loses it when the
reaper marks the endpoint offline. It lives in the hot store alone (`epdirect:<endpoint>`,
JSON; lambdas/adapters/redis_store/direct_channels.py), apart from the endpoint's record
`ep:<endpoint>`, so nothing that reads the record (EndpointInfo, endpoint lists, the status
page) can hand the session key out. The key is a secret: it is never returned by the API and never logged.
"""
from __future__ import annotations

import math
from typing import Optional

from lambdas.config import settings
from lambdas.core import deps
from skyfn.protocol.api import DirectInfo

TTL_HEARTBEATS = 3  # heartbeat timeouts a published channel outlives the heartbeat that published it


def ttl_seconds() -> int:
    return max(1, math.ceil(TTL_HEARTBEATS * settings().heartbeat_timeout))


def withdraw(endpoint_ids: list[str]) -> None:
    deps.direct_channels().withdraw(endpoint_ids)


def published(endpoint_id: str) -> Optional[DirectInfo]:
    raw = deps.direct_channels().published(endpoint_id)
    return DirectInfo.model_validate_json(raw) if raw else None
