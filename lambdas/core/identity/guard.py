"""What an authenticated caller may reach before routing: endpoint agents only their own
endpoint's agent routes (connect, heartbeat, lanes, task-states, direct/listen); everyone within their rate limit
(lambdas/core/identity/limits.py). Returns (status, body, headers) of the refusal, or None."""
from __future__ import annotations

import re
from typing import Optional

from lambdas.core.identity import limits

# (method, path) an endpoint agent may call, the endpoint id first in the path
_AGENT_ROUTES = (("POST", re.compile(r"^/endpoints/([A-Za-z0-9-]{1,64})/(heartbeat|connect|lanes|task-states|direct/listen)$")),
                 ("DELETE", re.compile(r"^/endpoints/([A-Za-z0-9-]{1,64})/lanes/[^/]+$")))


def _refuse(status: int, code: str, message: str, headers: Optional[dict] = None) -> tuple[int, dict, dict]:
    return status, {"error": code, "message": message}, headers or {}


def _agent_route_of(method: str, path: str) -> Optional[str]:
    """The endpoint id of an agent route, else None."""
    for allowed, pattern in _AGENT_ROUTES:
        m = pattern.match(path or "") if method == allowed else None
        if m:
            return m.group(1)
    return None


def check(identity, method: str, path: str) -> Optional[tuple[int, dict, dict]]:
    if identity.is_agent:
        if _agent_route_of(method, path) != identity.endpoint_id:
            return _refuse(403, "forbidden", "an endpoint credential only serves its own endpoint's agent routes "
                                             "(POST /endpoints/<id>/connect, /heartbeat, /lanes, /task-states and /direct/listen, "
                                             "DELETE /endpoints/<id>/lanes/<lane>); use a user token")
        principal = f"endpoint:{identity.endpoint_id}"
    else:
        principal = f"user:{identity.user}"
    verdict = limits.take(principal)
    if not verdict.allowed:
        return _refuse(429, "rate_limited",
                       f"rate limit of {verdict.rate:g} requests/s (bursts of {verdict.burst:g}) exceeded for "
                       f"{principal}: retry after {verdict.retry_after:.2f} s, or batch more work per request",
                       {"Retry-After": limits.retry_after_header(verdict.retry_after)})
    return None
