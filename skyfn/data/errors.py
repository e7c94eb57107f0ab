"""Errors of the data plane: each names the ref, its store and the reason, and says what to do."""
from __future__ import annotations


class DataError(Exception):
    """Base class of skyfn.data errors."""


class DataConfigError(DataError, ValueError):
    """A store or connector configuration is wrong (unknown name, missing setting)."""


class RefResolutionError(DataError):
    """A ref could not be resolved: expired, evicted, its store unreachable or unknown here."""

    def __init__(self, store: str, key: str, reason: str):
        self.store, self.key, self.reason = store, key, reason
        super().__init__(f"cannot resolve ref {key!r} of store {store!r}: {reason}")

    def __reduce__(self):
        return (type(self), (self.store, self.key, self.reason))


class RefAccessDenied(RefResolutionError):
    """The ref's capability does not name the user whose task tries to resolve it."""
