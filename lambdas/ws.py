"""The WebSocket API in AWS (API Gateway WebSocket API; skyfn.protocol.push): the routes'
handler and the $connect authorizer. The embedded runtime serves the same protocol from
its gateway (infra/local/standins/push_hub.py).

- ``authorizer``: a REQUEST authorizer on $connect. The token is the REST API's: the
  ``Authorization: Bearer`` header, or the ``token`` query parameter (browsers cannot set
  headers on a WebSocket). OIDC deployments (Cognito, Globus Auth) verify it against the
  issuer's published keys as lambdas/authorizer.py does; others as lambdas/auth.py does.
  Endpoint credentials are refused: results are their submitters' alone. Tokens are
  never logged.
- ``handler``: $connect records the connection under its user in the connection table
  (SKYFN_CONNECTION_TABLE, TTL attribute ``expires``); ``subscribe`` marks it subscribed
  (``"peek": true``: an observer, stored as the item's ``peek``, whose deliveries do not
  count as results retrieved) and answers (route response) with the user's
  completion-stream cursor; $disconnect deletes
  it; anything else gets an error message. lambdas/core/tasks/push.py posts to subscribed
  connections from the results function.
"""
from __future__ import annotations

import json
import os
from typing import Any

from aws_lambda_powertools import Logger

from lambdas.auth import GATEWAY_PROVIDERS, Unauthorized, authenticate
from skyfn.protocol.push import subscribe_peek

logger = Logger(service="skyfn-ws")


def _token(event: dict) -> str:
    for key, value in (event.get("headers") or {}).items():
        if key.lower() == "authorization":
            scheme, _, token = str(value).partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return str((event.get("queryStringParameters") or {}).get("token") or "").strip()


def _user(token: str) -> str:
    """The user id of a REST API token; raises Unauthorized."""
    if not token:
        raise Unauthorized("no token")
    provider = os.environ.get("SKYFN_AUTH_PROVIDER", "jwt")
    if provider in GATEWAY_PROVIDERS:
        import jwt

        from lambdas.authorizer import verify

        try:
            claims = verify(token, os.environ.get("SKYFN_AUTH_ISSUER", ""), os.environ.get("SKYFN_AUTH_AUDIENCE", ""))
        except (jwt.InvalidTokenError, jwt.PyJWKClientError) as exc:
            raise Unauthorized(type(exc).__name__) from None
        return str(claims["sub"])
    identity = authenticate(f"Bearer {token}")
    if not identity.user:
        raise Unauthorized("endpoint credentials cannot subscribe to results")
    return identity.user


def _body(event: dict) -> dict:
    """The message a route was selected for (its JSON body; {} if it is not an object)."""
    try:
        msg = json.loads(event.get("body") or "{}")
    except ValueError:
        return {}
    return msg if isinstance(msg, dict) else {}


def authorizer(event: dict, context: Any) -> dict:
    try:
        user = _user(_token(event))
    except Unauthorized as exc:
        logger.info("connection refused", extra={"reason": str(exc).split(":")[0][:80]})
        raise Exception("Unauthorized") from None  # API Gateway answers 401
    return {
        "principalId": user,
        "policyDocument": {"Version": "2012-10-17", "Statement": [
            {"Action": "execute-api:Invoke", "Effect": "Allow", "Resource": event.get("methodArn", "*")}]},
        "context": {"sub": user},
    }


def handler(event: dict, context: Any) -> dict:
    from lambdas.core import deps
    from lambdas.core.tasks import push

    ctx = event.get("requestContext") or {}
    route, connection_id = ctx.get("routeKey"), ctx.get("connectionId", "")
    owner = str((ctx.get("authorizer") or {}).get("sub") or (ctx.get("authorizer") or {}).get("principalId") or "")
    if not owner:
        return {"statusCode": 401}
    if route == "$connect":
        push.remember(owner, connection_id)
        return {"statusCode": 200}
    if route == "$disconnect":
        push.forget(owner, connection_id)
        return {"statusCode": 200}
    if route == "subscribe":
        try:
            peek = subscribe_peek(_body(event))
        except ValueError as exc:
            return {"statusCode": 200, "body": json.dumps({"type": "error", "message": str(exc)})}
        push.remember(owner, connection_id, subscribed=True, peek=peek)
        cursor = deps.store().done_cursor(owner)
        return {"statusCode": 200, "body": json.dumps({"type": "subscribed", "cursor": cursor})}
    return {"statusCode": 200, "body": json.dumps(
        {"type": "error", "message": 'unknown message: send {"action": "subscribe"}'})}
