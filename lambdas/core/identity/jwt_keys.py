"""Verifying (and, for the embedded runtime, signing) the JWTs users present.

One verifier serves every issuer: a key set, from
  - a JWKS document (SKYFN_AUTH_JWKS inline, or SKYFN_AUTH_JWKS_FILE): the embedded
    runtime publishes the public half of the ES256 key `skyfn local up` creates;
  - the issuer's OpenID Connect metadata (`<issuer>/.well-known/openid-configuration`,
    then its `jwks_uri`): Cognito user pools, Globus Auth, any OIDC provider;
  - a shared secret (SKYFN_AUTH_SECRET), an HS256 `oct` key: simple test setups.
Every token must name the configured issuer and audience, carry `sub` and `exp`, be
signed by a key of the set with that key's own algorithm (a key never verifies another
family's signature: no RS256/HS256 confusion) and be unexpired (30 s leeway for clocks).
"""
from __future__ import annotations

import functools
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import jwt
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

ASYMMETRIC = {"RSA": ("RS256", "RS384", "RS512", "PS256"), "EC": ("ES256", "ES384", "ES512"),
              "OKP": ("EdDSA",)}
LEEWAY_SECONDS = 30
DISCOVERY_TIMEOUT = 5
JWKS_REFRESH_SECONDS = 10  # unknown `kid`s refetch the issuer's keys at most this often (rotation)
# A token verified once is trusted again without the signature check (tens to hundreds of
# microseconds per request) until it expires, for at most this long, as API Gateway caches
# an authorizer's answer (300 s by default). Keyed by the whole token: nothing is guessed.
VERIFIED_TTL_SECONDS = 300.0
VERIFIED_MAX = 4096


class TokenError(Exception):
    """Why a token was refused; never contains the token."""


class KeySet:
    """Verification keys by `kid` (None: a key without one), each with its algorithms."""

    def __init__(self, keys: dict[str | None, tuple[Any, tuple[str, ...]]], refresh=None):
        self._keys = keys
        self._refresh = refresh  # callable returning fresh keys (issuer JWKS), or None
        self._refreshed = float("-inf")  # the first unknown kid refetches at once
        self._lock = threading.Lock()
        self._verified: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}  # -> (trusted until, claims)

    @classmethod
    def from_jwks(cls, jwks: dict[str, Any], refresh=None) -> "KeySet":
        return cls(_parse_jwks(jwks), refresh)

    @classmethod
    def from_secret(cls, secret: str) -> "KeySet":
        return cls({None: (secret.encode(), ("HS256",))})

    def _key(self, kid: str | None):
        if kid in self._keys:
            return self._keys[kid]
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        if self._refresh is not None:
            with self._lock:
                if time.monotonic() - self._refreshed > JWKS_REFRESH_SECONDS or not self._keys:
                    self._keys = self._refresh()
                    self._refreshed = time.monotonic()
            if kid in self._keys:
                return self._keys[kid]
        raise TokenError("token signed by an unknown key (kid not in the issuer's key set)")

    def verify(self, token: str, issuer: str, audience: str) -> dict[str, Any]:
        key = (token, issuer, audience)
        hit = self._verified.get(key)
        now = time.time()
        if hit is not None:
            if now < hit[0]:
                return dict(hit[1])
            self._verified.pop(key, None)
        claims = self._verify(token, issuer, audience)
        if len(self._verified) >= VERIFIED_MAX:
            self._verified.clear()  # simple and bounded; a full cache is rare (one entry per live token)
        self._verified[key] = (min(float(claims["exp"]) + LEEWAY_SECONDS, now + VERIFIED_TTL_SECONDS), dict(claims))
        return claims

    def _verify(self, token: str, issuer: str, audience: str) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise TokenError("token is not a JWT") from None
        key, algorithms = self._key(header.get("kid"))
        if header.get("alg") not in algorithms:
            raise TokenError(f"token algorithm {header.get('alg')!r} is not allowed for its key")
        try:
            claims = jwt.decode(token, key, algorithms=list(algorithms), audience=audience, issuer=issuer,
                                leeway=LEEWAY_SECONDS, options={"require": ["exp", "sub", "iss", "aud"]})
        except jwt.ExpiredSignatureError:
            raise TokenError("token expired: get a new one (`skyfn login`, or `skyfn local token`)") from None
        except jwt.InvalidAudienceError:
            raise TokenError(f"token is for another audience (this service is {audience!r})") from None
        except jwt.InvalidIssuerError:
            raise TokenError(f"token is from another issuer (this service trusts {issuer!r})") from None
        except jwt.InvalidSignatureError:
            raise TokenError("token signature does not verify") from None
        except jwt.InvalidTokenError as exc:
            raise TokenError(f"invalid token ({type(exc).__name__})") from None
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            raise TokenError("token has no subject")
        return claims


def _parse_jwks(jwks: dict[str, Any]) -> dict[str | None, tuple[Any, tuple[str, ...]]]:
    keys: dict[str | None, tuple[Any, tuple[str, ...]]] = {}
    for jwk in jwks.get("keys", []):
        kty = jwk.get("kty")
        if jwk.get("use", "sig") != "sig" or kty not in ASYMMETRIC:
            continue  # encryption keys, and symmetric keys a public document must not carry
        algs = (jwk["alg"],) if jwk.get("alg") in ASYMMETRIC[kty] else ASYMMETRIC[kty]
        keys[jwk.get("kid")] = (jwt.PyJWK(jwk, algs[0]).key, algs)
    if not keys:
        raise TokenError("the key set has no usable signing key")
    return keys


def _fetch_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=DISCOVERY_TIMEOUT) as resp:  # noqa: S310 - issuer from config
        return json.load(resp)


def discover(issuer: str) -> KeySet:
    """The key set of an OIDC issuer, through its discovery document."""
    meta = _fetch_json(f"{issuer.rstrip('/')}/.well-known/openid-configuration")
    if meta.get("issuer", issuer).rstrip("/") != issuer.rstrip("/"):
        raise TokenError(f"the discovery document of {issuer} names another issuer ({meta.get('issuer')})")
    jwks_uri = meta["jwks_uri"]

    def fetch():
        return _parse_jwks(_fetch_json(jwks_uri))

    return KeySet(fetch(), refresh=fetch)


@functools.lru_cache(maxsize=8)
def _cached_file(path: str, mtime: float) -> KeySet:
    return KeySet.from_jwks(json.loads(Path(path).read_text()))


_discovered: dict[str, KeySet] = {}
_discover_lock = threading.Lock()


def key_set(*, jwks: str = "", jwks_file: str = "", secret: str = "", issuer: str = "") -> KeySet:
    """The key set the configuration names (first of: inline JWKS, JWKS file, secret,
    the issuer's discovery document)."""
    if jwks:
        return _cached_inline(jwks)
    if jwks_file:
        try:
            return _cached_file(jwks_file, Path(jwks_file).stat().st_mtime)
        except OSError as exc:
            raise TokenError(f"the service cannot read its key set {jwks_file} ({exc.strerror})") from None
    if secret:
        return _cached_secret(secret)
    if issuer.startswith("https://") or _loopback(issuer):
        with _discover_lock:
            if issuer not in _discovered:
                try:
                    _discovered[issuer] = discover(issuer)
                except (OSError, ValueError, KeyError) as exc:
                    raise TokenError(f"the issuer {issuer} did not publish its keys ({type(exc).__name__})") from None
            return _discovered[issuer]
    raise TokenError("the service has no verification key configured (SKYFN_AUTH_JWKS_FILE, SKYFN_AUTH_JWKS, "
                     "SKYFN_AUTH_SECRET, or an https SKYFN_AUTH_ISSUER)")


def _loopback(url: str) -> bool:
    """Plain-http issuers only on this machine (tests, a local identity provider)."""
    from urllib.parse import urlsplit

    return url.startswith("http://") and urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1")


@functools.lru_cache(maxsize=4)
def _cached_inline(text: str) -> KeySet:
    return KeySet.from_jwks(json.loads(text))


@functools.lru_cache(maxsize=4)
def _cached_secret(secret: str) -> KeySet:
    return KeySet.from_secret(secret)


# --- the embedded runtime's own issuer --------------------------------------------------
def new_signing_key() -> tuple[str, dict[str, Any]]:
    """(private key PEM, public JWKS) of a fresh ES256 key with a kid."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return pem, public_jwks(pem)


def public_jwks(private_pem: str) -> dict[str, Any]:
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(private_pem.encode(), password=None)
    public = private.public_key()
    algo = ECAlgorithm if hasattr(public, "curve") else RSAAlgorithm
    jwk = json.loads(algo.to_jwk(public))
    jwk.update(use="sig", alg=_alg_of(private_pem), kid=_kid(jwk))
    return {"keys": [jwk]}


def _kid(jwk: dict[str, Any]) -> str:
    import hashlib

    basis = json.dumps({k: jwk[k] for k in sorted(jwk) if k in ("crv", "e", "kty", "n", "x", "y")},
                       separators=(",", ":"))
    return hashlib.sha256(basis.encode()).hexdigest()[:16]  # RFC 7638 thumbprint, shortened


def _alg_of(key: str) -> str:
    if not key.startswith("-----BEGIN"):
        return "HS256"
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(key.encode(), password=None)
    return "ES256" if hasattr(private, "curve") else "RS256"


def sign(key: str, claims: dict[str, Any]) -> str:
    """A JWT of `claims` signed with a PEM private key (ES256/RS256, kid of its JWK) or a
    shared secret (HS256)."""
    alg = _alg_of(key)
    headers = {"kid": public_jwks(key)["keys"][0]["kid"]} if alg != "HS256" else None
    return jwt.encode(claims, key, algorithm=alg, headers=headers)
