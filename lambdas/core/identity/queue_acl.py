"""Redis ACL users of queue logins on the Redis Streams path: the one set of rules that an
endpoint's login (lambdas/core/identity/agent_keys.py) and a lane's login
(lambdas/core/identity/lanes.py) both get, differing only in their keys.

A queue login may use its own queues' keys (each queue is a stream with its `:leases` and
`:dlq` keys, skyfn/protocol/queues/redis_streams.py) and may only *write* to the shared
results stream; no pub/sub channel, no key-space command (SCAN, KEYS), nothing of
@admin or @dangerous. Its password is stored hashed (`#<sha256>`).
"""
from __future__ import annotations

import hashlib
import logging

import redis

from lambdas.config import settings
from lambdas.core import deps

log = logging.getLogger("skyfn.queue_acl")

QUEUE_SUFFIXES = ("", ":leases", ":dlq")


def digest(secret: str) -> str:
    """How a password is kept: SHA-256, hex (as ACL SETUSER `#<hash>` takes it)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def queue_keys(*names: str) -> list[str]:
    """Every key of the named queues."""
    return [f"{name}{suffix}" for name in names for suffix in QUEUE_SUFFIXES]


def rules(digest: str, keys: list[str]) -> list[str]:
    """ACL SETUSER rules of a queue login with password hash `digest` and key patterns `keys`."""
    return ["reset", "on", f"#{digest}", "resetchannels", *(f"~{k}" for k in keys),
            f"%W~{settings().results_queue_name}", "+@all", "-@admin", "-@dangerous", "-@keyspace", "-@pubsub"]


def set_user(user: str, digest: str, keys: list[str]) -> None:
    """Create or replace the login (its open connections keep working until it is deleted)."""
    r = deps.redis_client()
    r.execute_command("ACL", "SETUSER", user, *rules(digest, keys))
    save(r)


def delete_users(*users: str) -> None:
    """Remove the logins (any that do not exist are skipped); Redis also closes their
    connections. A failure is logged, not raised."""
    if not users:
        return
    r = deps.redis_client()
    try:
        r.execute_command("ACL", "DELUSER", *users)
        save(r)
    except redis.ResponseError as exc:
        log.warning("could not remove the Redis users %s: %s", ", ".join(users), exc)


def save(r: redis.Redis) -> None:
    """Persist users in the server's ACL file, so they survive a restart of Redis (the
    embedded runtime starts redis-server with one). Without an ACL file users live until
    the server restarts; agents then get fresh ones by registering (or binding) again."""
    try:
        r.execute_command("ACL", "SAVE")
    except redis.ResponseError as exc:
        if "ACL file" not in str(exc) and "aclfile" not in str(exc).lower():
            raise
