"""The hot store's ACL users that are queue logins (an endpoint's `ep-<id>`, a lane's
`ln-<ep>-<lane>`), for lambdas/core/identity/queue_acl.py: created, listed and removed on the
service's connection, with the rules of lambdas/adapters/queue_logins.py."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from lambdas.adapters import queue_logins


class QueueLoginUsers:
    def __init__(self, client: Any):
        self.r = client

    def set_user(self, user: str, digest: str, keys: Mapping[str, Iterable[str]]) -> None:
        """Create or replace the login: password hash `digest`, key patterns by role."""
        queue_logins.set_user(self.r, user, digest, keys)

    def existing(self, prefixes: tuple[str, ...]) -> dict[str, tuple[list[str], list[str]]]:
        """Logins whose names start with one of `prefixes`: name -> (password hashes, key patterns)."""
        return queue_logins.existing(self.r, prefixes)

    def delete_users(self, *users: str) -> None:
        """Remove the logins (unknown ones skipped); Redis closes their connections."""
        queue_logins.delete_users(self.r, *users)
