"""Direct sessions at the service (skyfn.protocol.direct): POST /endpoints/{id}/sessions.

A session lets the SDK send tasks straight to an endpoint agent's direct socket. The
service decides, as for POST /tasks and with the same checks (registry.function_bodies:
the functions exist and the caller may run them; registry.check_endpoint: the caller may
use the endpoint, teams and shares included; allowlist.enforce: the endpoint allows the
functions), then answers a token signed with the session key the agent published in its
heartbeats (lambdas/core/identity/direct_info.py). The token names the session, the caller, the
endpoint, its expiry (SKYFN_DIRECT_SESSION_TTL) and the digest of each function body as
the service stores it: the very text the agent receives in TaskPack.functions; and each
function's owner and name, which the agent's `{owner, name}` allowlist entries match.

The session is recorded in Redis (`ds:<session>`: `o` owner, `e` endpoint, one `f:<id>`
field per function) for the token's lifetime plus RECORD_GRACE_S, so the results the agent
reports later are recorded for the right owner (lambdas/core/tasks/direct_results.py).
"""
from __future__ import annotations

from lambdas.config import settings
from lambdas.core import deps
from lambdas.core.identity import allowlist, direct_info
from lambdas.core.tasks import registry
from lambdas.core.errors import Conflict
from lambdas.core.ids import new_id
from skyfn.protocol.api import OpenSession, SessionOpened
from skyfn.protocol.direct import body_digest, mint_token

RECORD_GRACE_S = 6 * 3600  # results of a session are still recorded this long after its token expires


class NoDirectChannel(Conflict):
    code = "no_direct_channel"


def record_key(session_id: str) -> str:
    return f"ds:{session_id}"


def open(owner: str, endpoint_id: str, body: OpenSession) -> SessionOpened:
    function_ids = set(body.function_ids)
    # the order of POST /tasks' checks, so both answer the same 404 / 403 for the same request
    functions = registry.function_bodies(owner, function_ids)
    record = registry.check_endpoint(owner, endpoint_id)
    allowlist.enforce(((endpoint_id, fid) for fid in sorted(function_ids)), functions, {endpoint_id: record})
    channel = direct_info.published(endpoint_id)
    if channel is None:
        raise NoDirectChannel(
            f"endpoint {endpoint_id} takes no direct sessions: its agent is offline or has no `direct:` section "
            "in its config.yaml; submit through POST /tasks",
            {"endpoint_id": endpoint_id, "reason": "no_direct_channel"})
    session_id = new_id()
    ttl = settings().direct_session_ttl
    digests = {fid: body_digest(fn.body) for fid, fn in functions.items()}
    names = {fid: (fn.owner, fn.name) for fid, fn in functions.items()}  # for the agent's {owner, name} entries
    token, expires_at = mint_token(channel.session_key, session_id=session_id, owner=owner,
                                   endpoint_id=endpoint_id, functions=digests, ttl=ttl, names=names)
    pipe = deps.redis_client().pipeline(transaction=True)
    pipe.hset(record_key(session_id), mapping={"o": owner, "e": endpoint_id, **{f"f:{fid}": 1 for fid in digests}})
    pipe.expire(record_key(session_id), int(ttl + RECORD_GRACE_S))
    pipe.execute()
    return SessionOpened(session_id=session_id, endpoint_id=endpoint_id, address=channel.address,
                         server_key=channel.server_key, token=token, expires_at=expires_at)
