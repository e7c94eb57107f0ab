"""Globus settings of an endpoint (config.yaml `data: globus:`) and its Transfer client.

    data:
      globus:
        collection: 2f1c9a6e-...        # this endpoint's Globus collection (a UUID)
        root: /lustre/me/globus         # the local directory that collection's "/" is
        batch_size: 100                 # items per Transfer task (per source/destination pair)
        max_concurrent_transfers: 5     # Transfer tasks in flight at once
        token_file: ~/.skyfn/endpoints/NAME/globus_tokens.json   # default: in the endpoint directory

Credentials, in order: a confidential client (`client_id` with `client_secret_file` or
`client_secret_env`: ClientCredentialsAuthorizer); else the token file's refresh token
(`client_id` of the native app that obtained it: RefreshTokenAuthorizer); else the token
file's access token alone (AccessTokenAuthorizer, for tests and short jobs). Refreshed
tokens are written back to the token file (0600, atomically, like `skyfn login`'s config);
tokens are never logged. `transfer_url` / `auth_url` (or globus-sdk's own
GLOBUS_SDK_SERVICE_URL_TRANSFER / _AUTH) point the clients elsewhere, e.g. at
`python -m infra.local.standins.globus_transfer`.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from skyfn.private_file import write_private

TRANSFER_RS = "transfer.api.globus.org"
TRANSFER_SCOPE = "urn:globus:auth:scope:transfer.api.globus.org:all"
UUID_RE = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"

# What each key accepts (error messages name the key, the bad value and these).
ALLOWED: dict[str, str] = {
    "collection": "the UUID of this endpoint's Globus collection",
    "root": "the absolute local directory the collection's '/' maps to",
    "stage_dir": "a relative directory under root for staged files (default .skyfn-staging)",
    "batch_size": "an integer from 1 to 10000 (items per Transfer task; default 100)",
    "max_concurrent_transfers": "an integer from 1 to 100 (Transfer tasks in flight; default 5)",
    "batch_wait": "seconds from 0 to 60 to gather items into a batch (default 0.5)",
    "poll_min": "seconds from 0.01 to 600 (first status poll of a Transfer task; default 1)",
    "poll_max": "seconds from 0.01 to 3600 (polls back off up to this; default 30)",
    "transfer_timeout": "seconds from 1 to 2592000 a Transfer task may take before it is cancelled (default 86400)",
    "sync_level": "one of: exists, size, mtime, checksum (default: always copy)",
    "token_file": "a path (JSON, 0600) holding the Transfer tokens (default: globus_tokens.json in the endpoint "
                  "directory)",
    "client_id": "the Globus Auth client id (UUID) that owns the refresh token or the client credentials",
    "client_secret_file": "a file holding the confidential client's secret",
    "client_secret_env": "an environment variable holding the confidential client's secret",
    "transfer_url": "the base URL of the Transfer API (default globus-sdk's)",
    "auth_url": "the base URL of Globus Auth (default globus-sdk's)",
}


class GlobusConfigError(ValueError):
    """A `data: globus:` setting that cannot be used; the message names it and the fix."""


class GlobusSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    collection: str = Field(pattern=UUID_RE)
    root: str = Field(min_length=1)
    stage_dir: str = Field(default=".skyfn-staging", pattern=r"^[A-Za-z0-9_.-][A-Za-z0-9_./-]*$")
    batch_size: int = Field(default=100, ge=1, le=10_000)
    max_concurrent_transfers: int = Field(default=5, ge=1, le=100)
    batch_wait: float = Field(default=0.5, ge=0, le=60)
    poll_min: float = Field(default=1.0, ge=0.01, le=600)
    poll_max: float = Field(default=30.0, ge=0.01, le=3600)
    transfer_timeout: float = Field(default=86400.0, ge=1, le=30 * 86400)
    sync_level: Optional[Literal["exists", "size", "mtime", "checksum"]] = None
    token_file: Optional[str] = None
    client_id: Optional[str] = Field(default=None, pattern=UUID_RE)
    client_secret_file: Optional[str] = None
    client_secret_env: Optional[str] = None
    transfer_url: Optional[str] = Field(default=None, pattern=r"^https?://\S+$")
    auth_url: Optional[str] = Field(default=None, pattern=r"^https?://\S+$")

    @property
    def root_path(self) -> Path:
        return Path(os.path.expanduser(self.root))

    def token_path(self, default_dir: Optional[Path] = None) -> Optional[Path]:
        if self.token_file:
            return Path(os.path.expanduser(self.token_file))
        return default_dir / "globus_tokens.json" if default_dir is not None else None


def parse_globus(raw: Any, where: str = "data.globus") -> GlobusSettings:
    """Validate a `data: globus:` mapping; GlobusConfigError naming key, value and what is allowed."""
    if isinstance(raw, GlobusSettings):
        return raw
    if not isinstance(raw, dict):
        raise GlobusConfigError(f"{where}: expected a mapping with keys {', '.join(ALLOWED)}, got {raw!r}")
    unknown = [k for k in raw if k not in ALLOWED]
    if unknown:
        raise GlobusConfigError(f"{where}: unknown key {unknown[0]!r} (value {raw[unknown[0]]!r}); allowed keys: "
                                f"{', '.join(ALLOWED)}")
    for key in ("collection", "root"):
        if raw.get(key) in (None, ""):
            raise GlobusConfigError(f"{where}.{key} is required: {ALLOWED[key]}")
    try:
        settings = GlobusSettings.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err.get("loc", ())) or "?"
        raise GlobusConfigError(f"{where}.{key}: value {err.get('input')!r} is not allowed ({err.get('msg')}); "
                                f"allowed: {ALLOWED.get(key.split('.')[0], 'see docs/data.md')}") from None
    if not os.path.isabs(os.path.expanduser(settings.root)):
        raise GlobusConfigError(f"{where}.root: value {settings.root!r} is not allowed; allowed: {ALLOWED['root']}")
    if ".." in settings.stage_dir.split("/"):
        raise GlobusConfigError(f"{where}.stage_dir: value {settings.stage_dir!r} is not allowed; allowed: "
                                f"{ALLOWED['stage_dir']}")
    if settings.poll_max < settings.poll_min:
        raise GlobusConfigError(f"{where}.poll_max: value {settings.poll_max!r} is below poll_min "
                                f"({settings.poll_min}); allowed: {ALLOWED['poll_max']}")
    if (settings.client_secret_file or settings.client_secret_env) and not settings.client_id:
        raise GlobusConfigError(f"{where}.client_id is required with client_secret_file/client_secret_env: "
                                f"{ALLOWED['client_id']}")
    return settings


# --- tokens ---------------------------------------------------------------------------
def read_tokens(path: Path) -> dict:
    """The token file: {resource server: {access_token, refresh_token, expires_at_seconds}}."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise GlobusConfigError(f"{path}: not valid JSON ({exc.__class__.__name__}); rewrite it with "
                                "skyfn.data.globus_config.save_tokens") from None
    return doc if isinstance(doc, dict) else {}


def save_tokens(path: Path, tokens: dict) -> Path:
    """Merge {resource server: token data} into the token file (0600, atomic, never logged)."""
    path = Path(path)
    doc = read_tokens(path)
    for rs, data in tokens.items():
        doc[rs] = {k: data.get(k) for k in ("access_token", "refresh_token", "expires_at_seconds", "scope")
                   if data.get(k) is not None}
    return write_private(path, json.dumps(doc, indent=2))


def _saver(path: Optional[Path]):
    def on_refresh(response) -> None:  # an OAuthTokenResponse: keep the new tokens for the next start
        if path is not None:
            data = dict(response.by_resource_server)
            old = read_tokens(path).get(TRANSFER_RS, {})
            if TRANSFER_RS in data and not data[TRANSFER_RS].get("refresh_token") and old.get("refresh_token"):
                data[TRANSFER_RS] = {**data[TRANSFER_RS], "refresh_token": old["refresh_token"]}
            save_tokens(path, data)
    return on_refresh


def authorizer(settings: GlobusSettings, token_path: Optional[Path]):
    """A globus-sdk authorizer for Transfer, from the settings and the token file."""
    import globus_sdk

    tokens = read_tokens(token_path).get(TRANSFER_RS, {}) if token_path is not None else {}
    access, expires = tokens.get("access_token"), tokens.get("expires_at_seconds")
    if access and expires is None:
        expires = int(time.time()) + 3600
    secret = None
    if settings.client_secret_file:
        try:
            secret = Path(os.path.expanduser(settings.client_secret_file)).read_text().strip()
        except OSError as exc:
            raise GlobusConfigError(f"data.globus.client_secret_file: cannot read {settings.client_secret_file} "
                                    f"({exc.strerror})") from None
    elif settings.client_secret_env:
        secret = os.environ.get(settings.client_secret_env)
        if not secret:
            raise GlobusConfigError(f"data.globus.client_secret_env: the environment variable "
                                    f"{settings.client_secret_env} is not set")
    if secret is not None:
        client = globus_sdk.ConfidentialAppAuthClient(settings.client_id, secret, base_url=settings.auth_url)
        return globus_sdk.ClientCredentialsAuthorizer(client, TRANSFER_SCOPE, access_token=access,
                                                      expires_at=expires if access else None,
                                                      on_refresh=_saver(token_path))
    if tokens.get("refresh_token"):
        if not settings.client_id:
            raise GlobusConfigError("data.globus.client_id is required to refresh the token in "
                                    f"{token_path}: the id of the native app that obtained it")
        client = globus_sdk.NativeAppAuthClient(settings.client_id, base_url=settings.auth_url)
        return globus_sdk.RefreshTokenAuthorizer(tokens["refresh_token"], client, access_token=access,
                                                 expires_at=expires if access else None,
                                                 on_refresh=_saver(token_path))
    if access:
        return globus_sdk.AccessTokenAuthorizer(access)
    raise GlobusConfigError(
        f"no Globus credentials for Transfer: write {token_path or 'data.globus.token_file'} "
        f"({{\"{TRANSFER_RS}\": {{\"access_token\": ..., \"refresh_token\": ..., \"expires_at_seconds\": ...}}}}, "
        "e.g. with skyfn.data.globus_config.save_tokens after a globus-sdk login flow) and set client_id, or "
        "set client_id with client_secret_file / client_secret_env (a confidential client)")


def transfer_client(settings: GlobusSettings, token_path: Optional[Path]):
    """globus-sdk's real TransferClient for these settings."""
    import globus_sdk

    return globus_sdk.TransferClient(authorizer=authorizer(settings, token_path), base_url=settings.transfer_url,
                                     app_name="skyfn")


def is_uuid(text: str) -> bool:
    return bool(re.match(UUID_RE, text or ""))


# --- login: a refresh token for an endpoint, once ------------------------------------------
def login(client_id: str, token_path: Path, *, auth_url: Optional[str] = None,
          ask=input, echo=print) -> Path:
    """Globus Auth's native app flow (PKCE): open the URL shown, log in, paste the code;
    the Transfer tokens (with a refresh token) go to token_path, 0600. Never printed."""
    import globus_sdk

    client = globus_sdk.NativeAppAuthClient(client_id, base_url=auth_url)
    client.oauth2_start_flow(requested_scopes=TRANSFER_SCOPE, refresh_tokens=True)
    echo(f"Open this URL, log in, and paste the authorization code it shows:\n\n  {client.oauth2_get_authorize_url()}\n")
    code = ask("Authorization code: ").strip()
    if not code:
        raise GlobusConfigError("no authorization code given: run the login again and paste the code")
    tokens = client.oauth2_exchange_code_for_tokens(code)
    if TRANSFER_RS not in tokens.by_resource_server:
        raise GlobusConfigError(f"Globus Auth returned no token for {TRANSFER_RS}: consent to the Transfer scope")
    path = save_tokens(token_path, {TRANSFER_RS: tokens.by_resource_server[TRANSFER_RS]})
    echo(f"Transfer tokens saved to {path} (0600); set data.globus.client_id: {client_id} in config.yaml")
    return path


def main(argv: Optional[list[str]] = None) -> int:
    """python -m skyfn.data.globus_config login --client-id ID (--endpoint NAME | --token-file PATH)"""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m skyfn.data.globus_config",
                                 description="Log in to Globus once and keep Transfer tokens for an endpoint.")
    sub = ap.add_subparsers(dest="command", required=True)
    lg = sub.add_parser("login", help="native app login flow; tokens to the endpoint's token file (0600)")
    lg.add_argument("--client-id", required=True, help="your Globus native app's client id (UUID)")
    where = lg.add_mutually_exclusive_group(required=True)
    where.add_argument("--endpoint", help="the endpoint NAME: $SKYFN_HOME/endpoints/NAME/globus_tokens.json")
    where.add_argument("--token-file", help="where to keep the tokens")
    lg.add_argument("--auth-url", default=None, help="Globus Auth's base URL (default globus-sdk's)")
    args = ap.parse_args(argv)
    if not is_uuid(args.client_id):
        ap.error(f"--client-id {args.client_id!r}: give the app's client id (a UUID)")
    if args.token_file:
        path = Path(os.path.expanduser(args.token_file))
    else:
        from skyfn.config import skyfn_home

        path = skyfn_home() / "endpoints" / args.endpoint / "globus_tokens.json"
    import globus_sdk

    try:
        login(args.client_id, path, auth_url=args.auth_url)
    except (GlobusConfigError, EOFError, globus_sdk.GlobusAPIError) as exc:
        print(f"login failed: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
