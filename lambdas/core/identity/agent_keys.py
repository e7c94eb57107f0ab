"""Endpoint credentials: what an endpoint agent authenticates with, instead of its
owner's token.

A credential (`skyfn-agent.<endpoint id>.<secret>`) is issued to the endpoint's owner
each time the owner registers the endpoint (registering again rotates it: the old one
stops working at once). The service keeps only SHA-256 of the secret (Redis
`agentcred:<id>`, and the endpoint's DynamoDB item as the durable copy).

With it an agent may call its own endpoint's agent routes (connect, heartbeat, and a
multi-user endpoint's lanes) and nothing else of the API. On the queues:
- Redis Streams (embedded runtime): the credential is the password of a Redis ACL user
  `ep-<id>` (stored hashed, `#<sha256>`; lambdas/core/identity/queue_acl.py) whose key
  permissions are the endpoint's task and control streams and its lanes' task streams
  (and their lease and dead-letter keys) plus *write-only* access to the shared results
  stream. Any other key -- another endpoint's queue, task records, the
  results others post -- is refused by Redis itself (NOPERM). Key-space commands (SCAN,
  KEYS) are refused too, so task ids of other endpoints cannot be listed.
- SQS (AWS): temporary STS credentials of the agent role narrowed by a session policy
  to the endpoint's queues (lambdas/core/identity/agent_credentials.py).
"""
from __future__ import annotations

import hmac
import secrets
from typing import Optional

from lambdas.config import GATEWAY_PROVIDERS, settings
from lambdas.core import deps
from lambdas.core.identity import direct_info, lanes, queue_acl
from skyfn.protocol.credentials import PREFIX, parse, redis_url


def acl_user(endpoint_id: str) -> str:
    return f"ep-{endpoint_id}"


def issue(endpoint_id: str) -> str:
    """A new credential for the endpoint (the previous one stops working)."""
    secret = secrets.token_urlsafe(32)
    digest = queue_acl.digest(secret)
    deps.dynamo().endpoints.update_item(Key={"endpoint_id": endpoint_id}, UpdateExpression="SET cred_hash = :h",
                                        ExpressionAttributeValues={":h": digest})
    deps.redis_client().set(f"agentcred:{endpoint_id}", digest)
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
    stored = deps.redis_client().get(f"agentcred:{endpoint_id}")
    if stored is None:
        item = deps.dynamo().get_endpoint(endpoint_id)
        digest = (item or {}).get("cred_hash")
        if not digest:
            return None
        deps.redis_client().set(f"agentcred:{endpoint_id}", digest)
        stored = digest.encode()
    return endpoint_id if hmac.compare_digest(stored.decode(), queue_acl.digest(secret)) else None


def revoke(endpoint_id: str) -> None:
    """No credential of the endpoint works any more; its agent's Redis connections are cut,
    and its lanes closed (their user agents' logins end too)."""
    deps.dynamo().endpoints.update_item(Key={"endpoint_id": endpoint_id}, UpdateExpression="REMOVE cred_hash")
    r = deps.redis_client()
    r.delete(f"agentcred:{endpoint_id}")
    direct_info.withdraw([endpoint_id])  # no new direct sessions with an agent its owner cut off
    if settings().queue_kind == "redis":
        queue_acl.delete_users(acl_user(endpoint_id))  # also closes its connections
        lanes.close_all(endpoint_id)  # and its lanes' logins


# --- Redis ACL users (queue access on the Redis Streams path) ---------------------------
def acl_keys(endpoint_id: str) -> list[str]:
    """The endpoint's task and control queues, and its lanes' task queues: the privileged
    process of a multi-user endpoint hands a lane the first tasks of a new binding and takes
    back what is left in a lane it closed (lambdas/core/identity/lanes.py)."""
    s = settings()
    return [*queue_acl.queue_keys(s.task_queue_name(endpoint_id), s.control_queue_name(endpoint_id)),
            s.lane_queue_name(endpoint_id, "*")]


def grant_queue_access(endpoint_id: str, digest: str) -> None:
    queue_acl.set_user(acl_user(endpoint_id), digest, acl_keys(endpoint_id))


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
    endpoint's queues come along when the deployment names the role."""
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
    out.update(task_queue=task, results_queue=results, control_queue=control)
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
