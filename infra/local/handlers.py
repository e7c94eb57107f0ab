"""The default handlers of the embedded runtime, imported only when first needed so that
the gateway, the event-source mapping and the scheduler can be used (and tested) with any
callables, and importing infra.local never imports lambdas/."""
from __future__ import annotations

import importlib
from typing import Any, Callable

Handler = Callable[[dict, Any], Any]


def load(module: str, attr: str = "handler") -> Handler:
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise RuntimeError(f"cannot import the service handler {module}.{attr}: {exc}; "
                           "is the skyfn checkout complete (lambdas/) and its requirements installed?") from exc


def api_handler() -> Handler:
    return load("lambdas.api")


def results_handler() -> Handler:
    return load("lambdas.results")


def reaper_handler() -> Handler:
    return load("lambdas.reaper")


def history_handler() -> Handler:
    return load("lambdas.history")


def ensure_resources() -> Any:
    return load("lambdas.bootstrap", "ensure_resources")()


def mint_token(key: str, user: str, ttl_seconds: int = 30 * 24 * 3600, *, username: str | None = None,
               email: str | None = None, identity_provider: str | None = None) -> str:
    """A token of the local issuer, with the identity claims given (lambdas.auth.mint_token)."""
    return load("lambdas.auth", "mint_token")(key, user, ttl_seconds=ttl_seconds, issuer="skyfn-local",
                                              username=username, email=email, identity_provider=identity_provider)
