"""The lane registry of multi-user endpoints (skyfn.protocol.lanes), in the service's Redis:
which user agent's lane each (submitter identity, config key) of an endpoint is bound to,
each lane's queue login and MAC key, and the check of the sealed results lanes send.

Keys (`<ep>` the endpoint id, `<lane>` the lane name):
- `lane:<ep>:<lane>`        hash: mac_key, password (of the lane's queue login), created.
                            Secrets: no queue login reaches `lane:*` keys; only the service.
- `lane:<ep>:<lane>:ids`    set: the identity ids bound to the lane while it is open; a sealed
                            result is applied only to tasks that these identities submitted.
- `lanes:<ep>`              hash: "<identity id> <config key>" -> lane: dispatch reads one field.
- `lanes:<ep>:queues`       set: lanes whose task queues the reaper looks at for dead letters:
                            the open ones, and closed ones until their queue is empty.
- the lane's task queue `tasks:<ep>:l:<lane>` (Settings.lane_queue_name) and Redis user
  `ln-<ep>-<lane>` with the lane's password, whose keys are that queue's alone, with
  write-only results (lambdas/core/identity/queue_acl.py). The endpoint's own login reaches
  all its lanes' queues (agent_keys.acl_keys). Closing a lane leaves its queue: the
  endpoint takes back what is left in it.

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

# Every binding to the lane goes, then the lane's record and its identities. Returns
# {record existed, bindings removed}.
_CLOSE = """
local removed = 0
local bindings = redis.call('HGETALL', KEYS[1])
for i = 1, #bindings, 2 do
  if bindings[i + 1] == ARGV[1] then
    redis.call('HDEL', KEYS[1], bindings[i])
    removed = removed + 1
  end
end
return {redis.call('DEL', KEYS[2], KEYS[3]), removed}
"""
# A closed lane whose queue and dead letters are empty leaves the reaper's set (atomic: a
# lane opened again meanwhile stays).
_FORGET = """
if redis.call('EXISTS', KEYS[2]) == 0 and redis.call('XLEN', KEYS[3]) == 0 and redis.call('XLEN', KEYS[4]) == 0 then
  return redis.call('SREM', KEYS[1], ARGV[1])
end
return 0
"""


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


def _record(endpoint_id: str, lane: str) -> str:
    return f"lane:{endpoint_id}:{lane}"


def _ids(endpoint_id: str, lane: str) -> str:
    return f"lane:{endpoint_id}:{lane}:ids"


def _bindings(endpoint_id: str) -> str:
    return f"lanes:{endpoint_id}"


def _watched(endpoint_id: str) -> str:
    return f"lanes:{endpoint_id}:queues"


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
    lane, rec, ids = body.lane, _record(endpoint_id, body.lane), _ids(endpoint_id, body.lane)
    pipe = deps.redis_client().pipeline(transaction=True)
    pipe.hsetnx(rec, "mac_key", secrets.token_hex(32))
    pipe.hsetnx(rec, "password", secrets.token_urlsafe(32))
    pipe.hsetnx(rec, "created", f"{time.time():.6f}")
    pipe.hset(_bindings(endpoint_id), f"{body.identity_id} {body.config_key}", lane)
    pipe.sadd(ids, body.identity_id)
    pipe.sadd(_watched(endpoint_id), lane)
    pipe.hmget(rec, "mac_key", "password")
    pipe.smembers(ids)
    *_, (mac_key, password), bound = pipe.execute()
    password = password.decode()
    task_queue = settings().lane_queue_name(endpoint_id, lane)
    queue_acl.set_user(acl_user(endpoint_id, lane), queue_acl.digest(password), queue_acl.queue_keys(task_queue))
    deps.lane_queue(endpoint_id, lane)  # the stream and its consumer group exist before the agent polls
    url = redis_url(settings().agent_redis_url, acl_user(endpoint_id, lane), password)
    return LaneGranted(lane=lane, endpoint_id=endpoint_id,
                       task_queue=QueueDescriptor(kind="redis", name=task_queue, url=url),
                       results_queue=QueueDescriptor(kind="redis", name=settings().results_queue_name, url=url),
                       mac_key=mac_key.decode(), identities=sorted(i.decode() for i in bound))


def close(endpoint_id: str, lane: str) -> int:
    """Unbind everything from the lane and end its queue login (its connections are cut);
    the lane's queue stays for the endpoint to drain. Returns the bindings removed."""
    _require_enabled()
    found = _close(endpoint_id, lane)
    queue_acl.delete_users(acl_user(endpoint_id, lane))  # also when unknown: a login left by a racing bind
    if found is None:
        raise NotFound(f"lane {lane} of endpoint {endpoint_id} not found: it was closed already or never opened "
                       f"(POST /endpoints/{endpoint_id}/lanes opens one)")
    return found


def _close(endpoint_id: str, lane: str) -> Optional[int]:
    """Bindings removed, or None when the lane had neither a record nor a binding."""
    script = deps.redis_client().register_script(_CLOSE)
    existed, removed = script(keys=[_bindings(endpoint_id), _record(endpoint_id, lane), _ids(endpoint_id, lane)],
                              args=[lane])
    return int(removed) if existed or removed else None


def close_all(endpoint_id: str) -> int:
    """Close every lane of the endpoint (credential revoked). Returns the lanes closed."""
    r = deps.redis_client()
    pipe = r.pipeline(transaction=False)
    pipe.hvals(_bindings(endpoint_id))
    pipe.smembers(_watched(endpoint_id))
    bound, kept = pipe.execute()
    candidates = sorted({v.decode() for v in (*bound, *kept)})
    closed = sum(_close(endpoint_id, lane) is not None for lane in candidates)
    queue_acl.delete_users(*(acl_user(endpoint_id, lane) for lane in candidates))
    return closed


# --- dispatch and the reaper ----------------------------------------------------------------
def lane_for(endpoint_id: str, identity_id: str, config_key: str) -> Optional[str]:
    """The lane (identity, config key) is bound to at the endpoint, if any."""
    lane = deps.redis_client().hget(_bindings(endpoint_id), f"{identity_id} {config_key}")
    return lane.decode() if lane is not None else None


def watched(endpoint_ids: list[str]) -> dict[str, list[str]]:
    """endpoint id -> its lanes whose queues may hold messages or dead letters (one round trip)."""
    pipe = deps.redis_client().pipeline(transaction=False)
    for endpoint_id in endpoint_ids:
        pipe.smembers(_watched(endpoint_id))
    return {ep: sorted(v.decode() for v in got) for ep, got in zip(endpoint_ids, pipe.execute()) if got}


def forget_if_drained(endpoint_id: str, lane: str) -> bool:
    """A closed lane whose queue and dead letters are empty is no longer watched."""
    name = settings().lane_queue_name(endpoint_id, lane)
    script = deps.redis_client().register_script(_FORGET)
    return bool(script(keys=[_watched(endpoint_id), _record(endpoint_id, lane), name, f"{name}:dlq"], args=[lane]))


# --- sealed results --------------------------------------------------------------------------
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
    store = deps.store()
    pipe = deps.redis_client().pipeline(transaction=False)
    pipe.hget(_record(endpoint_id, lane), "mac_key")
    pipe.smembers(_ids(endpoint_id, lane))
    store.owners_on(pipe, task_ids)
    mac_key, bound, *owned = pipe.execute()
    if mac_key is None:
        raise SealRefused(f"lane {lane} of endpoint {endpoint_id} is not open (closed, or never opened)")
    if not _MAC.fullmatch(mac) or not verify(mac_key.decode(), lane, body, mac):
        raise SealRefused(f"lane {lane} of endpoint {endpoint_id}: the MAC does not match the pack")
    return Sealed(lane=lane, pack=pack, identities=frozenset(i.decode() for i in bound),
                  owners=store.owners_from(task_ids, owned))
