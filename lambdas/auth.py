"""Authentication of API calls: JWTs signed with the service's key.

In the embedded runtime the key is a random secret that `skyfn local up` creates; the
same verification path serves every request. Only the user id (`sub`) leaves here.
"""
from __future__ import annotations

import time

import jwt

AUDIENCE = "skyfn"


class Unauthorized(Exception):
    """The request carries no valid credential. The message never contains the token."""


def mint_token(secret: str, user: str, ttl_seconds: int = 30 * 24 * 3600, issuer: str = "skyfn-local") -> str:
    if not secret:
        raise ValueError("cannot mint a token without a signing secret")
    now = int(time.time())
    claims = {"sub": user, "iss": issuer, "aud": AUDIENCE, "iat": now, "exp": now + int(ttl_seconds)}
    return jwt.encode(claims, secret, algorithm="HS256")


def authenticate(authorization: str | None, secret: str, issuer: str) -> str:
    """Return the user id of a valid `Authorization: Bearer <jwt>` header."""
    if not authorization:
        raise Unauthorized("missing Authorization header: send 'Authorization: Bearer <token>' "
                           "(get one with `skyfn local token` or `skyfn login`)")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization header must be 'Bearer <token>'")
    if not secret:
        raise Unauthorized("the service has no signing key configured (SKYFN_AUTH_SECRET)")
    try:
        claims = jwt.decode(token.strip(), secret, algorithms=["HS256"], audience=AUDIENCE, issuer=issuer,
                            options={"require": ["exp", "sub", "iss", "aud"]})
    except jwt.ExpiredSignatureError:
        raise Unauthorized("token expired: get a new one") from None
    except jwt.InvalidTokenError as exc:
        raise Unauthorized(f"invalid token ({type(exc).__name__})") from None
    user = claims.get("sub")
    if not isinstance(user, str) or not user:
        raise Unauthorized("token has no subject")
    return user
