"""Reaching a deployment of the embedded runtime: the local user, tokens of its issuer, the
client config's token, and the endpoint list (the service's health check). Shared by
starting (infra/local/up.py) and looking at it (infra/local/runtime.py)."""
from __future__ import annotations

import getpass
import json

import requests

from infra.local.state import StateDir

ENDPOINT = "local"
LOCAL_IDENTITY_PROVIDER = "skyfn-local"


class LocalError(Exception):
    """A problem the user can act on; the CLI prints it as one line."""


def local_user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "local"


def mint_token(state: StateDir, user: str, ttl_seconds: int = 30 * 24 * 3600, *, username: str | None = None,
               email: str | None = None, identity_provider: str = LOCAL_IDENTITY_PROVIDER) -> str:
    """A token of the local issuer for `user`, signed with the runtime's private key, with the
    identity claims a multi-user endpoint maps (DESIGN.md section 12): `preferred_username`
    (default: `user`), `identity_provider` ("skyfn-local") and `email` (only when given)."""
    from infra.local.handlers import mint_token as mint

    key = state.signing_key(create=False)
    if not key:
        raise LocalError(f"no local runtime in {state.root}: run `skyfn local up` first")
    return mint(key, user, ttl_seconds, username=username or user, email=email or None,
                identity_provider=identity_provider or LOCAL_IDENTITY_PROVIDER)


def get_endpoints(url: str, token: str, timeout: float = 3.0) -> list[dict]:
    r = requests.get(f"{url}/endpoints", headers={"Authorization": f"Bearer {token}"}, timeout=timeout)
    if r.status_code != 200:
        raise LocalError(f"GET /endpoints answered {r.status_code}: {r.text[:200]}")
    return r.json().get("endpoints", [])


def client_token(state: StateDir) -> str | None:
    try:
        return json.loads(state.client_config.read_text()).get("token")
    except (OSError, ValueError, AttributeError):
        return None
