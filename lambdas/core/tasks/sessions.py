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

The session is recorded in the hot store (`ds:<session>`: `o` owner, `e` endpoint, one
`f:<id>` field per function; lambdas/adapters/redis_store/session_store.py) for the token's
lifetime plus RECORD_GRACE_S, so the results the agent reports later are recorded for the
right owner (lambdas/core/tasks/direct_results.py).

An agent that listens at the rendezvous server (DirectInfo.rendezvous: behind a NAT or a
site firewall; skyfn.protocol.direct_path) gets its LISTEN ticket from `listen_ticket`
(POST /endpoints/{id}/direct/listen, its own credential only), and each session on it a
PathTicket: the call token binds the session's caller (its id and user) to the endpoint's
listener name at the rendezvous server, and the path key binds both to the agent's key.
The rendezvous server is SKYFN_RENDEZVOUS_ADDRESS, signed for with SKYFN_RENDEZVOUS_SECRET.
"""
from __future__ import annotations

import os
import time

from lambdas.adapters.redis_store import session_store
from lambdas.config import settings
from lambdas.core import deps
from lambdas.core.identity import allowlist, direct_info
from lambdas.core.tasks import registry
from lambdas.core.errors import Conflict, Forbidden, ServiceError
from lambdas.core.ids import new_id
from skyfn.protocol.api import ListenTicket, OpenSession, PathTicket, SessionOpened
from skyfn.protocol.direct import body_digest, mint_token
from skyfn.protocol.direct_path import listen_ticket as _listen_ticket, path_ticket

RECORD_GRACE_S = 6 * 3600  # results of a session are still recorded this long after its token expires


LISTEN_TTL_S = 24 * 3600  # a LISTEN token is checked once, when the agent connects


class NoDirectChannel(Conflict):
    code = "no_direct_channel"


class NoRendezvous(ServiceError):
    """The deployment runs no rendezvous server: an agent cannot be reached through one."""

    status = 404
    code = "rendezvous_not_configured"


def _rendezvous() -> tuple[str, str]:
    """(address, secret) of the deployment's rendezvous server; ("", "") when it has none."""
    address, secret = os.environ.get("SKYFN_RENDEZVOUS_ADDRESS", ""), os.environ.get("SKYFN_RENDEZVOUS_SECRET", "")
    return (address, secret) if address and secret else ("", "")


def listen_ticket(identity_endpoint: str | None, endpoint_id: str) -> ListenTicket:
    """Where and under which name endpoint_id's agent LISTENs (its own credential only)."""
    if identity_endpoint != endpoint_id:
        raise Forbidden(f"only endpoint {endpoint_id}'s own agent, with its endpoint credential, listens for its "
                        "direct sessions; a user token cannot")
    address, secret = _rendezvous()
    if not address:
        raise NoRendezvous("this deployment runs no rendezvous server (SKYFN_RENDEZVOUS_ADDRESS and "
                           "SKYFN_RENDEZVOUS_SECRET are unset): set direct.reach to address in the agent's config.yaml, "
                           "or ask the operator to deploy one")
    return ListenTicket(**_listen_ticket(secret, address, endpoint_id, LISTEN_TTL_S, time.time()))


def record_key(session_id: str) -> str:
    return session_store.record_key(session_id)


def open(owner: str, endpoint_id: str, body: OpenSession) -> SessionOpened:
    function_ids = set(body.function_ids)
    # the order of POST /tasks' checks, so both answer the same 404 / 403 for the same request
    functions = registry.function_bodies(owner, function_ids)
    record = registry.check_endpoint(owner, endpoint_id)
    allowlist.enforce(((endpoint_id, fid) for fid in sorted(function_ids)), functions, {endpoint_id: record})
    channel = direct_info.published(endpoint_id)
    address, secret = _rendezvous()
    if channel is not None and channel.address is None and not (channel.rendezvous and address):
        channel = None  # it opens no port and there is no rendezvous server to reach it through
    if channel is None:
        raise NoDirectChannel(
            f"endpoint {endpoint_id} takes no direct sessions: its agent is offline, has no `direct:` section "
            "in its config.yaml, or opens no port (direct.reach: rendezvous) while this deployment runs no "
            "rendezvous server; submit through POST /tasks",
            {"endpoint_id": endpoint_id, "reason": "no_direct_channel"})
    session_id = new_id()
    ttl = settings().direct_session_ttl
    digests = {fid: body_digest(fn.body) for fid, fn in functions.items()}
    names = {fid: (fn.owner, fn.name) for fid, fn in functions.items()}  # for the agent's {owner, name} entries
    token, expires_at = mint_token(channel.session_key, session_id=session_id, owner=owner,
                                   endpoint_id=endpoint_id, functions=digests, ttl=ttl, names=names)
    deps.sessions().record(session_id, owner, endpoint_id, digests, int(ttl + RECORD_GRACE_S))
    ticket = None
    if channel.rendezvous and address:
        ticket = PathTicket(**path_ticket(secret, address, endpoint_id, session_id, owner, channel.session_key,
                                          expires_at, time.time()))
    return SessionOpened(session_id=session_id, endpoint_id=endpoint_id, address=channel.address,
                         server_key=channel.server_key, token=token, expires_at=expires_at, rendezvous=ticket)
