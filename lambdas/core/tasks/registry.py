"""Functions and endpoints: DynamoDB is the durable registry, Redis caches what the
hot path reads (function bodies, endpoint owners) and holds endpoint liveness."""
from __future__ import annotations

import time
from typing import Any, NamedTuple

import orjson

from lambdas.adapters.redis_store import registry_store
from lambdas.adapters.redis_store.endpoint_allowlists import ALLOW_FIELD
from lambdas.config import settings
from lambdas.core import deps
from lambdas.core.identity import access, allowlist, direct_info
from lambdas.core.errors import NotFound
from lambdas.core.ids import is_uuid, new_id
from skyfn.protocol.api import DirectInfo, EndpointInfo, FunctionInfo, HeartbeatAck, RegisterEndpoint, RegisterFunction

ALL_ENDPOINTS = registry_store.ALL_ENDPOINTS  # set: the ids of the endpoints cached in Redis (ep:<id>)


# --- functions ------------------------------------------------------------------
class FunctionBody(NamedTuple):
    """What the hot path needs of a function: its code, its container, its memo default,
    and its owner and name (endpoint allowlists of owner and name entries)."""
    body: str
    container: str | None
    memoize: bool
    owner: str | None = None
    name: str | None = None
    tag: str | None = None  # the placement tag (aAPP) it was registered with


def register_function(owner: str, body: RegisterFunction) -> str:
    function_id = new_id()
    item = {"function_id": function_id, "owner": owner, "name": body.name, "tag": body.tag,
            "container": body.container, "created": time.time(), "body": body.function}
    if body.memoize:
        item["memoize"] = True
    deps.dynamo().put_function(item)
    _cache_function(item)
    return function_id


def _cache_function(item: dict[str, Any]) -> None:
    deps.registry_cache().cache_function(item["function_id"], item["owner"], item["body"], item["created"],
                                         orjson.dumps({k: item.get(k) for k in ("name", "tag", "container", "memoize")}))


def function_bodies(owner: str, function_ids: set[str], *, endpoints: Any = (),
                    records: dict[str, dict[str, str]] | None = None) -> dict[str, FunctionBody]:
    """Body, container and memo default of functions the owner may run; unknown or foreign
    ids raise NotFound. The hot records of `endpoints` are read in the same round trip into
    `records` (for check_endpoint's `record`; ids without one are left out)."""
    ids = sorted(function_ids)
    eps = sorted(set(endpoints)) if records is not None else []
    answers, found = deps.registry_cache().functions_and_endpoints(ids, eps)
    if records is not None:
        records.update(found)
    out: dict[str, FunctionBody] = {}
    for fid, (o, b, meta) in zip(ids, answers):
        if o is None:
            item = deps.dynamo().get_function(fid) if is_uuid(fid) else None
            if item is None:
                raise NotFound(f"function {fid} not found: register it first (Client.register_function)")
            _cache_function(item)
            o, b = item["owner"].encode(), item["body"].encode()
            meta = orjson.dumps({"container": item.get("container"), "memoize": item.get("memoize"),
                                 "name": item.get("name"), "tag": item.get("tag")})
        if o.decode() != owner and not access.allows("function", fid, o.decode(), owner):
            raise NotFound(f"function {fid} not found: register it first (Client.register_function)")
        m = orjson.loads(meta or b"{}")
        out[fid] = FunctionBody(b.decode(), m.get("container"), bool(m.get("memoize")), o.decode(), m.get("name"),
                                m.get("tag"))
    return out


def get_function(owner: str, function_id: str) -> FunctionInfo:
    raw = deps.registry_cache().function(function_id)
    if raw:
        meta = orjson.loads(raw["meta"])
        item = {"function_id": function_id, "owner": raw["o"], "created": float(raw["c"]), "body": raw["b"], **meta}
    else:
        item = deps.dynamo().get_function(function_id) if is_uuid(function_id) else None
    if not item or not access.allows("function", function_id, item["owner"], owner):
        raise NotFound(f"function {function_id} not found")
    return FunctionInfo(function_id=function_id, name=item.get("name"), owner=item["owner"], tag=item.get("tag"),
                        container=item.get("container"), created=float(item["created"]), function=item["body"],
                        memoize=bool(item.get("memoize")))


# --- endpoints ------------------------------------------------------------------
def register_endpoint(owner: str, body: RegisterEndpoint) -> tuple[EndpointInfo, bool]:
    """Register (or re-register) the owner's endpoint called body.name. Returns (info, created)."""
    db = deps.dynamo()
    cached = deps.registry_cache().endpoint_named(owner, body.name)
    candidate = cached or new_id()
    # The name claim in DynamoDB decides; a Redis entry carries it across a registry that
    # lost its data (the embedded runtime's moto restarts empty), so the id and its queue stay.
    endpoint_id = db.claim_endpoint_name(owner, body.name, candidate)
    created = endpoint_id == candidate and not cached
    item = db.get_endpoint(endpoint_id) if not created else None
    if item is None:
        known = _endpoint_record(endpoint_id) if cached else None
        item = {"endpoint_id": endpoint_id, "owner": owner, "name": body.name,
                "created": float(known["c"]) if known else time.time(),
                "metadata": orjson.dumps(body.metadata).decode()}
        _set_allowlist(item, body)
        db.put_endpoint(item)
    elif body.metadata or "allowed_functions" in body.model_fields_set:
        if body.metadata:
            item["metadata"] = orjson.dumps(body.metadata).decode()
        _set_allowlist(item, body)
        db.put_endpoint(item)
    _cache_endpoint(item)
    deps.task_queue(endpoint_id)  # make sure the queue exists before the agent polls it
    return endpoint_info(owner, endpoint_id), created


def _set_allowlist(item: dict[str, Any], body: RegisterEndpoint) -> None:
    """The agent's allowed_functions, when its registration states them (null: any function)."""
    if "allowed_functions" in body.model_fields_set:
        encoded = allowlist.encode(body.allowed_functions)
        if encoded is None:
            item.pop(allowlist.ITEM_FIELD, None)
        else:
            item[allowlist.ITEM_FIELD] = encoded


def _cache_endpoint(item: dict[str, Any]) -> None:
    # with the endpoint's allowlist (lambdas/core/identity/allowlist.py)
    deps.registry_cache().cache_endpoint(item["endpoint_id"], item["owner"], item["name"], item["created"],
                                         item.get("metadata") or "{}", allowlist.FIELD,
                                         item.get(allowlist.ITEM_FIELD))


def cached_endpoint_ids() -> list[str]:
    """Every endpoint with a record in Redis (ep:<id>), from the index the records are
    cached with (a store from before the index is scanned once to build it)."""
    return deps.registry_cache().endpoint_ids()


def _endpoint_record(endpoint_id: str) -> dict[str, str] | None:
    cache = deps.registry_cache()
    raw = cache.endpoint(endpoint_id)
    if "o" not in raw:
        item = deps.dynamo().get_endpoint(endpoint_id) if is_uuid(endpoint_id) else None
        if item is None:
            return None
        _cache_endpoint(item)
        raw = cache.endpoint(endpoint_id)
    return raw


def check_endpoint(owner: str, endpoint_id: str, record: dict[str, str] | None = None) -> dict[str, str]:
    """The caller (`owner`) may run tasks on the endpoint: owns it or was granted a role.
    Returns the endpoint's hot record (its allowlist among it), read once per request
    (`record`: already read in this request, by function_bodies)."""
    rec = record if record is not None else _endpoint_record(endpoint_id)
    if rec is None or not access.allows("endpoint", endpoint_id, rec["o"], owner):
        raise NotFound(f"endpoint {endpoint_id} not found: list yours with Client.list_endpoints()")
    return rec


def endpoint_info(owner: str, endpoint_id: str) -> EndpointInfo:
    rec = _endpoint_record(endpoint_id)
    if rec is None or not access.allows("endpoint", endpoint_id, rec["o"], owner):
        raise NotFound(f"endpoint {endpoint_id} not found: list yours with Client.list_endpoints()")
    return _info(endpoint_id, rec)


def _info(endpoint_id: str, rec: dict[str, str]) -> EndpointInfo:
    """The endpoint as its hot record says, with its queue's backlog."""
    hb = float(rec["hb"]) if rec.get("hb") else None
    queue, _ = deps.task_queue(endpoint_id)
    return EndpointInfo(endpoint_id=endpoint_id, name=rec["name"], owner=rec["o"], status=rec.get("st", "new"),
                        last_heartbeat=hb, created=float(rec["c"]), backlog=queue.depth(),
                        metadata=orjson.loads(rec.get("meta") or "{}"), stats=orjson.loads(rec.get("stats") or "{}"))


def list_endpoints(owner: str) -> list[EndpointInfo]:
    ids = {i["endpoint_id"] for i in deps.dynamo().list_endpoints(owner)}
    ids |= deps.registry_cache().owner_endpoint_ids(owner)
    # the owner's records in one round trip; one not cached (or not the owner's) as endpoint_info reads it
    _, records = deps.registry_cache().functions_and_endpoints([], sorted(ids))
    infos = [_info(eid, records[eid]) if records.get(eid, {}).get("o") == owner else endpoint_info(owner, eid)
             for eid in ids]
    return sorted(infos, key=lambda e: e.created)


def heartbeat(owner: str, endpoint_id: str, stats: dict[str, Any], agent_endpoint: str | None = None,
              allowed: Any = ..., direct: DirectInfo | None = None, features: list[str] | None = None) -> HeartbeatAck:
    """From the endpoint's agent (its credential: `agent_endpoint`) or a user with 'manage'.
    `allowed`: the agent's allowlist as it stands (None: any function; ...: not reported).
    `direct`: the agent's direct channel (lambdas/core/identity/direct_info.py), published or, when
    None, withdrawn by the agent's own heartbeats. An agent that signs in as its owner
    (Cognito or Globus deployments) publishes with the owner's token, so the owner's
    heartbeat publishes too, but never withdraws: only the agent knows it has none. Anyone
    else the endpoint is shared with leaves it alone (they could point sessions at
    their own socket). `features`: what the agent understands beyond the base protocol, as
    its own heartbeats report it (ft: what submission reads, e.g. dataflow.parks).

    Every idle endpoint's steady cost, so it reads the record once and writes in one round
    trip: the allowlist is compared with the record's, a channel is withdrawn only where the
    record says one was published, and the answer is the heartbeat, not the backlog."""
    rec = _endpoint_record(endpoint_id)
    if rec is None:
        raise NotFound(f"endpoint {endpoint_id} not found: list yours with Client.list_endpoints()")
    if agent_endpoint is not None:
        from lambdas.core.errors import Forbidden

        if agent_endpoint != endpoint_id:
            raise Forbidden(f"this endpoint credential is not endpoint {endpoint_id}'s")
        owner = rec["o"]
    else:
        access.require("endpoint", endpoint_id, rec["o"], owner, "manage",
                       f"endpoint {endpoint_id} (list yours with Client.list_endpoints())")
    channel: Any = registry_store.KEEP
    if agent_endpoint is not None or (direct is not None and owner == rec["o"]):
        if direct is not None:
            channel = (direct.model_dump_json(exclude_defaults=True), direct_info.ttl_seconds())
        elif rec.get(registry_store.DIRECT_FIELD):
            channel = None
    beat, encoded = f"{time.time():.6f}", orjson.dumps(stats)
    deps.registry_cache().heartbeat(endpoint_id, beat, encoded, direct=channel,
                                    features=(features or ()) if agent_endpoint is not None else None)
    if allowed is not ...:
        allowlist.update(endpoint_id, allowed, current=rec.get(ALLOW_FIELD))
    return HeartbeatAck(endpoint_id=endpoint_id, last_heartbeat=float(beat))


def mark_silent_endpoints_offline() -> list[str]:
    """Endpoints whose last heartbeat is older than the timeout go offline: one sweep of the
    liveness index (lambdas/adapters/redis_store/liveness_store.py), which holds the
    endpoints online by their last heartbeat; an endpoint that heartbeats is not read."""
    live = deps.liveness()
    live.build_once(cached_endpoint_ids)  # a store from before the index: once
    offline = live.sweep_silent(time.time() - settings().heartbeat_timeout)
    direct_info.withdraw(offline)  # a silent agent takes no new direct sessions
    return offline
