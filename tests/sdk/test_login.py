"""`skyfn login` (skyfn/login.py) against a real OpenID Connect issuer on loopback: the
browser flow (authorization code + PKCE S256 + loopback redirect), the device flow, the
refresh, and the configuration file kept with mode 0600."""
from __future__ import annotations

import json
import stat

import jwt
import pytest
import requests

from skyfn import login
from tests.service.oidc_issuer import Issuer


@pytest.fixture
def issuer():
    iss = Issuer(audience="skyfn-client", user="ada")
    yield iss
    iss.close()


def _claims(token: str, issuer: Issuer) -> dict:
    return jwt.decode(token, options={"verify_signature": False}, audience="skyfn-client", issuer=issuer.url)


def test_browser_flow_with_pkce_keeps_the_token_private(issuer, tmp_path):
    shown = []
    path = login.login_oidc(issuer.url, "skyfn-client", "https://api.example.org/", open_browser=requests.get,
                            echo=shown.append, home=tmp_path, timeout=30)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    config = json.loads(path.read_text())
    assert config["service_url"] == "https://api.example.org" and config["refresh_token"]
    assert _claims(config["token"], issuer)["sub"] == "ada"
    assert "/token" in issuer.requests  # the code was traded with its verifier (the issuer checks S256)
    assert all(config["token"] not in line for line in shown)


def test_device_flow_waits_for_the_user(issuer, tmp_path):
    shown = []
    path = login.login_oidc(issuer.url, "skyfn-client", "https://api.example.org", device=True, echo=shown.append,
                            home=tmp_path, timeout=30)
    assert any("ABCD-EFGH" in line for line in shown)
    assert issuer.requests.count("/token") == 2  # authorization_pending first, then the tokens
    assert _claims(json.loads(path.read_text())["token"], issuer)["sub"] == "ada"


def test_refresh_replaces_the_token_and_keeps_other_keys(issuer, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"theme": "dark"}))
    login.login_oidc(issuer.url, "skyfn-client", "https://api.example.org", open_browser=requests.get,
                     echo=lambda m: None, home=tmp_path, timeout=30)
    first = json.loads((tmp_path / "config.json").read_text())
    issuer.user = "ada-again"
    login.refresh(tmp_path)
    second = json.loads((tmp_path / "config.json").read_text())
    assert second["token"] != first["token"] and _claims(second["token"], issuer)["sub"] == "ada-again"
    assert second["theme"] == "dark"


def test_errors_say_what_to_do(issuer, tmp_path):
    with pytest.raises(login.LoginError, match="no refresh token kept"):
        login.refresh(tmp_path)
    with pytest.raises(login.LoginError, match="discovery document"):
        login.login_oidc("http://127.0.0.1:9", "c", "https://x", echo=lambda m: None, home=tmp_path)
