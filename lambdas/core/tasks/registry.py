"""Functions and endpoints: DynamoDB is the durable registry, Redis caches what the
hot path reads (function bodies, endpoint owners) and holds endpoint liveness."""
from __future__ import annotations

import time
from typing import Any, NamedTuple

import orjson

from lambdas.config import settings
from lambdas.core import deps
from lambdas.core.identity import access, allowlist, direct_info
from lambdas.core.errors import NotFound
from lambdas.core.ids import is_uuid, new_id
from skyfn.protocol.api import DirectInfo, EndpointInfo, FunctionInfo, RegisterEndpoint, RegisterFunction

ALL_ENDPOINTS = "ep-index"  # set: the ids of the endpoints cached in Redis (ep:<id>)


def _dec(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items()}


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
    deps.redis_client().hset(f"fn:{item['function_id']}", mapping={
        "o": item["owner"], "b": item["body"], "c": str(item["created"]),
        "meta": orjson.dumps({k: item.get(k) for k in ("name", "tag", "container", "memoize")}),
    })


def function_bodies(owner: str, function_ids: set[str]) -> dict[str, FunctionBody]:
    """Body, container and memo default of functions the owner may run; unknown or foreign
    ids raise NotFound."""
    r = deps.redis_client()
    ids = sorted(function_ids)
    pipe = r.pipeline(transaction=False)
    for fid in ids:
        pipe.hmget(f"fn:{fid}", "o", "b", "meta")
    out: dict[str, FunctionBody] = {}
    for fid, (o, b, meta) in zip(ids, pipe.execute()):
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
    raw = _dec(deps.redis_client().hgetall(f"fn:{function_id}"))
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
    cached = deps.redis_client().get(f"epname:{owner}:{body.name}")
    candidate = cached.decode() if cached else new_id()
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
    pipe = deps.redis_client().pipeline(transaction=False)
    pipe.hset(f"ep:{item['endpoint_id']}", mapping={
        "o": item["owner"], "name": item["name"], "c": str(item["created"]), "meta": item.get("metadata") or "{}",
    })
    if item.get(allowlist.ITEM_FIELD) is not None:  # the endpoint's allowlist (lambdas/core/identity/allowlist.py)
        pipe.hset(f"ep:{item['endpoint_id']}", allowlist.FIELD, item[allowlist.ITEM_FIELD])
    else:
        pipe.hdel(f"ep:{item['endpoint_id']}", allowlist.FIELD)
    pipe.set(f"epname:{item['owner']}:{item['name']}", item["endpoint_id"])
    pipe.sadd(f"eps:{item['owner']}", item["endpoint_id"])
    pipe.sadd(ALL_ENDPOINTS, item["endpoint_id"])
    pipe.execute()


def cached_endpoint_ids() -> list[str]:
    """Every endpoint with a record in Redis (ep:<id>), from the index the records are
    cached with. A store from before the index is scanned once to build it: the reaper
    runs every few seconds and must not walk every task key each time."""
    r = deps.redis_client()
    ids = r.smembers(ALL_ENDPOINTS)
    if not ids:
        ids = {key[3:] for key in r.scan_iter(match="ep:*", count=1000)}
        if ids:
            r.sadd(ALL_ENDPOINTS, *ids)
    return sorted(i.decode() if isinstance(i, bytes) else i for i in ids)


def _endpoint_record(endpoint_id: str) -> dict[str, str] | None:
    r = deps.redis_client()
    raw = _dec(r.hgetall(f"ep:{endpoint_id}"))
    if "o" not in raw:
        item = deps.dynamo().get_endpoint(endpoint_id) if is_uuid(endpoint_id) else None
        if item is None:
            return None
        _cache_endpoint(item)
        raw = _dec(r.hgetall(f"ep:{endpoint_id}"))
    return raw


def check_endpoint(owner: str, endpoint_id: str) -> dict[str, str]:
    """The caller (`owner`) may run tasks on the endpoint: owns it or was granted a role.
    Returns the endpoint's hot record (its allowlist among it), read once per request."""
    rec = _endpoint_record(endpoint_id)
    if rec is None or not access.allows("endpoint", endpoint_id, rec["o"], owner):
        raise NotFound(f"endpoint {endpoint_id} not found: list yours with Client.list_endpoints()")
    return rec


def endpoint_info(owner: str, endpoint_id: str) -> EndpointInfo:
    rec = _endpoint_record(endpoint_id)
    if rec is None or not access.allows("endpoint", endpoint_id, rec["o"], owner):
        raise NotFound(f"endpoint {endpoint_id} not found: list yours with Client.list_endpoints()")
    hb = float(rec["hb"]) if rec.get("hb") else None
    queue, _ = deps.task_queue(endpoint_id)
    return EndpointInfo(endpoint_id=endpoint_id, name=rec["name"], owner=rec["o"], status=rec.get("st", "new"),
                        last_heartbeat=hb, created=float(rec["c"]), backlog=queue.depth(),
                        metadata=orjson.loads(rec.get("meta") or "{}"), stats=orjson.loads(rec.get("stats") or "{}"))


def list_endpoints(owner: str) -> list[EndpointInfo]:
    ids = {i["endpoint_id"] for i in deps.dynamo().list_endpoints(owner)}
    ids |= {i.decode() for i in deps.redis_client().smembers(f"eps:{owner}")}
    infos = [endpoint_info(owner, eid) for eid in ids]
    return sorted(infos, key=lambda e: e.created)


def heartbeat(owner: str, endpoint_id: str, stats: dict[str, Any], agent_endpoint: str | None = None,
              allowed: Any = ..., direct: DirectInfo | None = None, features: list[str] | None = None) -> EndpointInfo:
    """From the endpoint's agent (its credential: `agent_endpoint`) or a user with 'manage'.
    `allowed`: the agent's allowlist as it stands (None: any function; ...: not reported).
    `direct`: the agent's direct channel (lambdas/core/identity/direct_info.py), published or, when
    None, withdrawn by the agent's own heartbeats. An agent that signs in as its owner
    (Cognito or Globus deployments) publishes with the owner's token, so the owner's
    heartbeat publishes too, but never withdraws: only the agent knows it has none. Anyone
    else the endpoint is shared with leaves it alone (they could point sessions at
    their own socket). `features`: what the agent understands beyond the base protocol, as
    its own heartbeats report it (ft: what submission reads, e.g. dataflow.parks)."""
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
    pipe = deps.redis_client().pipeline(transaction=False)
    pipe.hset(f"ep:{endpoint_id}", mapping={"hb": f"{time.time():.6f}", "st": "online", "stats": orjson.dumps(stats)})
    if agent_endpoint is not None or (direct is not None and owner == rec["o"]):
        direct_info.publish(pipe, endpoint_id, direct)
    if agent_endpoint is not None:
        pipe.hset(f"ep:{endpoint_id}", "ft", ",".join(features or ()))
    pipe.execute()
    if allowed is not ...:
        allowlist.update(endpoint_id, allowed)
    return endpoint_info(owner, endpoint_id)


def mark_silent_endpoints_offline() -> list[str]:
    """Endpoints whose last heartbeat is older than the timeout go offline."""
    r = deps.redis_client()
    limit = time.time() - settings().heartbeat_timeout
    offline = []
    for endpoint_id in cached_endpoint_ids():
        key = f"ep:{endpoint_id}"
        hb, st = r.hmget(key, "hb", "st")
        if st == b"online" and hb is not None and float(hb) < limit:
            r.hset(key, "st", "offline")
            offline.append(endpoint_id)
    direct_info.withdraw(offline)  # a silent agent takes no new direct sessions
    return offline
