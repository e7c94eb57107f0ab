"""Connectors by name: one module per path, loaded only when used (the SDK stays light).

`connector_class("redis")` imports skyfn.data.connectors.redis on first use; an unknown
name is a DataConfigError that lists the allowed ones.
"""
from __future__ import annotations

import importlib

from skyfn.data.connectors.base import Connector
from skyfn.data.errors import DataConfigError

CONNECTORS: dict[str, str] = {
    "redis": "skyfn.data.connectors.redis:RedisConnector",
    "file": "skyfn.data.connectors.file:FileConnector",
    "s3": "skyfn.data.connectors.s3:S3Connector",
    "globus": "skyfn.data.connectors.globus:GlobusConnector",
    "direct": "skyfn.data.connectors.direct:DirectConnector",
}


def connector_class(kind: str) -> type:
    try:
        path = CONNECTORS[kind]
    except (KeyError, TypeError):
        raise DataConfigError(f"unknown connector {kind!r}: use one of {', '.join(sorted(CONNECTORS))}") from None
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def from_config(config: dict) -> Connector:
    """A connector from {"kind": name, ...its config}."""
    if not isinstance(config, dict) or "kind" not in config:
        raise DataConfigError(f"a connector config needs 'kind' (one of {', '.join(sorted(CONNECTORS))})")
    return connector_class(config["kind"]).from_config({k: v for k, v in config.items() if k != "kind"})


__all__ = ["CONNECTORS", "Connector", "connector_class", "from_config"]
