"""The status page's function in AWS (lambdas/ui.py over lambdas/ui_assets) with API
Gateway REST proxy events: every file with its content type and the security headers,
the <base> of the stage, config.json from the environment and nothing else, 404s naming
the fix (path traversal included), revalidation; and the WebSocket authorizer taking the
token the way the page sends it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lambdas import ui, ui_assets

WS_URL = "wss://abc123def4.execute-api.eu-west-1.amazonaws.com/ci"
ASSETS = Path(ui_assets.__file__).resolve().parent
SECRETS = {"SKYFN_REDIS_PASSWORD": "redis-pass-s3cr3t", "SKYFN_AUTH_SECRET": "auth-s3cr3t",
           "SKYFN_RENDEZVOUS_SECRET": "rdv-s3cr3t", "AWS_SECRET_ACCESS_KEY": "aws-s3cr3t",
           "AWS_SESSION_TOKEN": "session-s3cr3t"}


@pytest.fixture(autouse=True)
def env(monkeypatch):
    monkeypatch.setenv("SKYFN_WS_URL", WS_URL)
    monkeypatch.delenv("SKYFN_API_URL", raising=False)
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)


def event(path: str, stage: str = "ci", full: str | None = None, headers: dict | None = None) -> dict:
    """A REST API proxy event as API Gateway sends it for /ui or /ui/{proxy+}."""
    resource = "/ui" if path.rstrip("/") == "/ui" else "/ui/{proxy+}"
    return {"resource": resource, "path": path, "httpMethod": "GET", "headers": headers or {},
            "multiValueHeaders": {k: [v] for k, v in (headers or {}).items()}, "queryStringParameters": None,
            "multiValueQueryStringParameters": None, "pathParameters": None, "stageVariables": None,
            "body": None, "isBase64Encoded": False,
            "requestContext": {"resourcePath": resource, "httpMethod": "GET", "stage": stage,
                               "path": full if full is not None else f"/{stage}{path}",
                               "requestId": "r-1", "identity": {"sourceIp": "192.0.2.1"}}}


def get(path: str, **kw) -> tuple[int, dict[str, str], str]:
    r = ui.handler(event(path, **kw), None)
    assert r.get("isBase64Encoded") is False  # text: the REST API has no binary media types
    headers = {k: v for k, v in (r.get("headers") or {}).items()}
    headers.update({k: v[-1] for k, v in (r.get("multiValueHeaders") or {}).items()})
    return r["statusCode"], headers, r["body"]


def assert_strict_csp(headers: dict[str, str]) -> None:
    csp = headers["Content-Security-Policy"]
    for directive in ("default-src 'none'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'",
                      "form-action 'none'", "base-uri 'self'"):
        assert directive in csp, directive
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp and "*" not in csp
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "DENY"
    assert headers["Referrer-Policy"] == "no-referrer"


@pytest.mark.parametrize("path,name,ctype", [
    ("/ui", "index.html", "text/html"), ("/ui/", "index.html", "text/html"),
    ("/ui/index.html", "index.html", "text/html"), ("/ui/app.js", "app.js", "text/javascript"),
    ("/ui/style.css", "style.css", "text/css")])
def test_every_file_with_its_type_csp_and_cache_headers(path, name, ctype):
    status, headers, body = get(path)
    assert status == 200 and headers["Content-Type"] == f"{ctype}; charset=utf-8"
    assert_strict_csp(headers)
    assert headers["Cache-Control"] == "no-cache" and re.fullmatch(r'"[0-9a-f]{32}"', headers["ETag"])
    source = (ASSETS / name).read_text()
    if name == "index.html":  # the page's files and APIs are found under the stage
        assert body == source.replace('<base href="/ui/">', '<base href="/ci/ui/">')
        assert 'href="style.css"' in body and 'src="app.js"' in body and "<script>" not in body
    else:
        assert body == source


def test_connect_src_allows_the_websocket_api_and_nothing_else():
    _, headers, _ = get("/ui/")
    (connect,) = [d for d in headers["Content-Security-Policy"].split("; ") if d.startswith("connect-src")]
    assert connect == "connect-src 'self' wss://abc123def4.execute-api.eu-west-1.amazonaws.com"


def test_config_has_the_urls_from_the_environment_and_no_secrets():
    status, headers, body = get("/ui/config.json")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert_strict_csp(headers)
    assert json.loads(body) == {"api_url": "/ci/", "ws_url": WS_URL}  # the REST API is the page's origin
    for name, value in SECRETS.items():
        assert value not in body and name not in body


def test_config_follows_a_custom_domain_and_an_explicit_api_url(monkeypatch):
    # custom domain, no base path: API Gateway adds no stage in front of /ui
    _, _, page = get("/ui/", full="/ui/")
    assert '<base href="/ui/">' in page
    assert json.loads(get("/ui/config.json", full="/ui/config.json")[2])["api_url"] == "/"
    _, _, page = get("/ui", full="/skyfn/ui")  # a base path mapping
    assert '<base href="/skyfn/ui/">' in page
    monkeypatch.setenv("SKYFN_API_URL", "https://api.example.org/v1/")
    status, headers, body = get("/ui/config.json")
    assert json.loads(body) == {"api_url": "https://api.example.org/v1/", "ws_url": WS_URL}
    assert "https://api.example.org" in headers["Content-Security-Policy"]


def test_without_a_websocket_url_the_page_is_told_there_is_none(monkeypatch):
    monkeypatch.delenv("SKYFN_WS_URL")
    _, headers, body = get("/ui/config.json")
    assert json.loads(body)["ws_url"] is None
    assert "connect-src 'self';" in headers["Content-Security-Policy"]


@pytest.mark.parametrize("path", ["/ui/nothing-here", "/ui/index.htm", "/ui/APP.JS", "/ui/app.js/", "/ui/x/app.js",
                                  "/uix", "/ui/config.json.bak"])
def test_unknown_paths_are_404_with_a_json_error_naming_the_fix(path):
    status, headers, body = get(path)
    assert status == 404 and headers["Content-Type"] == "application/json"
    assert_strict_csp(headers)
    error = json.loads(body)
    assert error["error"] == "not_found" and "open /ui/" in error["message"]


@pytest.mark.parametrize("path", [
    "/ui/../lambdas/api.py", "/ui/../../etc/passwd", "/ui/..%2flambdas%2fapi.py", "/ui/%2e%2e/lambdas/api.py",
    "/ui/%2e%2e%2f%2e%2e%2flambdas%2fapi.py", "/ui/%252e%252e%252flambdas%252fapi.py", "/ui/..\\..\\lambdas\\api.py",
    "/ui/....//lambdas/api.py", "/ui/./app.js", "/ui//etc/passwd", "/ui/__init__.py", "/ui/%5f%5finit%5f%5f.py",
    "/ui/app.js%00.html", "/ui/ui_assets/__init__.py"])
def test_path_traversal_is_404(path):
    status, _, body = get(path)
    assert status == 404 and json.loads(body)["error"] == "not_found"
    assert "import" not in body and "def " not in body


def test_a_revalidation_with_the_etag_is_304_without_a_body():
    _, headers, _ = get("/ui/app.js")
    status, again, body = get("/ui/app.js", headers={"if-none-match": headers["ETag"]})  # HTTP/2: lowercase
    assert status == 304 and body == "" and again["ETag"] == headers["ETag"]
    assert get("/ui/app.js", headers={"If-None-Match": '"stale"'})[0] == 200


def test_the_websocket_authorizer_reads_the_token_where_the_page_puts_it():
    """Browsers cannot set headers on a WebSocket: app.js sends ?token=, and the $connect
    authorizer (lambdas/ws.py) takes it from the query string as well as the header."""
    from lambdas import ws

    app_js = (ASSETS / "app.js").read_text()
    assert 'searchParams.set("token", ui.token)' in app_js
    connect = {"headers": {"Host": "abc123def4.execute-api.eu-west-1.amazonaws.com"},
               "queryStringParameters": {"token": "eyJ.header.sig"}, "requestContext": {"routeKey": "$connect"}}
    assert ws._token(connect) == "eyJ.header.sig"
    assert ws._token({"headers": {"authorization": "Bearer eyJ.sdk.sig"}}) == "eyJ.sdk.sig"
