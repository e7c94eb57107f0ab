"""Lanes: the service's direct queues to the user agents of a multi-user endpoint.

A multi-user endpoint's privileged process maps each submitting identity to an account and
starts a user agent for it; it then asks the service for a *lane* for that user agent
(POST /endpoints/{id}/lanes, with the endpoint's credential) and *binds* to it each
(identity id, config key) whose tasks the agent runs (skyfn.protocol.user_config.config_key
of the request's user_config). From then on the service sends those tasks straight to the
lane's task queue, and the user agent returns their results straight to the service's results
queue: the privileged process is off the per-task path.

- A lane's task queue (`tasks:<endpoint>:l:<lane>` on Redis Streams) is reachable by the
  lane's own queue login and by the endpoint's (the privileged process hands a lane the first
  tasks of a new binding, and takes back what is left in a lane it closes); no other.
- Results of a lane travel sealed: `seal()` wraps the ResultPack body in an envelope with an
  HMAC-SHA256 under the lane's `mac_key`. The service applies a sealed pack only to tasks
  of the lane's endpoint whose submitter is bound to the lane, so a user agent reports on its
  own users' tasks alone, as the router checked before.
- Lanes exist where the service's task queues are Redis Streams (the embedded runtime and
  Redis deployments). Elsewhere the service answers 409 `lanes_unavailable` and the
  privileged process routes every task itself.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import re
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from skyfn.protocol.api import QueueDescriptor

LANE_PATTERN = r"^[a-z0-9]{8,32}$"
CONFIG_KEY_PATTERN = r"^(none|[0-9a-f]{16})$"
_LANE = re.compile(LANE_PATTERN)
_ENVELOPE_HEAD = b'{"lane":'


def lane_name(key: str) -> str:
    """The lane name of a user agent key (any text): 16 hex digits."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class BindLane(BaseModel):
    """POST /endpoints/{id}/lanes: open lane `lane` (if new) and bind (identity_id, config_key) to it."""

    model_config = ConfigDict(extra="forbid", strict=True)
    lane: str = Field(pattern=LANE_PATTERN, description="the lane's name, chosen by the endpoint")
    identity_id: str = Field(min_length=1, max_length=256, description="the submitter's skyfn user id")
    config_key: str = Field(pattern=CONFIG_KEY_PATTERN, description="user_config.config_key of the user_config")


class LaneGranted(BaseModel):
    """The answer: how the lane's user agent reaches its queues, and its results' MAC key."""

    lane: str
    endpoint_id: str
    task_queue: QueueDescriptor = Field(description="the lane's task queue, logged in as the lane")
    results_queue: QueueDescriptor = Field(description="the service's results queue, logged in as the lane")
    mac_key: str = Field(description="hex key of the HMAC that seals the lane's results")
    identities: list[str] = Field(default_factory=list, description="identity ids bound to the lane")


class LaneClosed(BaseModel):
    """The answer of DELETE /endpoints/{id}/lanes/{lane}."""

    lane: str
    unbound: int = Field(description="bindings (identity, config key) removed from the lane")


def _mac(mac_key: str, lane: str, body: bytes) -> str:
    return hmac.new(bytes.fromhex(mac_key), lane.encode() + b"\n" + body, hashlib.sha256).hexdigest()


def seal(lane: str, mac_key: str, body: bytes) -> bytes:
    """The envelope a lane's user agent sends in place of a ResultPack body."""
    return json.dumps({"lane": lane, "mac": _mac(mac_key, lane, body), "pack": body.decode()},
                      separators=(",", ":")).encode()


def is_sealed(raw: bytes | str) -> bool:
    head = raw[:8] if isinstance(raw, bytes) else raw[:8].encode()
    return head == _ENVELOPE_HEAD


def open_envelope(raw: bytes | str) -> Optional[tuple[str, str, bytes]]:
    """(lane, mac, pack body) of an envelope, or None when it is not a well-formed one."""
    try:
        doc = json.loads(raw)
        lane, mac, pack = doc["lane"], doc["mac"], doc["pack"]
    except (ValueError, KeyError, TypeError):
        return None
    if not (isinstance(lane, str) and _LANE.match(lane) and isinstance(mac, str) and isinstance(pack, str)):
        return None
    return lane, mac, pack.encode()


def verify(mac_key: str, lane: str, body: bytes, mac: str) -> bool:
    return hmac.compare_digest(_mac(mac_key, lane, body), mac)
