"""Authentication of API calls: who is calling.

Three kinds of callers, one answer (an Identity):
- a user with a JWT of the configured issuer (`Authorization: Bearer <jwt>`), verified
  here by lambdas.core.identity.jwt_keys: the embedded runtime's ES256 key, an OIDC issuer's
  published keys (Cognito, Globus Auth), or a shared secret;
- a user whose JWT API Gateway's authorizer already verified (SKYFN_AUTH_PROVIDER
  cognito or globus): the identity is read from `requestContext.authorizer`, which only
  API Gateway can set;
- an endpoint agent with its endpoint's credential (`Bearer skyfn-agent.<id>.<secret>`,
  lambdas.core.identity.agent_keys), which names the endpoint, never a user.
A user's Identity also carries the token's identity claims (username, email, identity
provider: `claims_of`), which the service sends with each task so a multi-user endpoint
can map the submitter to a local account (DESIGN.md section 12); agents have none.
Tokens never reach a log or an error message.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

from lambdas.config import GATEWAY_PROVIDERS
from lambdas.core.identity import jwt_keys

AUDIENCE = "skyfn"


class Unauthorized(Exception):
    """The request carries no valid credential. The message never contains the token."""


@dataclass(frozen=True)
class Identity:
    user: str = ""                      # the user id (`sub`); '' for an endpoint agent
    endpoint_id: Optional[str] = None   # set when an endpoint agent's credential was used
    # the token's identity claims (None when it has none; always None for an agent)
    username: Optional[str] = None
    email: Optional[str] = None
    identity_provider: Optional[str] = None

    @property
    def is_agent(self) -> bool:
        return self.endpoint_id is not None

    def claims(self) -> dict[str, str]:
        """The identity claims present, as skyfn.protocol.messages.SubmitterIdentity names them
        (without `id`): what the service keeps per user and sends with each task."""
        out = {"username": self.username, "email": self.email, "identity_provider": self.identity_provider}
        return {k: v for k, v in out.items() if v}


USERNAME_CLAIMS = ("preferred_username", "username", "cognito:username")
_CLAIM_MAX = 256  # longer claim values are not identity claims anyone maps: left out


def _claim(value: Any) -> Optional[str]:
    if isinstance(value, str) and 0 < len(value) <= _CLAIM_MAX:
        return value
    return None


def claims_of(claims: dict[str, Any]) -> dict[str, str]:
    """username, email and identity_provider of a verified token's claims (or of an API
    Gateway authorizer's context, which holds them as strings): the username from
    `preferred_username`, `username` or `cognito:username`; the provider from
    `identity_provider` (Globus Auth's identity provider id; a Lambda authorizer's context),
    else a Cognito federated user's `identities[0].providerName`, else the issuer `iss`.
    Absent or empty claims are left out."""
    out: dict[str, str] = {}
    username = next((v for v in (_claim(claims.get(k)) for k in USERNAME_CLAIMS) if v), None)
    if username:
        out["username"] = username
    email = _claim(claims.get("email"))
    if email:
        out["email"] = email
    provider = _claim(claims.get("identity_provider")) or _cognito_provider(claims.get("identities")) \
        or _claim(claims.get("iss"))
    if provider:
        out["identity_provider"] = provider
    return out


def _cognito_provider(identities: Any) -> Optional[str]:
    """Cognito puts a federated user's providers in `identities` (a list of objects; a JSON
    string of it in a user-pool authorizer's claims)."""
    if isinstance(identities, str):
        import json

        try:
            identities = json.loads(identities)
        except ValueError:
            return None
    if isinstance(identities, dict):
        identities = [identities]
    if isinstance(identities, list) and identities and isinstance(identities[0], dict):
        return _claim(identities[0].get("providerName"))
    return None


def _user_identity(user: str, claims: dict[str, Any]) -> Identity:
    return Identity(user=user, **claims_of(claims))


def mint_token(key: str, user: str, ttl_seconds: int = 30 * 24 * 3600, issuer: str = "skyfn-local",
               audience: str = AUDIENCE, *, username: Optional[str] = None, email: Optional[str] = None,
               identity_provider: Optional[str] = None) -> str:
    """A user token signed with `key`: a PEM private key (ES256/RS256) or a shared secret (HS256).
    `username`, `email` and `identity_provider` become the token's identity claims
    (`preferred_username`, `email`, `identity_provider`) when given."""
    if not key:
        raise ValueError("cannot mint a token without a signing key")
    now = int(time.time())
    claims: dict[str, Any] = {"sub": user, "iss": issuer, "aud": audience, "iat": now, "exp": now + int(ttl_seconds)}
    for name, value in (("preferred_username", username), ("email", email), ("identity_provider", identity_provider)):
        if value:
            claims[name] = value
    return jwt_keys.sign(key, claims)


def bearer(authorization: str | None) -> str:
    if not authorization:
        raise Unauthorized("missing Authorization header: send 'Authorization: Bearer <token>' "
                           "(get one with `skyfn login` or `skyfn local token`)")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization header must be 'Bearer <token>'")
    return token.strip()


def authenticate(authorization: str | None, settings: Any = None) -> Identity:
    """The identity of an `Authorization: Bearer ...` header (user JWT or agent credential)."""
    from lambdas.config import settings as current
    from lambdas.core.identity import agent_keys

    s = settings or current()
    token = bearer(authorization)
    if token.startswith(agent_keys.PREFIX):
        endpoint_id = agent_keys.verify(token)
        if endpoint_id is None:
            raise Unauthorized("endpoint credential not valid (revoked, rotated, or for another service): "
                               "register the endpoint again to get a new one")
        return Identity(endpoint_id=endpoint_id)
    try:
        keys = jwt_keys.key_set(jwks=s.auth_jwks, jwks_file=s.auth_jwks_file, secret=s.auth_secret,
                                issuer=s.auth_issuer)
        claims = keys.verify(token, s.auth_issuer, s.auth_audience)
    except jwt_keys.TokenError as exc:
        raise Unauthorized(str(exc)) from None
    return _user_identity(claims["sub"], claims)


def identify(event: dict) -> Identity:
    """The caller of an API Gateway proxy event."""
    from lambdas.config import settings

    s = settings()
    header = _header(event, "authorization")
    if s.auth_provider in GATEWAY_PROVIDERS:
        authorizer = (event.get("requestContext") or {}).get("authorizer") or {}
        user = _gateway_user(authorizer)
        if user:
            claims = authorizer.get("claims")
            return _user_identity(user, claims if isinstance(claims, dict) else authorizer)
        if header and bearer(header).startswith("skyfn-agent."):
            return authenticate(header, s)
        raise Unauthorized("no identity from the API's authorizer: call the API through its API Gateway stage")
    return authenticate(header, s)


def _gateway_user(authorizer: dict) -> str:
    """Cognito user-pool authorizers put the token's claims under `claims`; Lambda
    authorizers (lambdas/authorizer.py) put their context (`sub`) and `principalId`."""
    claims = authorizer.get("claims")
    if isinstance(claims, dict) and isinstance(claims.get("sub"), str):
        return claims["sub"]
    for key in ("sub", "principalId"):
        if isinstance(authorizer.get(key), str) and authorizer[key]:
            return authorizer[key]
    return ""


def _header(event: dict, name: str) -> str | None:
    for key, value in (event.get("headers") or {}).items():
        if key.lower() == name:
            return value
    return None
