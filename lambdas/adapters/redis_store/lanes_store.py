"""The lane registry of multi-user endpoints in the hot store, for lambdas/core/identity/lanes.py.

Keys (`<ep>` the endpoint id, `<lane>` the lane name):
- `lane:<ep>:<lane>`        hash: mac_key, password (of the lane's queue login), created.
- `lane:<ep>:<lane>:ids`    set: the identity ids bound to the lane while it is open.
- `lanes:<ep>`              hash: "<identity id> <config key>" -> lane.
- `lanes:<ep>:queues`       set: lanes whose task queues the reaper watches.
The reads that check a lane's sealed pack or the tasks a lane may answer for also read the
owners of those tasks (`t:<task>` field o), in the same round trip.
"""
from __future__ import annotations

from typing import Any, Optional

from lambdas.adapters.redis_store import lua_files
from lambdas.adapters.redis_store.store import TaskStore


def _record(endpoint_id: str, lane: str) -> str:
    return f"lane:{endpoint_id}:{lane}"


def _ids(endpoint_id: str, lane: str) -> str:
    return f"lane:{endpoint_id}:{lane}:ids"


def _bindings(endpoint_id: str) -> str:
    return f"lanes:{endpoint_id}"


def _watched(endpoint_id: str) -> str:
    return f"lanes:{endpoint_id}:queues"


def _decoded(values: Any) -> set[str]:
    return {v.decode() for v in values}


class LaneStore:
    def __init__(self, client: Any):
        self.r = client
        self._close = lua_files.register(client, "close_lane")
        self._forget = lua_files.register(client, "forget_lane")

    def bind_lane(self, endpoint_id: str, lane: str, identity_id: str, config_key: str, *, mac_key: str,
                  password: str, created: str) -> tuple[str, str, set[str]]:
        """Open the lane (its mac_key, password and created are set only when new), bind
        (identity, config key) to it and watch its queue, in one transaction. Returns the
        lane's (mac_key, password, bound identities)."""
        rec, ids = _record(endpoint_id, lane), _ids(endpoint_id, lane)
        pipe = self.r.pipeline(transaction=True)
        pipe.hsetnx(rec, "mac_key", mac_key)
        pipe.hsetnx(rec, "password", password)
        pipe.hsetnx(rec, "created", created)
        pipe.hset(_bindings(endpoint_id), f"{identity_id} {config_key}", lane)
        pipe.sadd(ids, identity_id)
        pipe.sadd(_watched(endpoint_id), lane)
        pipe.hmget(rec, "mac_key", "password")
        pipe.smembers(ids)
        *_, (got_mac, got_password), bound = pipe.execute()
        return got_mac.decode(), got_password.decode(), _decoded(bound)

    def close_lane(self, endpoint_id: str, lane: str) -> Optional[int]:
        """Unbind everything from the lane and drop its record: the bindings removed, or None
        when the lane had neither a record nor a binding."""
        existed, removed = self._close(keys=[_bindings(endpoint_id), _record(endpoint_id, lane),
                                             _ids(endpoint_id, lane)], args=[lane])
        return int(removed) if existed or removed else None

    def lanes_of(self, endpoint_id: str) -> set[str]:
        """Every lane of the endpoint that is bound or watched (one round trip)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hvals(_bindings(endpoint_id))
        pipe.smembers(_watched(endpoint_id))
        bound, kept = pipe.execute()
        return _decoded(bound) | _decoded(kept)

    def lane_for(self, endpoint_id: str, identity_id: str, config_key: str) -> Optional[str]:
        lane = self.r.hget(_bindings(endpoint_id), f"{identity_id} {config_key}")
        return lane.decode() if lane is not None else None

    def watched(self, endpoint_ids: list[str]) -> dict[str, list[str]]:
        """endpoint id -> its watched lanes, for endpoints that have any (one round trip)."""
        pipe = self.r.pipeline(transaction=False)
        for endpoint_id in endpoint_ids:
            pipe.smembers(_watched(endpoint_id))
        return {ep: sorted(_decoded(got)) for ep, got in zip(endpoint_ids, pipe.execute()) if got}

    def forget_if_drained(self, endpoint_id: str, lane: str, queue_name: str) -> bool:
        """Stop watching a closed lane whose queue `queue_name` and its dead letters are empty."""
        return bool(self._forget(keys=[_watched(endpoint_id), _record(endpoint_id, lane), queue_name,
                                       f"{queue_name}:dlq"], args=[lane]))

    def identities_and_owners(self, endpoint_id: str, lane: str,
                              task_ids: list[str]) -> tuple[set[str], dict[str, str]]:
        """The identities bound to the lane, and task id -> owner of those of `task_ids` that
        exist (one round trip)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.smembers(_ids(endpoint_id, lane))
        TaskStore.owners_on(pipe, task_ids)
        bound, *owned = pipe.execute()
        return _decoded(bound), TaskStore.owners_from(task_ids, owned)

    def seal_check(self, endpoint_id: str, lane: str,
                   task_ids: list[str]) -> tuple[Optional[str], set[str], dict[str, str]]:
        """The lane's MAC key (None when it is not open), its bound identities, and task id ->
        owner of those of `task_ids` that exist (one round trip)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hget(_record(endpoint_id, lane), "mac_key")
        pipe.smembers(_ids(endpoint_id, lane))
        TaskStore.owners_on(pipe, task_ids)
        mac_key, bound, *owned = pipe.execute()
        return (mac_key.decode() if mac_key is not None else None), _decoded(bound), \
            TaskStore.owners_from(task_ids, owned)
