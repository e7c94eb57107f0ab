"""Endpoint credentials: what an endpoint agent authenticates with, instead of its
owner's token.

A credential (`skyfn-agent.<endpoint id>.<secret>`) is issued to the endpoint's owner
each time the owner registers the endpoint (registering again rotates it: the old one
stops working at once). The service keeps only SHA-256 of the secret (the hot store's
`agentcred:<id>`, and the endpoint's DynamoDB item as the durable copy).

With it an agent may call its own endpoint's agent routes (connect, heartbeat, and a
multi-user endpoint's lanes) and nothing else of the API. On the queues:
- Redis Streams (embedded runtime): the credential is the password of a Redis ACL user
  `ep-<id>` (stored hashed, `#<sha256>`; lambdas/core/identity/queue_acl.py) that may send
  the queue client's commands (lambdas/adapters/queue_logins.py) on the endpoint's task and
  control streams and its lanes' task streams (and their lease and dead-letter keys), and
  only XADD to the results stream. Any other key -- another endpoint's queue, task records,
  the results others post -- and any other command (scripts, XAUTOCLAIM, XTRIM, SCAN, ...)
  is refused by Redis itself (NOPERM).
- SQS (AWS): temporary STS credentials of the agent role narrowed by a session policy
  to the endpoint's queues (lambdas/core/identity/agent_credentials.py).
On either, the results queue is shared and says nothing of who sent an entry: the agent
seals its packs with a results key derived from the credential (skyfn.protocol.result_seal,
lambdas/core/identity/credential_hashes.py), and the service applies a pack only as the
endpoint whose key sealed it (lambdas/core/identity/result_seals.py).
"""
from __future__ import annotations

import hmac
import secrets
from typing import Optional

from lambdas.config import GATEWAY_PROVIDERS, settings
from lambdas.core import deps
from lambdas.core.identity import direct_info, lanes, queue_acl
from lambdas.core.identity.credential_hashes import results_key, stored_digest
from skyfn.protocol import result_seal
from skyfn.protocol.credentials import PREFIX, parse, redis_url


def acl_user(endpoint_id: str) -> str:
    return f"ep-{endpoint_id}"


def issue(endpoint_id: str) -> str:
    """A new credential for the endpoint (the previous one stops working)."""
    secret = secrets.token_urlsafe(32)
    digest = queue_acl.digest(secret)
    deps.dynamo().endpoints.update_item(Key={"endpoint_id": endpoint_id}, UpdateExpression="SET cred_hash = :h",
                                        ExpressionAttributeValues={":h": digest})
    deps.credential_hashes().keep(endpoint_id, digest)
    direct_info.withdraw([endpoint_id])  # published by the holder of the old credential
    if settings().queue_kind == "redis":
        grant_queue_access(endpoint_id, digest)
    return f"{PREFIX}{endpoint_id}.{secret}"


def verify(credential: str) -> Optional[str]:
    """The endpoint id a credential belongs to, or None."""
    parsed = parse(credential)
    if parsed is None:
        return None
    endpoint_id, secret = parsed
    stored = stored_digest(endpoint_id)
    if stored is None:
        return None
    return endpoint_id if hmac.compare_digest(stored, queue_acl.digest(secret)) else None


def revoke(endpoint_id: str) -> None:
    """No credential of the endpoint works any more; its agent's Redis connections are cut,
    and its lanes closed (their user agents' logins end too)."""
    deps.dynamo().endpoints.update_item(Key={"endpoint_id": endpoint_id}, UpdateExpression="REMOVE cred_hash")
    deps.credential_hashes().forget(endpoint_id)
    direct_info.withdraw([endpoint_id])  # no new direct sessions with an agent its owner cut off
    if settings().queue_kind == "redis":
        queue_acl.delete_users(acl_user(endpoint_id))  # also closes its connections
        lanes.close_all(endpoint_id)  # and its lanes' logins


# --- Redis ACL users (queue access on the Redis Streams path) ---------------------------
def consumed_queues(endpoint_id: str) -> list[str]:
    """The endpoint's task and control queues, and its lanes' task queues (a pattern): the
    privileged process of a multi-user endpoint takes back what is left in a lane it closed."""
    s = settings()
    return [s.task_queue_name(endpoint_id), s.control_queue_name(endpoint_id), s.lane_queue_name(endpoint_id, "*")]


def fed_queues(endpoint_id: str) -> list[str]:
    """Its lanes' task queues: it hands a lane the first tasks of a new binding
    (lambdas/core/identity/lanes.py)."""
    return [settings().lane_queue_name(endpoint_id, "*")]


def grant_queue_access(endpoint_id: str, digest: str) -> None:
    queue_acl.set_user(acl_user(endpoint_id), digest, consumed_queues(endpoint_id), fed_queues(endpoint_id))


def refresh_queue_logins() -> int:
    """Give every endpoint's and lane's queue login the rules of today's table (logins kept in
    the ACL file of a Redis that an older service made keep their passwords). Returns how
    many were rewritten."""
    done = 0
    for user, (hashes, patterns) in queue_acl.existing("ep-", "ln-").items():
        if len(hashes) != 1:
            continue
        if user.startswith("ep-"):
            endpoint_id = user[3:]
            queue_acl.set_user(user, hashes[0], consumed_queues(endpoint_id), fed_queues(endpoint_id))
        else:
            results = settings().results_queue_name
            consumed = sorted({p for p in patterns if p != results and not p.endswith((":leases", ":dlq"))})
            queue_acl.set_user(user, hashes[0], consumed)
        done += 1
    return done


def scoped_redis_url(endpoint_id: str, credential: str) -> str:
    """The agents' Redis URL with the endpoint's ACL user and secret instead of any other login."""
    parsed = parse(credential)
    if parsed is None or parsed[0] != endpoint_id:
        raise ValueError("credential does not belong to this endpoint")
    return redis_url(settings().agent_redis_url, acl_user(endpoint_id), parsed[1])


def descriptors(endpoint_id: str, credential: Optional[str]) -> dict:
    """The queue descriptors an agent of the endpoint gets. On Redis, the URLs log in as
    the endpoint's ACL user; with `credential` (just issued to the owner) they carry its
    secret, else the agent puts in the secret of the credential it holds (the service
    keeps only a hash). On SQS, the agent role's session credentials narrowed to the
    endpoint's queues come along when the deployment names the role. On both, the key the
    agent seals its results with (skyfn.protocol.result_seal), for agents that hold no
    credential (behind a user authorizer)."""
    from skyfn.protocol.api import QueueDescriptor

    _, task = deps.task_queue(endpoint_id)
    _, results = deps.results_queue()
    _, control = deps.control_queue(endpoint_id)
    out: dict = {}
    if settings().queue_kind == "redis":
        url = (scoped_redis_url(endpoint_id, credential) if credential
               else redis_url(settings().agent_redis_url, acl_user(endpoint_id), None))
        task, results, control = (QueueDescriptor(kind="redis", name=d.name, url=url) for d in (task, results, control))
    else:
        out["aws_credentials"] = sqs_session(endpoint_id)
    out.update(task_queue=task, results_queue=results, control_queue=control,
               results_key=result_seal.key_of_credential(credential) if credential else results_key(endpoint_id))
    return out


def sqs_session(endpoint_id: str) -> Optional[dict]:
    """Session credentials of the agent role for this endpoint (AWS deployment), or None
    when the deployment names no agent role (agents then bring their own credentials)."""
    import os

    role_arn = os.environ.get("SKYFN_AGENT_ROLE_ARN", "")
    prefix = os.environ.get("SKYFN_AGENT_QUEUE_ARN_PREFIX", "")
    if not role_arn or not prefix:
        return None
    import boto3

    from lambdas.core.identity.agent_credentials import assume_agent_role

    return assume_agent_role(boto3.client("sts"), role_arn, prefix, endpoint_id)


def usable_at_api() -> bool:
    """Whether agents can present the credential to the API: not behind API Gateway's user
    authorizer (Cognito, Globus), which refuses anything but the issuer's tokens. There the
    agent keeps its owner's token for the API and gets SQS session credentials instead."""
    return settings().auth_provider not in GATEWAY_PROVIDERS
