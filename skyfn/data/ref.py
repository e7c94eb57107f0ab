"""Ref: a transparent lazy reference to an object in a store (DESIGN.md's RemoteRef).

A Ref pickles small -- the store's name and connector config, the key, the capability,
where the bytes live -- and resolves on first use in whatever process touches it, then
behaves as the object: attribute access, operators, len, iteration, `isinstance`,
numpy's `np.asarray(ref)` (no copy: the array is a view on the bytes the connector read).
Built on lazy-object-proxy, the library ProxyStore's proxies come from.

Inspect a ref without resolving it: `ref_info(ref)`, `is_ref(obj)`, `is_resolved(ref)`.
`RefInfo.task_argument` marks the refs the Executor made for a task's large arguments: the
worker that ran the task evicts them when it is final (skyfn.data.autoref); a field added
with a default, so RefInfos pickled by older SDKs load with it off.

A Ref resolves through the store layer (`skyfn.data.store.resolve_ref`), which makes Refs
(`Store.ref`) and so sits above this module: it is reached by its name when a Ref is first
used, as stores reach connectors by name (skyfn.data.connectors.CONNECTORS), not imported.
A pickled Ref names `skyfn.data.ref._rebuild`, so refs pickled before stay readable.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Optional

import lazy_object_proxy

# The module that resolves refs (above this one: see the module docstring).
STORE_LAYER = "skyfn.data.store"


@dataclass(frozen=True)
class RefInfo:
    store: str
    connector: dict
    key: str
    capability: str
    endpoint_id: Optional[str] = None
    size: int = 0
    evict: bool = False
    # An argument ref the Executor made for one task (skyfn.data.autoref): the worker that ran
    # the task evicts it once the task is final. Off for every ref a user makes, and for refs
    # pickled by SDKs without the field (their state lacks it: this class default answers).
    task_argument: bool = False

    @property
    def owner(self) -> str:
        from skyfn.data.capability import peek

        return peek(self.capability).owner


class _Resolver:
    """The proxy's factory: what to fetch, and how."""

    __slots__ = ("info",)

    def __init__(self, info: RefInfo):
        self.info = info

    def __call__(self) -> Any:
        return importlib.import_module(STORE_LAYER).resolve_ref(self.info)


def _rebuild(info: RefInfo) -> "Ref":
    return Ref(info)


class Ref(lazy_object_proxy.Proxy):
    def __init__(self, info: RefInfo):
        super().__init__(_Resolver(info))

    def __reduce__(self):
        return _rebuild, (object.__getattribute__(self, "__factory__").info,)

    def __reduce_ex__(self, protocol):
        return self.__reduce__()

    def __repr__(self) -> str:
        info = object.__getattribute__(self, "__factory__").info
        state = "resolved" if object.__getattribute__(self, "__resolved__") else "unresolved"
        return f"<skyfn Ref {info.store}/{info.key} ({info.size} bytes, {state})>"

    def __array__(self, dtype=None, copy=None):
        import numpy as np

        target = self.__wrapped__
        return np.asarray(target, dtype=dtype) if dtype is not None else np.asarray(target)


def is_ref(obj: Any) -> bool:
    return type(obj) is Ref


def ref_info(obj: Any) -> RefInfo:
    if type(obj) is not Ref:
        raise TypeError(f"not a skyfn Ref: {type(obj).__name__}")
    return object.__getattribute__(obj, "__factory__").info


def is_resolved(obj: Any) -> bool:
    return bool(object.__getattribute__(obj, "__resolved__"))
