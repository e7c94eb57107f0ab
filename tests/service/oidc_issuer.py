"""A real OpenID Connect issuer on loopback for the tests: discovery document, JWKS (keys
can be rotated), and the endpoints a login needs -- authorization (approves at once and
redirects with a code, as a signed-in user's browser would), token (authorization code
with PKCE S256 checked, refresh token, device code) and device authorization."""
from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa


class Issuer:
    def __init__(self, audience: str = "skyfn", user: str = "ada"):
        self.audience = audience
        self.user = user
        self.keys: list[tuple[str, object, str]] = []  # (kid, private key, alg)
        self.codes: dict[str, dict] = {}
        self.devices: dict[str, dict] = {}
        self.refresh: dict[str, str] = {}
        self.requests: list[str] = []
        self.rotate("RS256")
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def rotate(self, alg: str = "ES256") -> str:
        kid = f"k{len(self.keys) + 1}"
        key = ec.generate_private_key(ec.SECP256R1()) if alg == "ES256" else \
            rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.keys.append((kid, key, alg))
        return kid

    def jwks(self) -> dict:
        out = []
        for kid, key, alg in self.keys:
            algo = jwt.algorithms.ECAlgorithm if alg == "ES256" else jwt.algorithms.RSAAlgorithm
            jwk = json.loads(algo.to_jwk(key.public_key()))
            jwk.update(kid=kid, use="sig", alg=alg)
            out.append(jwk)
        return {"keys": out}

    def token(self, sub: str | None = None, aud: str | None = None, iss: str | None = None, exp_in: int = 600,
              kid: str | None = None) -> str:
        kid = kid or self.keys[-1][0]
        _, key, alg = next(k for k in self.keys if k[0] == kid)
        now = int(time.time())
        claims = {"sub": sub or self.user, "iss": iss or self.url, "aud": aud or self.audience, "iat": now,
                  "exp": now + exp_in}
        return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid})

    def _tokens(self) -> dict:
        refresh = secrets.token_urlsafe(16)
        self.refresh[refresh] = self.user
        return {"access_token": self.token(), "id_token": self.token(), "refresh_token": refresh,
                "token_type": "Bearer", "expires_in": 600}

    def _handler(self):
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: dict | None = None, headers: dict | None = None):
                data = json.dumps(body or {}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                issuer.requests.append(self.path)
                url = urlsplit(self.path)
                if url.path == "/.well-known/openid-configuration":
                    base = issuer.url
                    return self._send(200, {"issuer": base, "jwks_uri": f"{base}/jwks",
                                            "authorization_endpoint": f"{base}/authorize",
                                            "token_endpoint": f"{base}/token",
                                            "device_authorization_endpoint": f"{base}/device"})
                if url.path == "/jwks":
                    return self._send(200, issuer.jwks())
                if url.path == "/authorize":  # a signed-in user approves at once
                    q = {k: v[0] for k, v in parse_qs(url.query).items()}
                    code = secrets.token_urlsafe(12)
                    issuer.codes[code] = q
                    target = f"{q['redirect_uri']}?{urlencode({'code': code, 'state': q.get('state', '')})}"
                    return self._send(302, {}, {"Location": target})
                return self._send(404)

            def do_POST(self):  # noqa: N802
                issuer.requests.append(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                if self.path == "/device":
                    code = secrets.token_urlsafe(12)
                    issuer.devices[code] = {"polls": 0}
                    return self._send(200, {"device_code": code, "user_code": "ABCD-EFGH", "interval": 0,
                                            "verification_uri": f"{issuer.url}/activate", "expires_in": 60})
                if self.path != "/token":
                    return self._send(404)
                grant = form.get("grant_type")
                if grant == "authorization_code":
                    req = issuer.codes.pop(form.get("code", ""), None)
                    if req is None:
                        return self._send(400, {"error": "invalid_grant"})
                    challenge = base64.urlsafe_b64encode(
                        hashlib.sha256(form.get("code_verifier", "").encode()).digest()).rstrip(b"=").decode()
                    if req.get("code_challenge_method") != "S256" or challenge != req.get("code_challenge") \
                            or form.get("redirect_uri") != req.get("redirect_uri"):
                        return self._send(400, {"error": "invalid_grant", "error_description": "PKCE check failed"})
                    return self._send(200, issuer._tokens())
                if grant == "urn:ietf:params:oauth:grant-type:device_code":
                    dev = issuer.devices.get(form.get("device_code", ""))
                    if dev is None:
                        return self._send(400, {"error": "expired_token"})
                    dev["polls"] += 1
                    if dev["polls"] < 2:  # the user has not approved yet on the first poll
                        return self._send(400, {"error": "authorization_pending"})
                    return self._send(200, issuer._tokens())
                if grant == "refresh_token":
                    if form.get("refresh_token") not in issuer.refresh:
                        return self._send(400, {"error": "invalid_grant"})
                    return self._send(200, issuer._tokens())
                return self._send(400, {"error": "unsupported_grant_type"})

            def log_message(self, *args):
                pass

        return Handler
