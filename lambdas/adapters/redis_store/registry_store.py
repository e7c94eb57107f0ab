"""The registry's hot cache (lambdas/core/tasks/registry.py): function bodies and endpoint
records as the submission path reads them, endpoint liveness from heartbeats. DynamoDB is
the durable registry; these keys are rebuilt from it on a miss.

  fn:<function>          hash: o owner, b body, c created, meta JSON {name, tag, container, memoize}
  ep:<endpoint>          hash: o owner, name, c created, meta JSON, the allowlist field
                         (lambdas/core/identity/allowlist.py), hb last heartbeat, st status
                         (new/online/offline), stats JSON, ft the agent's features
  epname:<owner>:<name>  the id of the owner's endpoint called name
  eps:<owner>            set: the owner's endpoint ids
  ep-index               set: every endpoint with a record here (nothing periodic walks it:
                         the reaper's liveness sweep reads ep-beats, liveness_store.py)
  epdirect:<endpoint>    the agent's direct channel (JSON), kept apart from ep:<endpoint> so
                         nothing reading the record hands its session key out; written by
                         the heartbeat in the same round trip (lambdas/core/identity/direct_info.py)
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from lambdas.adapters.redis_store.liveness_store import BEATS
ALL_ENDPOINTS = "ep-index"
KEEP = object()  # a heartbeat that leaves the direct channel as it is
DIRECT_FIELD = "dx"  # in ep:<id>: a heartbeat published a direct channel (so a withdrawal has one to delete)


def _dec(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in raw.items()}


def direct_key(endpoint_id: str) -> str:
    # not under ep:<id>: a scan of ep:* (endpoint_ids) must find endpoints only
    return f"epdirect:{endpoint_id}"


class RegistryCache:
    def __init__(self, client: Any):
        self.r = client

    # --- functions ---------------------------------------------------------------------
    def cache_function(self, function_id: str, owner: str, body: str, created: float, meta: bytes) -> None:
        self.r.hset(f"fn:{function_id}", mapping={"o": owner, "b": body, "c": str(created), "meta": meta})

    def functions_and_endpoints(self, function_ids: list[str], endpoint_ids: list[str]
                                ) -> tuple[list[tuple[Optional[bytes], Optional[bytes], Optional[bytes]]],
                                           dict[str, dict[str, str]]]:
        """In one round trip: (owner, body, meta) of each function, and the records of the
        endpoints that have one (id -> record)."""
        pipe = self.r.pipeline(transaction=False)
        for fid in function_ids:
            pipe.hmget(f"fn:{fid}", "o", "b", "meta")
        for ep in endpoint_ids:
            pipe.hgetall(f"ep:{ep}")
        answers = pipe.execute()
        records = {}
        for ep, raw in zip(endpoint_ids, answers[len(function_ids):]):
            raw = _dec(raw)
            if "o" in raw:
                records[ep] = raw
        return [tuple(a) for a in answers[:len(function_ids)]], records

    def function(self, function_id: str) -> dict[str, str]:
        """The cached function ({} when not cached)."""
        return _dec(self.r.hgetall(f"fn:{function_id}"))

    def function_owner(self, function_id: str) -> Optional[str]:
        o = self.r.hget(f"fn:{function_id}", "o")
        return o.decode() if o is not None else None

    def function_metas(self, function_ids: list[str]) -> list[Optional[bytes]]:
        """The meta JSON of each function (None when not cached), in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for fid in function_ids:
            pipe.hget(f"fn:{fid}", "meta")
        return pipe.execute()

    # --- endpoints ---------------------------------------------------------------------
    def endpoint_named(self, owner: str, name: str) -> Optional[str]:
        """The id cached for the owner's endpoint called name."""
        cached = self.r.get(f"epname:{owner}:{name}")
        return cached.decode() if cached else None

    def cache_endpoint(self, endpoint_id: str, owner: str, name: str, created: float, meta: str,
                       allowlist_field: str, allowlist: Optional[str]) -> None:
        """The endpoint's record, its name, and its place in the owner's and the global index
        (one round trip). `allowlist`: the encoded allowlist, None for any function."""
        key = f"ep:{endpoint_id}"
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(key, mapping={"o": owner, "name": name, "c": str(created), "meta": meta})
        if allowlist is not None:
            pipe.hset(key, allowlist_field, allowlist)
        else:
            pipe.hdel(key, allowlist_field)
        pipe.set(f"epname:{owner}:{name}", endpoint_id)
        pipe.sadd(f"eps:{owner}", endpoint_id)
        pipe.sadd(ALL_ENDPOINTS, endpoint_id)
        pipe.execute()

    def endpoint(self, endpoint_id: str) -> dict[str, str]:
        """The endpoint's record ({} when not cached)."""
        return _dec(self.r.hgetall(f"ep:{endpoint_id}"))

    def endpoint_ids(self) -> list[str]:
        """Every endpoint with a record here, from the index the records are cached with. A
        store from before the index is scanned once to build it: the reaper runs every few
        seconds and must not walk every task key each time."""
        ids = self.r.smembers(ALL_ENDPOINTS)
        if not ids:
            ids = {key[3:] for key in self.r.scan_iter(match="ep:*", count=1000)}
            if ids:
                self.r.sadd(ALL_ENDPOINTS, *ids)
        return sorted(i.decode() if isinstance(i, bytes) else i for i in ids)

    def owner_endpoint_ids(self, owner: str) -> set[str]:
        return {i.decode() for i in self.r.smembers(f"eps:{owner}")}

    def heartbeat(self, endpoint_id: str, beat: str, stats: bytes, *, direct: Any = KEEP,
                  features: Optional[Iterable[str]] = None) -> None:
        """Record a heartbeat (online, its time and stats; its place in ep-beats) in one round
        trip. `direct`: KEEP, None to withdraw the direct channel, or (JSON, seconds) to
        publish it; `features`: what the agent reported it understands (None: not the agent's
        own heartbeat)."""
        key = f"ep:{endpoint_id}"
        pipe = self.r.pipeline(transaction=False)
        fields: dict[str, Any] = {"hb": beat, "st": "online", "stats": stats}
        if features is not None:
            fields["ft"] = ",".join(features)
        if direct is not None and direct is not KEEP:
            fields[DIRECT_FIELD] = "1"
        pipe.hset(key, mapping=fields)
        pipe.zadd(BEATS, {endpoint_id: float(beat)})
        if direct is None:
            pipe.delete(direct_key(endpoint_id))
            pipe.hdel(key, DIRECT_FIELD)
        elif direct is not KEEP:
            value, seconds = direct
            pipe.set(direct_key(endpoint_id), value, ex=seconds)
        pipe.execute()
