"""Endpoint credentials on the wire, shared by the service (which issues and checks them,
lambdas/core/identity/agent_keys.py) and the endpoint agent (which presents them).

A credential is `skyfn-agent.<endpoint id>.<secret>`. Agents send it as a bearer token to
their endpoint's agent routes, and log in to Redis queues with its secret as the password
of the endpoint's Redis user. It is a secret: never log it.
"""
from __future__ import annotations

import re
from typing import Optional
from urllib.parse import quote, urlsplit, urlunsplit

PREFIX = "skyfn-agent."
FORMAT = re.compile(r"^skyfn-agent\.([A-Za-z0-9-]{1,64})\.([A-Za-z0-9_-]{32,128})$")


def parse(credential: str) -> Optional[tuple[str, str]]:
    """(endpoint id, secret) of a well-formed credential, else None."""
    m = FORMAT.match(credential or "")
    return (m.group(1), m.group(2)) if m else None


def _netloc(user: str, password: Optional[str], host: Optional[str], port: Optional[int]) -> str:
    host = host or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    login = quote(user, safe="") + (f":{quote(password, safe='')}" if password is not None else "")
    return f"{login}@{host}" + (f":{port}" if port else "")


def redis_url(base: str, user: str, password: Optional[str]) -> str:
    """`base` with its login replaced by user (and password)."""
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, _netloc(user, password, parts.hostname, parts.port), parts.path, parts.query,
                       parts.fragment))


def with_secret(url: str, credential: str, replace: bool = False) -> str:
    """A descriptor URL that names the Redis user only, completed with the credential's
    secret; `replace` also swaps the secret of a URL that already holds one."""
    parsed = parse(credential)
    if parsed is None:
        raise ValueError("not an endpoint credential (skyfn-agent.<endpoint id>.<secret>)")
    parts = urlsplit(url)
    if not url.startswith(("redis://", "rediss://")) or not parts.username or (parts.password and not replace):
        return url
    return redis_url(url, parts.username, parsed[1])
