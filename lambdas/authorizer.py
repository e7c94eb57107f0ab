"""API Gateway TOKEN authorizer for OpenID Connect JWTs (Globus Auth in the AWS
deployment with `-c auth=globus`; any OIDC issuer that signs JWTs with a published key).

The token (`Authorization: Bearer <jwt>`) must be signed by a key of the issuer's JWKS
(found through `<issuer>/.well-known/openid-configuration`), carry the configured
audience (SKYFN_AUTH_AUDIENCE, the client id of the skyfn Globus app), the issuer
SKYFN_AUTH_ISSUER, and be unexpired. The answer allows execute-api:Invoke on the whole
stage (API Gateway caches one decision per token for every route) with the subject as
principal and the token's identity claims (username, email, identity provider) as context;
any failure is API Gateway's 401 ("Unauthorized"). Tokens are never logged.

Not covered: Globus *opaque* access tokens, which only token introspection with the
app's client secret can check; see docs/deploy.md.
"""
from __future__ import annotations

import functools
import json
import os
import urllib.request
from typing import Any

import jwt
from aws_lambda_powertools import Logger

from lambdas.auth import claims_of

logger = Logger(service="skyfn-authorizer")
ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "PS256"]
_HTTP_TIMEOUT = 5


class Unauthorized(Exception):
    """API Gateway turns exactly this message into a 401."""

    def __init__(self) -> None:
        super().__init__("Unauthorized")


@functools.lru_cache(maxsize=4)
def jwks_client(issuer: str) -> jwt.PyJWKClient:
    """The issuer's key set, discovered once per container and cached by PyJWKClient."""
    url = f"{issuer.rstrip('/')}/.well-known/openid-configuration"
    with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT) as resp:  # noqa: S310 - https issuer from config
        jwks_uri = json.load(resp)["jwks_uri"]
    return jwt.PyJWKClient(jwks_uri, cache_keys=True, lifespan=3600, timeout=_HTTP_TIMEOUT)


def verify(token: str, issuer: str, audience: str) -> dict[str, Any]:
    """The claims of a valid token; raises jwt.InvalidTokenError (or a network error)."""
    key = jwks_client(issuer).get_signing_key_from_jwt(token)
    return jwt.decode(token, key.key, algorithms=ALGORITHMS, audience=audience, issuer=issuer,
                      options={"require": ["exp", "iss", "aud", "sub"]})


def stage_arn(method_arn: str) -> str:
    """arn:...:execute-api:region:account:api-id/stage/METHOD/path -> .../stage/*/*"""
    head, _, rest = method_arn.partition("/")
    stage = rest.split("/", 1)[0]
    if not head or not stage:
        raise Unauthorized()
    return f"{head}/{stage}/*/*"


def handler(event: dict, context: Any) -> dict:
    issuer = os.environ.get("SKYFN_AUTH_ISSUER", "")
    audience = os.environ.get("SKYFN_AUTH_AUDIENCE", "")
    scheme, _, token = (event.get("authorizationToken") or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip() or not issuer or not audience:
        raise Unauthorized()
    try:
        claims = verify(token.strip(), issuer, audience)
    except (jwt.InvalidTokenError, jwt.PyJWKClientError) as exc:
        logger.info("token refused", extra={"reason": type(exc).__name__})
        raise Unauthorized() from None
    user = claims["sub"]
    # the identity claims the API reads back (lambdas/auth.py identify): context values are strings
    identity = claims_of(claims)
    return {
        "principalId": user,
        "policyDocument": {"Version": "2012-10-17", "Statement": [
            {"Action": "execute-api:Invoke", "Effect": "Allow", "Resource": stage_arn(event.get("methodArn", ""))}]},
        "context": {"sub": user, "username": identity.get("username", ""), "email": identity.get("email", ""),
                    "identity_provider": identity.get("identity_provider", "")},
    }
