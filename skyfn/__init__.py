"""skyfn: federated function-as-a-service for science.

    from skyfn import Client, Executor, TaskRef

The SDK imports nothing above ``skyfn.protocol``; its names load lazily, so importing
``skyfn.protocol`` (as workers and service handlers do) does not pull in the SDK's HTTP stack.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Client": "skyfn.client",
    "Batch": "skyfn.client",
    "EndpointNotFound": "skyfn.client",
    "Executor": "skyfn.executor",
    "SkyfnFuture": "skyfn.executor",
    "TaskRef": "skyfn.dataflow",
    "SkyfnAPIError": "skyfn.http",
    "SkyfnConnectionError": "skyfn.http",
    "TaskNotFound": "skyfn.http",
    "ConfigError": "skyfn.config",
    "SkyfnError": "skyfn.protocol.errors",
    "TaskFailed": "skyfn.protocol.errors",
    "TaskCancelled": "skyfn.protocol.errors",
    "TaskTimedOut": "skyfn.protocol.errors",
    "ResultExpired": "skyfn.protocol.errors",
    "DependencyFailed": "skyfn.protocol.errors",
    "RemoteExecutionError": "skyfn.protocol.errors",
    "SerializationError": "skyfn.protocol.errors",
    "DeserializationError": "skyfn.protocol.errors",
    "TaskState": "skyfn.protocol.states",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'skyfn' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
