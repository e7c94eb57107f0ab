"""Fixtures for the service handlers: real redis-server and moto server behind them,
handlers invoked with genuine API Gateway / SQS / EventBridge event shapes."""
from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass

import pytest

from lambdas.auth import mint_token

SECRET = "test-secret-" + "x" * 32


@dataclass
class Context:
    function_name: str = "skyfn-test"
    function_version: str = "$LATEST"
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:000000000000:function:skyfn-test"
    memory_limit_in_mb: int = 1024
    aws_request_id: str = "req"
    log_group_name: str = "/aws/lambda/skyfn-test"
    log_stream_name: str = "local"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


def api_event(method: str, path: str, body=None, token: str | None = None, raw: str | bytes | None = None,
              headers: dict | None = None) -> dict:
    hdrs = {"Content-Type": "application/json"}
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    hdrs.update(headers or {})
    if raw is not None:
        text = raw
    else:
        text = json.dumps(body) if body is not None else None
    b64 = False
    if isinstance(text, bytes):
        text, b64 = base64.b64encode(text).decode(), True
    return {
        "resource": path, "path": path, "httpMethod": method, "headers": hdrs,
        "multiValueHeaders": {k: [v] for k, v in hdrs.items()}, "queryStringParameters": None,
        "multiValueQueryStringParameters": None, "pathParameters": None, "stageVariables": None,
        "requestContext": {"requestId": str(uuid.uuid4()), "stage": "test", "httpMethod": method, "path": path,
                           "identity": {"sourceIp": "127.0.0.1"}, "requestTimeEpoch": 0, "resourcePath": path},
        "body": text, "isBase64Encoded": b64,
    }


class Api:
    """Calls lambdas.api.handler the way API Gateway does."""

    def __init__(self, token: str):
        self.token = token

    def call(self, method: str, path: str, body=None, token: str | None = "default", **kw):
        from lambdas.api import handler

        tok = self.token if token == "default" else token
        resp = handler(api_event(method, path, body, tok, **kw), Context())
        data = json.loads(resp["body"]) if resp.get("body") else None
        return resp["statusCode"], data


@pytest.fixture
def service_env(redis_url, aws_endpoint, monkeypatch, unique):
    from lambdas.bootstrap import ensure_resources
    from lambdas.core import deps

    monkeypatch.setenv("SKYFN_REDIS_URL", redis_url)
    monkeypatch.setenv("SKYFN_AUTH_SECRET", SECRET)
    monkeypatch.setenv("SKYFN_TABLE_PREFIX", f"t{unique}")
    monkeypatch.setenv("SKYFN_QUEUE_KIND", "redis")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "skyfn")
    deps.reset()
    ensure_resources()
    yield
    deps.reset()


@pytest.fixture
def oidc(service_env, monkeypatch):
    """The service verifying tokens of an OIDC issuer (tests/service/oidc_issuer.py: a real
    discovery document and JWKS on loopback), as with Cognito or Globus Auth."""
    from lambdas.core import deps
    from tests.service.oidc_issuer import Issuer

    issuer = Issuer(audience="skyfn-client")
    monkeypatch.delenv("SKYFN_AUTH_SECRET", raising=False)
    monkeypatch.setenv("SKYFN_AUTH_ISSUER", issuer.url)
    monkeypatch.setenv("SKYFN_AUTH_AUDIENCE", "skyfn-client")
    deps.reset()
    yield issuer
    issuer.close()


@pytest.fixture
def api(service_env):
    return Api(mint_token(SECRET, "alice"))


@pytest.fixture
def other_api(service_env):
    return Api(mint_token(SECRET, "mallory"))
