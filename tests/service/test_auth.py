"""Authentication of every API route (lambdas/auth.py, lambdas/core/identity/jwt_keys.py), through
the real handler on a real redis-server and moto:

- the embedded runtime's issuer: ES256 tokens checked against a JWKS file (issuer,
  audience, expiry, signature, algorithm pinned per key);
- an OIDC issuer found through its discovery document (a real HTTP issuer on loopback),
  with key rotation;
- behind API Gateway: the identity its authorizer put in requestContext (Cognito claims,
  the Globus Lambda authorizer's context), and nothing else;
- endpoint credentials: only their own endpoint's agent routes; rotated or revoked ones stop;
- per-user rate limits: 429 naming the limit, with Retry-After.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import jwt
import pytest

from lambdas.auth import mint_token
from lambdas.core import deps
from lambdas.core.identity import jwt_keys
from skyfn.protocol import serialize_function
from tests.service.conftest import Api, Context, api_event


def ident(x):
    return x


@pytest.fixture
def local_keys(service_env, monkeypatch, tmp_path):
    """The service verifying with a JWKS file, as `skyfn local up` configures it."""
    pem, jwks = jwt_keys.new_signing_key()
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks))
    monkeypatch.delenv("SKYFN_AUTH_SECRET", raising=False)
    monkeypatch.setenv("SKYFN_AUTH_JWKS_FILE", str(path))
    monkeypatch.setenv("SKYFN_AUTH_ISSUER", "skyfn-local")
    deps.reset()
    return pem, jwks


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_local_es256_token_is_accepted_and_names_the_user(local_keys):
    pem, jwks = local_keys
    token = mint_token(pem, "alice")
    assert jwt.get_unverified_header(token)["alg"] == "ES256"
    assert jwt.get_unverified_header(token)["kid"] == jwks["keys"][0]["kid"]
    status, body = Api(token).call("GET", "/whoami")
    assert status == 200 and body == {"user": "alice", "endpoint_id": None}


@pytest.mark.parametrize("case", ["other key", "other issuer", "other audience", "expired", "alg none",
                                  "hs256 with the public key", "garbage", "no subject"])
def test_bad_tokens_are_401_with_the_reason(local_keys, case):
    pem, jwks = local_keys
    now = int(time.time())
    claims = {"sub": "alice", "iss": "skyfn-local", "aud": "skyfn", "iat": now, "exp": now + 600}
    kid = jwks["keys"][0]["kid"]
    if case == "other key":
        other, _ = jwt_keys.new_signing_key()
        token = jwt.encode(claims, other, algorithm="ES256", headers={"kid": kid})  # claims our kid
        reason = "signature does not verify"
    elif case == "other issuer":
        token = mint_token(pem, "alice", issuer="https://evil.example")
        reason = "another issuer"
    elif case == "other audience":
        token = mint_token(pem, "alice", audience="another-service")
        reason = "another audience"
    elif case == "expired":
        token = mint_token(pem, "alice", ttl_seconds=-120)
        reason = "expired"
    elif case == "alg none":
        token = jwt.encode(claims, None, algorithm="none", headers={"kid": kid})
        reason = "not allowed"
    elif case == "hs256 with the public key":  # the classic algorithm confusion
        head = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
        body = _b64(json.dumps(claims).encode())
        secret = json.dumps(jwks["keys"][0]).encode()
        sig = _b64(hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest())
        token = f"{head}.{body}.{sig}"
        reason = "not allowed"
    elif case == "garbage":
        token = "not-a-jwt"
        reason = "not a JWT"
    else:
        token = jwt_keys.sign(pem, {k: v for k, v in claims.items() if k != "sub"})
        reason = "invalid token"
    status, body = Api(token).call("GET", "/endpoints")
    assert status == 401 and body["error"] == "unauthorized"
    assert reason in body["message"]
    assert token not in body["message"]


def test_every_route_but_the_openapi_document_needs_a_token(local_keys):
    api = Api(None)
    status, doc = api.call("GET", "/openapi.json", token=None)
    assert status == 200
    routes = [(m.upper(), p) for p, ops in doc["paths"].items() for m in ops]
    assert len(routes) >= 25
    for method, path in routes:
        concrete = path.replace("{kind}", "endpoints").replace("{principal}", "user:bob")
        concrete = concrete.replace("{", "").replace("}", "")
        status, body = api.call(method, concrete, {} if method in ("POST", "PUT") else None, token=None)
        assert status == 401, (method, path, status, body)
        assert "Authorization" in body["message"]


# --- an OIDC issuer (Cognito, Globus Auth: their discovery document and JWKS) ---------------
def test_oidc_issuer_tokens_are_verified_through_discovery(oidc):
    status, body = Api(oidc.token(sub="ada-uuid")).call("GET", "/whoami")
    assert status == 200 and body["user"] == "ada-uuid"
    assert "/.well-known/openid-configuration" in oidc.requests and "/jwks" in oidc.requests
    for bad, reason in [(oidc.token(aud="another-client"), "another audience"),
                        (oidc.token(iss="https://auth.globus.org"), "another issuer"),
                        (oidc.token(exp_in=-120), "expired")]:
        status, body = Api(bad).call("GET", "/whoami")
        assert status == 401 and reason in body["message"]


def test_oidc_key_rotation_fetches_the_new_key(oidc):
    assert Api(oidc.token()).call("GET", "/whoami")[0] == 200
    fetched = oidc.requests.count("/jwks")
    kid = oidc.rotate("ES256")
    status, body = Api(oidc.token(kid=kid, sub="rotated")).call("GET", "/whoami")
    assert status == 200 and body["user"] == "rotated"
    assert oidc.requests.count("/jwks") == fetched + 1


# --- behind API Gateway's authorizer --------------------------------------------------------
def _gateway_call(method, path, authorizer, body=None, token=None):
    from lambdas.api import handler

    event = api_event(method, path, body, token)
    if authorizer is not None:
        event["requestContext"]["authorizer"] = authorizer
    resp = handler(event, Context())
    return resp["statusCode"], json.loads(resp["body"]) if resp.get("body") else None


@pytest.mark.parametrize("provider,authorizer", [
    ("cognito", {"claims": {"sub": "7d1c-cognito-sub", "cognito:username": "ada"}}),
    ("globus", {"principalId": "globus-sub-1", "sub": "globus-sub-1", "username": "ada@uni.edu"}),
])
def test_behind_api_gateway_the_authorizers_identity_is_used(service_env, monkeypatch, provider, authorizer):
    monkeypatch.setenv("SKYFN_AUTH_PROVIDER", provider)
    deps.reset()
    user = authorizer.get("sub") or authorizer["claims"]["sub"]
    status, body = _gateway_call("POST", "/functions", authorizer, {"function": serialize_function(ident)})
    assert status == 201
    status, info = _gateway_call("GET", f"/functions/{body['function_id']}", authorizer)
    assert status == 200 and info["owner"] == user
    # without the authorizer's context no header is trusted, however well formed
    status, body = _gateway_call("GET", "/whoami", None, token=mint_token("x" * 40, user))
    assert status == 401 and "authorizer" in body["message"]


# --- endpoint credentials ------------------------------------------------------------------
def test_endpoint_credential_reaches_only_its_own_agent_routes(api):
    status, reg = api.call("POST", "/endpoints", {"name": "hpc"})
    cred = reg["agent_credential"]
    ep = reg["endpoint_id"]
    assert cred.startswith(f"skyfn-agent.{ep}.")
    assert reg["task_queue"]["url"].startswith(f"redis://ep-{ep}:")  # the endpoint's Redis user
    _, other = api.call("POST", "/endpoints", {"name": "other"})
    agent = Api(cred)
    assert agent.call("POST", f"/endpoints/{ep}/heartbeat", {"stats": {"workers": 2}})[0] == 200
    status, conn = agent.call("POST", f"/endpoints/{ep}/connect")
    assert status == 200 and conn["endpoint_id"] == ep and "agent_credential" not in conn
    assert conn["task_queue"]["url"].startswith(f"redis://ep-{ep}@")  # no secret: the agent holds it
    for method, path, body in [("POST", f"/endpoints/{other['endpoint_id']}/heartbeat", {"stats": {}}),
                               ("POST", f"/endpoints/{other['endpoint_id']}/connect", None),
                               ("GET", "/endpoints", None), ("GET", f"/endpoints/{ep}", None),
                               ("POST", "/functions", {"function": serialize_function(ident)}),
                               ("POST", "/tasks/status", {"task_ids": ["x"]})]:
        status, answer = agent.call(method, path, body)
        assert status == 403 and "endpoint credential" in answer["message"], (method, path)


def test_rotated_and_revoked_credentials_stop_at_once(api, other_api):
    _, reg = api.call("POST", "/endpoints", {"name": "hpc"})
    ep, first = reg["endpoint_id"], reg["agent_credential"]
    assert other_api.call("POST", f"/endpoints/{ep}/credential")[0] == 404  # not known to mallory
    status, rotated = api.call("POST", f"/endpoints/{ep}/credential")
    assert status == 201 and rotated["agent_credential"] != first
    status, body = Api(first).call("POST", f"/endpoints/{ep}/heartbeat", {"stats": {}})
    assert status == 401 and "not valid" in body["message"]
    assert Api(rotated["agent_credential"]).call("POST", f"/endpoints/{ep}/heartbeat", {"stats": {}})[0] == 200
    assert api.call("DELETE", f"/endpoints/{ep}/credential")[0] == 200
    assert Api(rotated["agent_credential"]).call("POST", f"/endpoints/{ep}/heartbeat", {"stats": {}})[0] == 401
    forged = f"skyfn-agent.{ep}." + "A" * 43
    assert Api(forged).call("POST", f"/endpoints/{ep}/heartbeat", {"stats": {}})[0] == 401


# --- rate limits -----------------------------------------------------------------------------
def test_rate_limit_is_per_user_and_says_when_to_retry(api, other_api, monkeypatch):
    monkeypatch.setenv("SKYFN_RATE_PER_SECOND", "0.5")
    monkeypatch.setenv("SKYFN_RATE_BURST", "3")
    deps.reset()
    from lambdas.api import handler

    answers = [handler(api_event("GET", "/whoami", None, api.token), Context()) for _ in range(4)]
    assert [a["statusCode"] for a in answers] == [200, 200, 200, 429]
    refused = answers[-1]
    body = json.loads(refused["body"])
    assert body["error"] == "rate_limited" and "0.5 requests/s" in body["message"] and "bursts of 3" in body["message"]
    assert "user:alice" in body["message"]
    retry_after = (refused.get("headers") or {}).get("Retry-After") or refused["multiValueHeaders"]["Retry-After"][0]
    assert int(retry_after) >= 1
    assert other_api.call("GET", "/whoami")[0] == 200  # mallory has her own bucket


def test_behind_api_gateway_agents_keep_their_owners_token(service_env, monkeypatch):
    """API Gateway's user authorizer refuses endpoint credentials: none is handed out there,
    and connect (fresh queue credentials) answers the owner's identity instead."""
    monkeypatch.setenv("SKYFN_AUTH_PROVIDER", "cognito")
    deps.reset()
    owner = {"claims": {"sub": "owner-sub"}}
    status, reg = _gateway_call("POST", "/endpoints", owner, {"name": "hpc"})
    assert status == 201 and "agent_credential" not in reg
    status, conn = _gateway_call("POST", f"/endpoints/{reg['endpoint_id']}/connect", owner)
    assert status == 200 and conn["endpoint_id"] == reg["endpoint_id"]
    status, _ = _gateway_call("POST", f"/endpoints/{reg['endpoint_id']}/connect", {"claims": {"sub": "stranger"}})
    assert status == 404


def test_verified_tokens_are_trusted_until_they_expire_and_no_longer(local_keys, monkeypatch):
    """The per-environment cache of verified tokens: a second call skips the signature
    check; once the token's expiry (with the same 30 s leeway) or the cache's own bound
    has passed, the token is verified in full again."""
    pem, jwks = local_keys
    keys = jwt_keys.KeySet.from_jwks(jwks)
    token = mint_token(pem, "alice", ttl_seconds=5)
    real_decode, decoded = jwt.decode, []
    monkeypatch.setattr(jwt, "decode", lambda *a, **k: decoded.append(1) or real_decode(*a, **k))
    claims = keys.verify(token, "skyfn-local", "skyfn")
    assert claims["sub"] == "alice" and len(decoded) == 1
    assert keys.verify(token, "skyfn-local", "skyfn") == claims and len(decoded) == 1  # from the cache
    with pytest.raises(jwt_keys.TokenError, match="another audience"):  # the audience is part of the key
        keys.verify(token, "skyfn-local", "someone-else")
    long_lived = mint_token(pem, "bob", ttl_seconds=3600)
    until = keys._verified[(token, "skyfn-local", "skyfn")][0]
    assert until == claims["exp"] + jwt_keys.LEEWAY_SECONDS  # not a moment past what jwt.decode allows
    monkeypatch.setattr(jwt_keys.time, "time", lambda: until + 0.001)  # (the time module's, for all)
    decoded.clear()
    keys.verify(token, "skyfn-local", "skyfn")  # (still valid by the real clock)
    assert len(decoded) == 1  # verified in full again
    keys.verify(long_lived, "skyfn-local", "skyfn")
    assert keys._verified[(long_lived, "skyfn-local", "skyfn")][0] == until + 0.001 + jwt_keys.VERIFIED_TTL_SECONDS
