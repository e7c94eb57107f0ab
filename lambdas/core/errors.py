"""Errors of the service core; the API maps each to its 4xx status."""
from __future__ import annotations


class ServiceError(Exception):
    status = 400
    code = "bad_request"

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
