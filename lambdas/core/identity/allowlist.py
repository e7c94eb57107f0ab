"""Endpoint allowlists at the service: kept as the agent reports them, enforced at submission.

The agent reports its `allowed_functions` (skyfn.protocol.allowlist) when it registers and
with each heartbeat. The list is kept in the endpoint's hot record (`ep:<id>` field
`allow`, JSON; absent: any function) and in its DynamoDB item (`allowed`), so a hot store
that lost it rebuilds it. A submission (tasks, batches, flows, SPMD groups) naming a
function the endpoint does not allow is refused whole with 403, naming the endpoint and
the function. The agent checks every task again (endpoint_agent/allowlist.py).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

import orjson

from lambdas.adapters.redis_store.endpoint_allowlists import ALLOW_FIELD
from lambdas.core import deps
from lambdas.core.errors import Forbidden
from skyfn.protocol.allowlist import AllowedFunction, permits, refusal

FIELD = ALLOW_FIELD     # in the hot record ep:<id>
ITEM_FIELD = "allowed"  # in the DynamoDB item


def encode(entries: Optional[list[AllowedFunction]]) -> Optional[str]:
    if entries is None:
        return None
    return orjson.dumps([e.model_dump(exclude_none=True) for e in entries]).decode()


def decode(raw: Optional[bytes | str]) -> Optional[list[AllowedFunction]]:
    if raw is None or raw in (b"", ""):
        return None
    return [AllowedFunction.model_validate(e) for e in orjson.loads(raw)]


def update(endpoint_id: str, entries: Optional[list[AllowedFunction]], current: Any = ...) -> None:
    """The agent reported its list (a heartbeat): keep it where it changed. `current`: the
    encoded list the caller read with the endpoint's record (None: none), else read here."""
    hot = deps.endpoint_allowlists()
    new = encode(entries)
    if (hot.allowlist(endpoint_id) if current is ... else current) == new:
        return
    hot.set_allowlist(endpoint_id, new)
    db = deps.dynamo()
    item = db.get_endpoint(endpoint_id)
    if item is not None:
        if new is None:
            item.pop(ITEM_FIELD, None)
        else:
            item[ITEM_FIELD] = new
        db.put_endpoint(item)


def enforce(pairs: Iterable[tuple[str, str]], functions: Mapping[str, object],
            known: Optional[Mapping[str, Mapping[str, str]]] = None) -> None:
    """Raise Forbidden for the first (endpoint, function) pair the endpoint's list refuses.
    `functions` maps function ids to registry.FunctionBody (owner and name); `known`, the
    hot records of endpoints this request has read already (groups.Routing.records)."""
    wanted: dict[str, set[str]] = {}
    for ep, fid in pairs:
        if ep:
            wanted.setdefault(ep, set()).add(fid)
    if not wanted:
        return
    known = known or {}
    eps = sorted(wanted)
    lists = {ep: (known[ep].get(FIELD), known[ep].get("name")) for ep in eps if ep in known}
    unread = [ep for ep in eps if ep not in known]
    if unread:
        lists.update(deps.endpoint_allowlists().allowlists_and_names(unread))
    for ep in eps:
        raw, name = lists[ep]
        entries = decode(raw)
        if entries is None:
            continue
        for fid in sorted(wanted[ep]):
            fn = functions.get(fid)
            owner, fname = getattr(fn, "owner", None), getattr(fn, "name", None)
            if not permits(entries, fid, owner, fname):
                label = f"{ep} ({name})" if name else ep
                raise Forbidden(refusal(label, fid, owner, fname),
                                {"endpoint_id": ep, "function_id": fid, "reason": "function_not_allowed"})
