"""`skyfn login`: get a token and keep it in the client configuration
(`$SKYFN_HOME/config.json`, mode 0600, written atomically; other keys are kept).

- the embedded runtime (`--local`): a token of the local issuer for a local user, signed
  with the runtime's key (`$SKYFN_HOME/local/signing_key.pem`), minted by the runtime's own
  plugin (entry point `local` in group `skyfn.login`: infra/local/cli.py);
- an OpenID Connect issuer (Cognito's hosted UI, Globus Auth, ...), found through its
  discovery document, as a public client (no secret on a laptop):
  * browser (default): authorization code with PKCE (S256) and a loopback redirect
    (RFC 8252): a one-shot HTTP server on 127.0.0.1 receives the code;
  * device (`--device`, for a terminal on a login node): the device authorization grant
    (RFC 8628): the user opens a URL elsewhere and types a code;
  the refresh token is kept, and `skyfn login --refresh` trades it for a new token.
Tokens are never printed.
"""
from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import parse_qs, urlencode, urlsplit

import requests

from skyfn.config import CONFIG_FILE, skyfn_home
from skyfn.private_file import write_private
from skyfn.protocol.errors import SkyfnError

TIMEOUT = 10.0


class LoginError(SkyfnError):
    """The login did not complete; the message says why and what to do."""


# --- the configuration file --------------------------------------------------------------
def save(updates: dict[str, Any], home: Optional[Path] = None) -> Path:
    """Merge `updates` into config.json (0600, atomic)."""
    home = Path(home) if home is not None else skyfn_home()
    home.mkdir(parents=True, exist_ok=True)
    path = home / CONFIG_FILE
    try:
        config = json.loads(path.read_text())
        if not isinstance(config, dict):
            config = {}
    except (OSError, ValueError):
        config = {}
    config.update({k: v for k, v in updates.items() if v is not None})
    return write_private(path, json.dumps(config, indent=2))


def _read(home: Optional[Path]) -> dict:
    path = (Path(home) if home is not None else skyfn_home()) / CONFIG_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


# --- the embedded runtime -----------------------------------------------------------------
def login_local(user: Optional[str] = None, days: float = 30, home: Optional[Path] = None) -> Path:
    """Keep a token of the running embedded runtime for `user` (default: the login name). The
    runtime's issuer and users are its own: it answers through its `skyfn.login` plugin
    (infra/local/cli.py; skyfn/extras.py), so the SDK imports nothing of it."""
    from skyfn import extras

    local_login = extras.plugin(extras.LOGIN_PLUGINS, "local")
    if local_login is None:
        raise extras.missing_plugin(extras.LOGIN_PLUGINS, "local", "skyfn login --local")
    home = Path(home).expanduser() if home is not None else None
    return save(local_login(user, days=days, home=home), home)


# --- an OpenID Connect issuer ---------------------------------------------------------------
def discover(issuer: str) -> dict:
    url = f"{issuer.rstrip('/')}/.well-known/openid-configuration"
    try:
        resp = requests.get(url, timeout=TIMEOUT)
        resp.raise_for_status()
        return resp.json()
    except (requests.RequestException, ValueError) as exc:
        raise LoginError(f"cannot read the issuer's discovery document {url}: {exc}") from None


def _token_request(endpoint: str, form: dict) -> tuple[int, dict]:
    try:
        resp = requests.post(endpoint, data=form, timeout=TIMEOUT, headers={"Accept": "application/json"})
        return resp.status_code, resp.json()
    except (requests.RequestException, ValueError) as exc:
        raise LoginError(f"the token endpoint {endpoint} did not answer: {exc}") from None


def _pick(tokens: dict, prefer: str) -> str:
    token = tokens.get(prefer) or tokens.get("id_token") or tokens.get("access_token")
    if not token:
        raise LoginError("the issuer answered without a token")
    return token


class _Callback(BaseHTTPRequestHandler):
    result: dict = {}

    def do_GET(self):  # noqa: N802
        q = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
        type(self).result.update(q)
        body = b"skyfn: login complete, you may close this window.\n" if "code" in q else b"skyfn: login failed.\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # the query carries the code: never logged
        pass


def browser_flow(meta: dict, client_id: str, scopes: str, open_browser: Callable[[str], Any],
                 echo: Callable[[str], None], timeout: float) -> dict:
    verifier = secrets.token_urlsafe(64)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    state = secrets.token_urlsafe(16)
    handler = type("Callback", (_Callback,), {"result": {}})
    server = HTTPServer(("127.0.0.1", 0), handler)
    redirect = f"http://127.0.0.1:{server.server_port}/callback"
    url = meta["authorization_endpoint"] + "?" + urlencode({
        "response_type": "code", "client_id": client_id, "redirect_uri": redirect, "scope": scopes,
        "state": state, "code_challenge": challenge, "code_challenge_method": "S256"})
    deadline = time.monotonic() + timeout
    server.timeout = 0.5
    echo(f"opening your browser to sign in (if it does not open, visit: {url})")
    threading.Thread(target=open_browser, args=(url,), daemon=True).start()
    try:
        while "code" not in handler.result and "error" not in handler.result:
            if time.monotonic() > deadline:
                raise LoginError(f"no sign-in within {timeout:.0f} s: run `skyfn login` again")
            server.handle_request()
    finally:
        server.server_close()
    got = handler.result
    if got.get("state") != state:
        raise LoginError("the sign-in answer does not match this login (state mismatch): run `skyfn login` again")
    if "error" in got:
        raise LoginError(f"the issuer refused the sign-in: {got.get('error')} {got.get('error_description', '')}")
    status, tokens = _token_request(meta["token_endpoint"], {
        "grant_type": "authorization_code", "code": got["code"], "redirect_uri": redirect, "client_id": client_id,
        "code_verifier": verifier})
    if status != 200:
        raise LoginError(f"the issuer refused the code: {tokens.get('error')} {tokens.get('error_description', '')}")
    return tokens


def device_flow(meta: dict, client_id: str, scopes: str, echo: Callable[[str], None], timeout: float) -> dict:
    endpoint = meta.get("device_authorization_endpoint")
    if not endpoint:
        raise LoginError("this issuer offers no device login: sign in with the browser flow (without --device)")
    status, dev = _token_request(endpoint, {"client_id": client_id, "scope": scopes})
    if status != 200 or "device_code" not in dev:
        raise LoginError(f"the issuer refused the device login: {dev.get('error')}")
    echo(f"to sign in, open {dev.get('verification_uri_complete') or dev['verification_uri']} "
         f"and enter the code {dev['user_code']}")
    interval = float(dev.get("interval", 5))
    deadline = time.monotonic() + min(timeout, float(dev.get("expires_in", timeout)))
    while time.monotonic() < deadline:
        status, tokens = _token_request(meta["token_endpoint"], {
            "grant_type": "urn:ietf:params:oauth:grant-type:device_code", "device_code": dev["device_code"],
            "client_id": client_id})
        if status == 200:
            return tokens
        error = tokens.get("error")
        if error == "slow_down":
            interval += 5
        elif error != "authorization_pending":
            raise LoginError(f"the device login ended: {error} {tokens.get('error_description', '')}")
        time.sleep(interval)
    raise LoginError("the device code expired before the sign-in: run `skyfn login --device` again")


def login_oidc(issuer: str, client_id: str, service_url: str, *, device: bool = False, scopes: str = "openid",
               prefer: str = "id_token", open_browser: Optional[Callable[[str], Any]] = None,
               echo: Callable[[str], None] = print, timeout: float = 300.0, home: Optional[Path] = None) -> Path:
    if not service_url.startswith(("http://", "https://")):
        raise LoginError(f"service URL {service_url!r} must start with https:// (or http:// on this machine)")
    meta = discover(issuer)
    if device:
        tokens = device_flow(meta, client_id, scopes, echo, timeout)
    else:
        import webbrowser

        tokens = browser_flow(meta, client_id, scopes, open_browser or webbrowser.open, echo, timeout)
    return save({"service_url": service_url.rstrip("/"), "token": _pick(tokens, prefer),
                 "refresh_token": tokens.get("refresh_token"), "issuer": issuer, "client_id": client_id,
                 "token_kind": prefer, "token_expires": time.time() + float(tokens.get("expires_in", 3600))}, home)


def refresh(home: Optional[Path] = None) -> Path:
    """A new token from the refresh token kept by the last login."""
    config = _read(home)
    if not config.get("refresh_token") or not config.get("issuer") or not config.get("client_id"):
        raise LoginError("no refresh token kept: run `skyfn login` (with --issuer and --client-id) first")
    meta = discover(config["issuer"])
    status, tokens = _token_request(meta["token_endpoint"], {
        "grant_type": "refresh_token", "refresh_token": config["refresh_token"], "client_id": config["client_id"]})
    if status != 200:
        raise LoginError(f"the issuer refused the refresh ({tokens.get('error')}): run `skyfn login` again")
    return save({"token": _pick(tokens, config.get("token_kind", "id_token")),
                 "refresh_token": tokens.get("refresh_token") or config["refresh_token"],
                 "token_expires": time.time() + float(tokens.get("expires_in", 3600))}, home)
