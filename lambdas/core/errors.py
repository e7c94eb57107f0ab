"""Errors of the service core; the API maps each to its 4xx status."""
from __future__ import annotations


class ServiceError(Exception):
    status = 400
    code = "bad_request"
    headers: dict[str, str] = {}  # response headers of the answer (e.g. Retry-After); never mutated

    def __init__(self, message: str, details: object = None):
        super().__init__(message)
        self.message = message
        self.details = details


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class Conflict(ServiceError):
    status = 409
    code = "conflict"


class Invalid(ServiceError):
    """Well-formed but not acceptable (a bad group, policy, share, flow...): subclasses name the code."""

    status = 422
    code = "invalid"


class TooLarge(ServiceError):
    status = 413
    code = "payload_too_large"


class Unavailable(ServiceError):
    """A dependency (queue, store) failed; the request may be retried as is."""

    status = 503
    code = "unavailable"


class Forbidden(ServiceError):
    """The caller may see the object but not do this with it (the role is too small)."""

    status = 403
    code = "forbidden"


class TooMany(ServiceError):
    """A rate limit: the request may be retried after the time the message names."""

    status = 429
    code = "rate_limited"


class Backlogged(TooMany):
    """The hot store's backlog is over its bound (lambdas/core/tasks/backlog.py): nothing was
    stored; the request may be retried as is after Retry-After seconds. Step Functions sees the
    class name: the states that submit tasks Retry it (stepfunctions/definitions, flowspec)."""

    code = "backlog"

    def __init__(self, message: str, retry_after: int, details: object = None):
        super().__init__(message, details)
        self.retry_after = retry_after
        self.headers = {"Retry-After": str(retry_after)}
