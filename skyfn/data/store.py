"""Store: a named connector with object encoding, capabilities, a per-process cache and refs.

    store = Store("results", RedisConnector(port=6380, password=...), secret=b"...")
    key = store.put(array, ttl=3600)          # bytes in Redis, a key back
    ref = store.ref(array, ttl=3600)          # a lazy Ref: send it as an argument
    store.get(key); store.exists(key); store.evict(key)

Stores are registered by name in the process (`get_store(name)`); a worker also knows
its endpoint's stores from the file SKYFN_DATA_STORES names, so a Ref needs to carry only
the store's name and connector config. Resolved objects are cached per process (LRU,
bounded by SKYFN_DATA_CACHE_BYTES, default 512 MiB); a cached object is still checked
against the asking user's capability.

The store uses connectors, never the other way: connectors move bytes; capabilities,
decoding and the cache are the store's, also for a direct ref whose store this process does
not know (`resolve_without_store`: the object server checks the capability where the bytes
are), and for a ref of another account's store on this host (`resolve_through_peer`: that
account's peer-ref broker checks it, skyfn/data/peer.py). `resolve_ref` is how a Ref
resolves (skyfn/data/ref.py). Inside a task,
`get_redis_client()` gives the endpoint's Redis.
"""
from __future__ import annotations

import collections
import json
import os
import secrets
import threading
import time
import uuid
from dataclasses import replace
from typing import Any, Iterable, Optional

from skyfn.data import capability, codec, context
from skyfn.data.connectors import from_config
from skyfn.data.errors import DataConfigError, RefAccessDenied, RefResolutionError
from skyfn.private_file import write_private

CACHE_BYTES = int(os.environ.get("SKYFN_DATA_CACHE_BYTES", 512 << 20))

_registry: dict[str, "Store"] = {}
_registry_lock = threading.Lock()
_endpoint_loaded: Optional[tuple[str, float]] = None


class _Cache:
    """(store, key) -> (object, size), least recently used out first, bounded by bytes."""

    def __init__(self, limit: int):
        self.limit = limit
        self.items: collections.OrderedDict = collections.OrderedDict()
        self.size = 0
        self.lock = threading.Lock()

    def get(self, k):
        with self.lock:
            hit = self.items.get(k)
            if hit is not None:
                self.items.move_to_end(k)
            return hit

    def put(self, k, obj, size: int) -> None:
        if size > self.limit:
            return
        with self.lock:
            old = self.items.pop(k, None)
            if old is not None:
                self.size -= old[1]
            self.items[k] = (obj, size)
            self.size += size
            while self.size > self.limit and self.items:
                _, (_, s) = self.items.popitem(last=False)
                self.size -= s

    def drop(self, k) -> None:
        with self.lock:
            old = self.items.pop(k, None)
            if old is not None:
                self.size -= old[1]


cache = _Cache(CACHE_BYTES)


class Store:
    def __init__(self, name: str, connector, *, secret: Optional[bytes | str] = None,
                 endpoint_id: Optional[str] = None, register: bool = True):
        if not name or not isinstance(name, str):
            raise DataConfigError("a store needs a name (a non-empty string)")
        self.name = name
        self.connector = connector
        if isinstance(secret, str):
            secret = bytes.fromhex(secret)
        # A store made without a secret can sign refs only this process can check: give
        # the same secret to the stores of every process that resolves them.
        self.secret: bytes = secret or secrets.token_bytes(32)
        self.endpoint_id = endpoint_id  # where the bytes live (data-aware placement)
        if register:
            register_store(self)

    def __repr__(self) -> str:
        return f"Store({self.name!r}, {self.connector.kind})"

    # --- bytes under keys ----------------------------------------------------------
    def put(self, obj: Any, *, key: Optional[str] = None, ttl: Optional[float] = None) -> str:
        key = key or uuid.uuid4().hex
        self.connector.put(key, codec.encode_frames(obj), ttl=ttl)
        return key

    def get(self, key: str, default: Any = None) -> Any:
        data = self.connector.get(key)
        return default if data is None else codec.decode(data)

    def exists(self, key: str) -> bool:
        return self.connector.exists(key)

    def evict(self, key: str) -> None:
        cache.drop((self.name, key))
        self.connector.evict(key)

    # --- refs ------------------------------------------------------------------------
    def ref(self, obj: Any, *, ttl: Optional[float] = None, share_with: Iterable[str] = (),
            evict: bool = False, owner: Optional[str] = None) -> "Ref":
        """Put `obj` and return a lazy Ref to it. `share_with`: user ids that may resolve it
        besides its owner; `evict=True`: removed once resolved (a ref used once)."""
        from skyfn.data.ref import Ref, RefInfo

        owner = owner or context.current_user()
        if not owner:
            raise DataConfigError("a ref needs an owner: make refs inside a task, through an Executor, or pass "
                                  "owner=<your user id> (Client().whoami())")
        frames = codec.encode_frames(obj)
        key = uuid.uuid4().hex
        self.connector.put(key, frames, ttl=ttl)
        expires = None if ttl is None else time.time() + ttl
        cap = capability.sign(self.secret, self.name, key, owner, share_with, expires, evict=evict)
        return Ref(RefInfo(self.name, self.connector.config(), key, cap, self.endpoint_id, codec.size_of(frames),
                           evict))

    def resolve(self, info) -> Any:
        """The object a RefInfo points at, for the current user (cached per process)."""
        try:
            cap = capability.verify(self.secret, self.name, info.key, info.capability)
        except ValueError as exc:
            raise RefResolutionError(self.name, info.key, str(exc)) from None
        user = context.current_user()
        if not cap.allows(user):
            raise RefAccessDenied(self.name, info.key, f"it belongs to {cap.owner} and is not shared with "
                                  f"{user or 'an unknown user'}: ask its owner to share it "
                                  "(store.ref(obj, share_with=[...]))")
        ck = (self.name, info.key)
        hit = cache.get(ck)
        if hit is not None:
            return hit[0]
        if info.evict and not cap.may_evict(user):  # a reader's copy marked evict: it reads, it removes nothing
            info = replace(info, evict=False)
        # Connectors that check the capability where the bytes are served (direct) get the ref and user.
        get_for = getattr(self.connector, "get_for", None)
        data = get_for(info, user) if get_for is not None else self.connector.get(info.key)
        if data is None:
            raise RefResolutionError(self.name, info.key, "no such object: evicted by its owner, past its TTL, or "
                                     "already used (a ref made with evict=True resolves once)")
        obj = codec.decode(data)
        if info.evict:
            self.connector.evict(info.key)
        else:
            cache.put(ck, obj, info.size)
        return obj

    def close(self) -> None:
        self.connector.close()
        with _registry_lock:
            if _registry.get(self.name) is self:
                del _registry[self.name]


def register_store(store: Store) -> None:
    with _registry_lock:
        _registry[store.name] = store


def endpoint_stores() -> dict[str, Store]:
    """The stores of the endpoint this process runs for (from SKYFN_DATA_STORES), registered."""
    global _endpoint_loaded
    path = os.environ.get(context.STORES_ENV)
    if not path:
        return {}
    try:
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return {}
    with _registry_lock:
        fresh = _endpoint_loaded != (path, mtime)
    if fresh:
        for store in load_stores_file(path):
            register_store(store)
        _endpoint_loaded = (path, mtime)
    names = set(read_stores_file(path)["stores"])
    with _registry_lock:
        return {n: s for n, s in _registry.items() if n in names}


def read_stores_file(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def load_stores_file(path: str) -> list[Store]:
    """{"endpoint_id": ..., "default": name, "stores": {name: {"connector": {...}, "secret": hex}}}"""
    doc = read_stores_file(path)
    out = []
    for name, spec in doc.get("stores", {}).items():
        out.append(Store(name, from_config(spec["connector"]), secret=spec["secret"],
                         endpoint_id=spec.get("endpoint_id", doc.get("endpoint_id")), register=False))
    return out


def write_stores_file(path: str, stores: dict[str, dict], default: Optional[str], endpoint_id: Optional[str]) -> None:
    """Written 0600: it holds the stores' secrets."""
    write_private(path, json.dumps({"endpoint_id": endpoint_id, "default": default, "stores": stores}))


def get_store(name: str) -> Optional[Store]:
    with _registry_lock:
        store = _registry.get(name)
    if store is None:
        store = endpoint_stores().get(name)
    return store


def get_redis_client():
    """A redis-py client for the endpoint's Redis (DESIGN.md section 6), inside a task.

    The endpoint's agent starts or names that Redis in its config (`data: redis:`); keys you
    write are yours to manage (use a TTL). Raises a clear error where the endpoint has none."""
    for store in endpoint_stores().values():
        if store.connector.kind == "redis":
            return store.connector.client
    raise DataConfigError("this endpoint has no Redis store: add `data: {redis: {start: true}}` to its config.yaml "
                          "(or `data: {redis: {host: ..., port: ..., password_file: ...}}` for an existing one)")


def default_store() -> Optional[Store]:
    """The endpoint's default store (its config's `data: default:`), inside a task."""
    path = os.environ.get(context.STORES_ENV)
    if not path:
        return None
    stores = endpoint_stores()
    name = read_stores_file(path).get("default")
    return stores.get(name) if name else None


# ---- resolving refs -------------------------------------------------------------------------------

def resolve_ref(info) -> Any:
    """The object a RefInfo points at, for the current user: through its store when this process
    knows it, else (a direct ref) through the object server that holds it, else (another
    account's store on this host, SKYFN_PEER_REFS_DIR) through that account's peer-ref broker."""
    store = get_store(info.store)
    if store is None:
        if info.connector.get("kind") == "direct":   # its object server checks the capability: no secret here
            return resolve_without_store(info)
        from skyfn.data import peer   # here, not at import: most processes never need it

        if peer.serves(info.store):   # another account's store on this host: its peer-ref broker checks it
            return resolve_through_peer(info)
        raise RefResolutionError(info.store, info.key, f"store {info.store!r} is not known in this process "
                                 f"({info.connector.get('kind')} connector): run the task on an endpoint whose "
                                 "config defines it (data: stores:), or create Store(name, connector, secret=...) "
                                 "with the producer's secret before resolving")
    return store.resolve(info)


def resolve_without_store(info) -> Any:
    """Resolve a direct ref (a RefInfo) in a process that does not know its store and so has
    no secret to check the capability with -- a task on another endpoint: the object server
    checks it (and the user) where the bytes are. Cached per process under the exact
    capability the server accepted, so a cache hit is checked against the asking user and
    the expiry from that capability alone."""
    from skyfn.data.connectors.direct import DirectConnector

    user = context.current_user()
    ck = (info.store, info.key, info.capability)
    hit = cache.get(ck)
    if hit is not None:
        cap = capability.peek(info.capability)
        if cap.expires is not None and time.time() > cap.expires:
            cache.drop(ck)
        elif not cap.allows(user):
            raise RefAccessDenied(info.store, info.key, f"it belongs to {cap.owner} and is not shared with "
                                  f"{user or 'an unknown user'}: ask its owner to share it "
                                  "(store.ref(obj, share_with=[...]))")
        else:
            return hit[0]
    data = DirectConnector.from_config(info.connector).get_for(info, user)
    if data is None:
        raise RefResolutionError(info.store, info.key, "no such object: evicted by its owner, past its TTL, or "
                                 "already used (a ref made with evict=True resolves once)")
    obj = codec.decode(data)
    if not info.evict:
        cache.put(ck, obj, info.size)
    return obj


def resolve_through_peer(info) -> Any:
    """Resolve a ref (a RefInfo) of another account's store on this host, through that
    account's peer-ref broker (skyfn/data/peer.py; DESIGN.md section 12): the broker checks
    the capability against the skyfn users of this process's uid. Cached per process under
    the exact capability the broker accepted; a hit is checked against the current user and
    the capability's expiry (with no current user the broker is asked again: it decides by uid)."""
    from skyfn.data import peer

    user = context.current_user()
    try:
        cap = capability.peek(info.capability)
    except (ValueError, KeyError, TypeError):
        raise RefResolutionError(info.store, info.key, "the ref's capability is malformed") from None
    if user is not None and not cap.allows(user):
        raise RefAccessDenied(info.store, info.key, f"it belongs to {cap.owner} and is not shared with {user}: ask "
                              "its owner to share it (store.ref(obj, share_with=[...]))")
    ck = (info.store, info.key, info.capability)
    hit = cache.get(ck)
    if hit is not None:
        if cap.expires is not None and time.time() > cap.expires:
            cache.drop(ck)
        elif user is not None:
            return hit[0]
    obj = codec.decode(peer.fetch(info))
    if not info.evict:
        cache.put(ck, obj, info.size)
    return obj


def evict_ref(info) -> bool:
    """Evict a direct ref (a RefInfo) as this process's user, wherever its endpoint is (the
    owner's Executor evicting refs after their tasks, from a laptop)."""
    from skyfn.data.connectors.direct import DirectConnector

    cache.drop((info.store, info.key))
    cache.drop((info.store, info.key, info.capability))
    return DirectConnector.from_config(info.connector).evict_for(info, context.current_user())
