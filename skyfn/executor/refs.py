"""How an Executor's large arguments become refs (skyfn.data.autoref): which store, as which user.

``argument_refs`` makes the Executor's ``ArgumentRefs`` from its ``data_store`` argument
(a Store, a store's name, or "auto": the endpoint's default store when its agent runs on
this machine), or None when arguments stay inline.
"""
from __future__ import annotations

from typing import Any, Optional

from skyfn.client import Client


def argument_refs(client: Client, data_store: Any, endpoint_name: Optional[str], threshold: int,
                   evict_refs: bool, ttl: Optional[float] = None):
    """The Executor's ArgumentRefs (skyfn.data.autoref), or None when arguments stay inline."""
    if data_store is None or data_store is False:
        return None
    from skyfn.data import context
    from skyfn.data.autoref import ArgumentRefs, local_endpoint_store
    from skyfn.data.store import get_store

    if isinstance(data_store, str) and data_store == "auto":
        store = local_endpoint_store(endpoint_name) if endpoint_name else None
    elif isinstance(data_store, str):
        store = get_store(data_store)
        if store is None:
            raise ValueError(f"data_store {data_store!r} is not a store known in this process: create it with "
                             "skyfn.data.Store(name, connector, secret=...) first, or pass the Store itself")
    else:
        store = data_store
    if store is None:
        return None

    context.set_user_provider(client.whoami)  # result refs resolve in this process as this user
    return ArgumentRefs(store, lambda: context.current_user() or client.whoami(), threshold, evict_refs, ttl)
