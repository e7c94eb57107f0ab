"""Redis ACL users of queue logins on the Redis Streams path: which keys an endpoint's login
(lambdas/core/identity/agent_keys.py) and a lane's login (lambdas/core/identity/lanes.py)
reach, in each role of lambdas/adapters/queue_logins.py, whose table says which commands
each role's keys take.

A queue login consumes its own queues (each queue is a stream with its `:leases` and
`:dlq` keys, skyfn/protocol/queues/redis_streams.py), may hand messages to the streams it
feeds (an endpoint: its lanes), and may only *add* entries to the stream results go back
on. Its password is stored hashed (`#<sha256>`).
"""
from __future__ import annotations

import hashlib
from typing import Sequence

from lambdas.adapters import queue_logins
from lambdas.config import settings
from lambdas.core import deps


def digest(secret: str) -> str:
    """How a password is kept: SHA-256, hex (as ACL SETUSER `#<hash>` takes it)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def scope(consumes: Sequence[str], feeds: Sequence[str] = ()) -> dict[str, list[str]]:
    """The key patterns of each role for a login that consumes the queues `consumes` (names
    or patterns of queues) and sends to `feeds`; results go to the results stream."""
    return {queue_logins.QUEUE: list(consumes),
            queue_logins.LEASES: [f"{q}:leases" for q in consumes],
            queue_logins.DEAD: [f"{q}:dlq" for q in consumes],
            queue_logins.FEEDS: list(feeds),
            queue_logins.RESULTS: [settings().results_queue_name]}


def set_user(user: str, digest: str, consumes: Sequence[str], feeds: Sequence[str] = ()) -> None:
    """Create or replace the login (its open connections keep working until it is deleted)."""
    deps.queue_login_users().set_user(user, digest, scope(consumes, feeds))


def existing(*prefixes: str) -> dict[str, tuple[list[str], list[str]]]:
    """Queue logins whose names start with one of `prefixes`: name -> (password hashes,
    patterns of the keys it may read)."""
    return deps.queue_login_users().existing(prefixes)


def delete_users(*users: str) -> None:
    """Remove the logins (unknown ones are skipped); Redis also closes their connections."""
    deps.queue_login_users().delete_users(*users)
