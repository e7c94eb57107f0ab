"""skyfn.data: pass data between tasks by reference (DESIGN.md section 6).

    from skyfn.data import Store, RedisConnector
    store = Store("scratch", RedisConnector(port=6379, password="..."), secret=SECRET)
    ref = store.ref(big_array, ttl=3600)        # small when pickled; resolved where it is used

Connectors (one module each, behind skyfn.data.connectors.base.Connector): redis, file,
s3, globus, direct. Names are imported lazily: `import skyfn.data` loads no connector
library (redis, boto3, globus-sdk, numpy).
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Store": "skyfn.data.store", "get_store": "skyfn.data.store", "register_store": "skyfn.data.store",
    "default_store": "skyfn.data.store", "endpoint_stores": "skyfn.data.store", "get_redis_client": "skyfn.data.store",
    "Ref": "skyfn.data.ref", "RefInfo": "skyfn.data.ref", "ref_info": "skyfn.data.ref", "is_ref": "skyfn.data.ref",
    "is_resolved": "skyfn.data.ref",
    "current_user": "skyfn.data.context",
    "DataError": "skyfn.data.errors", "DataConfigError": "skyfn.data.errors",
    "RefResolutionError": "skyfn.data.errors", "RefAccessDenied": "skyfn.data.errors",
    "RedisConnector": "skyfn.data.connectors.redis", "FileConnector": "skyfn.data.connectors.file",
    "S3Connector": "skyfn.data.connectors.s3", "GlobusConnector": "skyfn.data.connectors.globus",
    "GlobusFile": "skyfn.data.connectors.globus", "DirectConnector": "skyfn.data.connectors.direct",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'skyfn.data' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)
