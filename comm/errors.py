"""Exceptions of the communicator. The C++ core's exceptions are mapped onto these by the
binding (comm/_glue.h), so callers catch one family whatever layer failed.

    CommError             base: anything the communicator could not do
    ├── AuthError         the rendezvous server rejected the group token
    ├── TimeoutError      an operation exceeded the communicator's timeout
    │                     (also a builtins.TimeoutError)
    └── PeerLostError     a peer closed or died (also a builtins.ConnectionError)
"""
import builtins


class CommError(Exception):
    """The communicator could not complete an operation."""


class AuthError(CommError):
    """The rendezvous server rejected the token (wrong secret, wrong group or expired)."""


class TimeoutError(CommError, builtins.TimeoutError):  # noqa: A001 - deliberate shadowing
    """An operation did not complete within the communicator's timeout."""


class PeerLostError(CommError, builtins.ConnectionError):
    """A peer closed its channel or died while an operation needed it."""
