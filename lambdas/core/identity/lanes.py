"""The lane registry of multi-user endpoints (skyfn.protocol.lanes), kept in the hot store
(lambdas/adapters/redis_store/lanes_store.py): which user agent's lane each (submitter
identity, config key) of an endpoint is bound to, each lane's queue login and MAC key, and
the check of the sealed results lanes send.

Keys (`<ep>` the endpoint id, `<lane>` the lane name):
- `lane:<ep>:<lane>`        hash: mac_key, password (of the lane's queue login), created.
                            Secrets: no queue login reaches `lane:*` keys; only the service.
- `lane:<ep>:<lane>:ids`    set: the identity ids bound to the lane while it is open; a sealed
                            result is applied only to tasks that these identities submitted.
- `lanes:<ep>`              hash: "<identity id> <config key>" -> lane: dispatch reads one field.
- `lanes:<ep>:queues`       set: lanes whose task queues the reaper looks at for dead letters:
                            the open ones, and closed ones until their queue is empty (only
                            while the endpoint is on the reaper's dead-letter watch: sent a
                            pack lately, or a lane just closed).
- the lane's task queue `tasks:<ep>:l:<lane>` (Settings.lane_queue_name) and Redis user
  `ln-<ep>-<lane>` with the lane's password, whose keys are that queue's alone, with
  XADD-only results (lambdas/core/identity/queue_acl.py, lambdas/adapters/queue_logins.py).
  The endpoint's own login reaches all its lanes' queues (agent_keys.consumed_queues).
  Closing a lane leaves its queue: the endpoint takes back what is left in it.

A sealed pack names its lane; its endpoint is the one its ResultPack names (lane names come
from the user agent's account and config, so two endpoints may each have a lane of the same
name). The MAC, under that endpoint's lane key, covers the pack, endpoint id included.
"""
from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass
from typing import Mapping, Optional

import orjson
from pydantic import ValidationError

from lambdas.config import settings
from lambdas.core import deps
from lambdas.core.errors import Conflict, NotFound
from lambdas.core.identity import queue_acl
from skyfn.protocol.api import QueueDescriptor
from skyfn.protocol.credentials import redis_url
from skyfn.protocol.lanes import BindLane, LaneGranted, open_envelope, verify
from skyfn.protocol.messages import ResultPack

_ENDPOINT_ID = re.compile(r"[A-Za-z0-9-]{1,64}")
_MAC = re.compile(r"[0-9a-f]{64}")

class LanesUnavailable(Conflict):
    code = "lanes_unavailable"


class NotMultiUser(Conflict):
    code = "not_multi_user"


class SealRefused(Exception):
    """A sealed result pack the service does not apply. The message says why and names the
    lane and endpoint, never a key."""


@dataclass(frozen=True)
class Sealed:
    """A sealed pack that passed the check: its lane, the pack, who is bound to the lane, and
    who submitted the tasks it reports on."""

    lane: str
    pack: ResultPack
    identities: frozenset[str]
    owners: dict[str, str]  # task id -> owner, of the tasks the pack reports on that exist


def acl_user(endpoint_id: str, lane: str) -> str:
    return f"ln-{endpoint_id}-{lane}"


def enabled() -> bool:
    """Lanes exist where the task queues are Redis Streams."""
    return settings().queue_kind == "redis"


def _require_enabled() -> None:
    if not enabled():
        raise LanesUnavailable("lanes need Redis Streams task queues, and this service's task queues are SQS: "
                               "the endpoint routes its tasks itself, through its privileged process")


def multi_user(record: Optional[Mapping[str, str]]) -> bool:
    """Whether an endpoint's hot record (registry._endpoint_record) says multi_user: true."""
    meta = (record or {}).get("meta") or ""
    if '"multi_user"' not in meta:  # an ordinary endpoint: no JSON parse
        return False
    try:
        return orjson.loads(meta).get("multi_user") is True
    except (orjson.JSONDecodeError, AttributeError):
        return False


# --- the endpoint's calls -------------------------------------------------------------------
def bind(endpoint_id: str, body: BindLane, record: Optional[Mapping[str, str]]) -> LaneGranted:
    """Open lane body.lane of the endpoint (if new) and bind (identity, config key) to it.
    `record`: the endpoint's hot record. The same lane gets the same password and MAC key
    each time (the endpoint binds again after a restart)."""
    _require_enabled()
    if record is None:
        raise NotFound(f"endpoint {endpoint_id} not found: register it (POST /endpoints) before opening lanes")
    if not multi_user(record):
        raise NotMultiUser(f"endpoint {endpoint_id} is not a multi-user endpoint (its registration metadata does not "
                           'say "multi_user": true): only the user agents of a multi-user endpoint get lanes; '
                           "configure it with `skyfn-endpoint configure --multi-user` and start it again")
    lane = body.lane
    mac_key, password, bound = deps.lanes().bind_lane(
        endpoint_id, lane, body.identity_id, body.config_key, mac_key=secrets.token_hex(32),
        password=secrets.token_urlsafe(32), created=f"{time.time():.6f}")
    task_queue = settings().lane_queue_name(endpoint_id, lane)
    queue_acl.set_user(acl_user(endpoint_id, lane), queue_acl.digest(password), [task_queue])
    deps.lane_queue(endpoint_id, lane)  # the stream and its consumer group exist before the agent polls
    url = redis_url(settings().agent_redis_url, acl_user(endpoint_id, lane), password)
    return LaneGranted(lane=lane, endpoint_id=endpoint_id,
                       task_queue=QueueDescriptor(kind="redis", name=task_queue, url=url),
                       results_queue=QueueDescriptor(kind="redis", name=settings().results_queue_name, url=url),
                       mac_key=mac_key, identities=sorted(bound))


def close(endpoint_id: str, lane: str) -> int:
    """Unbind everything from the lane and end its queue login (its connections are cut);
    the lane's queue stays for the endpoint to drain. Returns the bindings removed."""
    _require_enabled()
    found = deps.lanes().close_lane(endpoint_id, lane)
    queue_acl.delete_users(acl_user(endpoint_id, lane))  # also when unknown: a login left by a racing bind
    _reaper_looks(endpoint_id)
    if found is None:
        raise NotFound(f"lane {lane} of endpoint {endpoint_id} not found: it was closed already or never opened "
                       f"(POST /endpoints/{endpoint_id}/lanes opens one)")
    return found


def close_all(endpoint_id: str) -> int:
    """Close every lane of the endpoint (credential revoked). Returns the lanes closed."""
    port = deps.lanes()
    candidates = sorted(port.lanes_of(endpoint_id))
    closed = sum(port.close_lane(endpoint_id, lane) is not None for lane in candidates)
    queue_acl.delete_users(*(acl_user(endpoint_id, lane) for lane in candidates))
    if candidates:
        _reaper_looks(endpoint_id)
    return closed


def _reaper_looks(endpoint_id: str) -> None:
    """A lane closed: the reaper looks at the endpoint's lanes again, and stops watching the
    closed one once it is drained (lambdas/core/tasks/dead_letters.py)."""
    deps.dead_letter_watch().touch([endpoint_id], time.time())


# --- dispatch and the reaper ----------------------------------------------------------------
def lane_for(endpoint_id: str, identity_id: str, config_key: str) -> Optional[str]:
    """The lane (identity, config key) is bound to at the endpoint, if any."""
    return deps.lanes().lane_for(endpoint_id, identity_id, config_key)


def watched(endpoint_ids: list[str]) -> dict[str, list[str]]:
    """endpoint id -> its lanes whose queues may hold messages or dead letters (one round trip)."""
    return deps.lanes().watched(endpoint_ids)


def forget_if_drained(endpoint_id: str, lane: str) -> bool:
    """A closed lane whose queue and dead letters are empty is no longer watched."""
    return deps.lanes().forget_if_drained(endpoint_id, lane, settings().lane_queue_name(endpoint_id, lane))


# --- sealed results --------------------------------------------------------------------------
def bound_tasks(endpoint_id: str, lane: str, task_ids: list[str]) -> list[str]:
    """Those of `task_ids` that identities bound to the lane submitted: all a lane may answer
    for, its dead letters included (the lane's login may add to its own dead-letter stream,
    so what a dead letter names is the lane's claim, not the service's word). One round trip."""
    if not task_ids:
        return []
    identities, owners = deps.lanes().identities_and_owners(endpoint_id, lane, task_ids)
    return [t for t in task_ids if owners.get(t) in identities]


def check_sealed(raw: bytes | str) -> Sealed:
    """The pack of a lane's sealed envelope, once its MAC checks out under the key of the lane
    of the endpoint the pack names, with the identities bound to that lane (one round trip).
    SealRefused otherwise."""
    opened = open_envelope(raw)
    if opened is None:
        raise SealRefused("not a well-formed lane envelope (lane, mac, pack)")
    lane, mac, body = opened
    try:  # parsed before the MAC is checked: the owners it names are read in the same round trip
        pack = ResultPack.model_validate_json(body)
    except ValidationError as exc:
        raise SealRefused(f"lane {lane}: the sealed pack is not a ResultPack ({exc.error_count()} problems)") from None
    endpoint_id = pack.endpoint_id
    if not _ENDPOINT_ID.fullmatch(endpoint_id):
        raise SealRefused(f"lane {lane}: the sealed pack's endpoint_id {endpoint_id[:80]!r} is not an endpoint id "
                          "(a lane's user agent must name its endpoint's id)")
    task_ids = sorted({r.task_id for r in pack.results} | {u.task_id for u in pack.updates})
    mac_key, bound, owners = deps.lanes().seal_check(endpoint_id, lane, task_ids)
    if mac_key is None:
        raise SealRefused(f"lane {lane} of endpoint {endpoint_id} is not open (closed, or never opened)")
    if not _MAC.fullmatch(mac) or not verify(mac_key, lane, body, mac):
        raise SealRefused(f"lane {lane} of endpoint {endpoint_id}: the MAC does not match the pack")
    return Sealed(lane=lane, pack=pack, identities=frozenset(bound), owners=owners)
