"""The OIDC token authorizer (lambdas/authorizer.py) against a real issuer on loopback:
an HTTP server publishing an OpenID configuration and a JWKS, tokens signed with its key."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from lambdas import authorizer

METHOD_ARN = "arn:aws:execute-api:us-east-1:123456789012:abc123/prod/POST/tasks"
AUDIENCE = "skyfn-client-id"


@pytest.fixture(scope="module")
def issuer():
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update(kid="k1", use="sig", alg="RS256")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            base = f"http://127.0.0.1:{self.server.server_port}"
            docs = {"/.well-known/openid-configuration": {"issuer": base, "jwks_uri": f"{base}/jwk.json"},
                    "/jwk.json": {"keys": [jwk]}}
            body = json.dumps(docs.get(self.path, {})).encode()
            self.send_response(200 if self.path in docs else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", key
    server.shutdown()
    authorizer.jwks_client.cache_clear()


@pytest.fixture
def env(issuer, monkeypatch):
    url, _ = issuer
    monkeypatch.setenv("SKYFN_AUTH_ISSUER", url)
    monkeypatch.setenv("SKYFN_AUTH_AUDIENCE", AUDIENCE)
    return issuer


def token(key, iss, aud=AUDIENCE, exp_in=600, kid="k1", sub="user-1"):
    now = int(time.time())
    claims = {"sub": sub, "iss": iss, "aud": aud, "iat": now, "exp": now + exp_in, "preferred_username": "ada@uni.edu"}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})


def call(tok):
    return authorizer.handler({"type": "TOKEN", "authorizationToken": tok, "methodArn": METHOD_ARN}, None)


def test_valid_token_allows_the_whole_stage_for_its_subject(env):
    url, key = env
    answer = call(f"Bearer {token(key, url)}")
    assert answer["principalId"] == "user-1"
    (statement,) = answer["policyDocument"]["Statement"]
    assert statement == {"Action": "execute-api:Invoke", "Effect": "Allow",
                         "Resource": "arn:aws:execute-api:us-east-1:123456789012:abc123/prod/*/*"}
    # the identity claims the API reads back (strings only: no email claim is ''; no provider
    # claim: the issuer)
    assert answer["context"] == {"sub": "user-1", "username": "ada@uni.edu", "email": "",
                                 "identity_provider": url}


@pytest.mark.parametrize("case", ["wrong_audience", "wrong_issuer", "expired", "other_key", "no_bearer",
                                  "garbage", "empty"])
def test_bad_tokens_are_unauthorized(env, case):
    url, key = env
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    header = {
        "wrong_audience": f"Bearer {token(key, url, aud='someone-else')}",
        "wrong_issuer": f"Bearer {token(key, 'https://evil.example')}",
        "expired": f"Bearer {token(key, url, exp_in=-120)}",
        "other_key": f"Bearer {token(other, url)}",
        "no_bearer": token(key, url),
        "garbage": "Bearer not.a.jwt",
        "empty": "",
    }[case]
    with pytest.raises(authorizer.Unauthorized, match="^Unauthorized$"):
        call(header)


def test_unconfigured_authorizer_refuses_everything(issuer, monkeypatch):
    url, key = issuer
    monkeypatch.delenv("SKYFN_AUTH_AUDIENCE", raising=False)
    monkeypatch.setenv("SKYFN_AUTH_ISSUER", url)
    with pytest.raises(authorizer.Unauthorized):
        call(f"Bearer {token(key, url)}")
