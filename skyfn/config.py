"""Where the SDK finds the service: ``$SKYFN_HOME/config.json``, overridden by the
environment (``SKYFN_SERVICE_URL``, ``SKYFN_TOKEN``), overridden by explicit arguments.

``$SKYFN_HOME`` defaults to ``~/.skyfn``; ``skyfn local up`` writes the file (mode 0600)
as ``{"service_url": "http://127.0.0.1:PORT", "token": "<jwt>"}``.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from skyfn.private_file import write_private
from skyfn.protocol.errors import SkyfnError

CONFIG_FILE = "config.json"
ENV_HOME = "SKYFN_HOME"
ENV_SERVICE_URL = "SKYFN_SERVICE_URL"
ENV_TOKEN = "SKYFN_TOKEN"


class ConfigError(SkyfnError):
    """The SDK does not know which service to talk to, or with which token."""


def skyfn_home() -> Path:
    return Path(os.environ.get(ENV_HOME) or "~/.skyfn").expanduser()


def config_path() -> Path:
    return skyfn_home() / CONFIG_FILE


@dataclass(frozen=True)
class ClientConfig:
    service_url: str
    token: str
    source: str  # where the URL came from: "argument", "environment" or the file's path

    def __repr__(self) -> str:  # never print the token
        return f"ClientConfig(service_url={self.service_url!r}, token=<{len(self.token)} chars>, source={self.source!r})"


def _read_file(path: Path) -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read the skyfn client configuration {path}: {exc}") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(
            f"the skyfn client configuration {path} is not valid JSON ({exc}). Run `skyfn local up` to "
            f"rewrite it, or set {ENV_SERVICE_URL} and {ENV_TOKEN}."
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"the skyfn client configuration {path} must hold a JSON object")
    return data


def load_config(service_url: Optional[str] = None, token: Optional[str] = None) -> ClientConfig:
    """Resolve the service URL and token: arguments > environment > config file."""
    path = config_path()
    file_data: Optional[dict] = None

    def from_file() -> dict:
        nonlocal file_data
        if file_data is None:
            file_data = _read_file(path)
        return file_data

    url, url_source = service_url, "argument"
    if not url:
        url, url_source = os.environ.get(ENV_SERVICE_URL), "environment"
    if not url:
        url, url_source = from_file().get("service_url"), str(path)
    tok = token or os.environ.get(ENV_TOKEN) or from_file().get("token")

    if not url or not tok:
        missing = " and ".join(n for n, v in (("service URL", url), ("token", tok)) if not v)
        where = f"{path} does not exist" if not path.exists() else f"{path} has no {missing}"
        raise ConfigError(
            f"No skyfn service configured ({missing} missing: {where}, and {ENV_SERVICE_URL}/{ENV_TOKEN} "
            f"are not set). Run `skyfn local up` to start the embedded service (it writes {path}), or set "
            f"{ENV_SERVICE_URL} and {ENV_TOKEN}, or pass Client(service_url=..., token=...)."
        )
    url = str(url).strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"service URL {url!r} (from {url_source}) must start with http:// or https://")
    return ClientConfig(service_url=url, token=str(tok).strip(), source=url_source)


def write_config(service_url: str, token: str, home: Optional[Path] = None) -> Path:
    """Write ``config.json`` (mode 0600) so that ``Client()`` needs no arguments."""
    home = Path(home) if home is not None else skyfn_home()
    return write_private(home / CONFIG_FILE, json.dumps({"service_url": service_url.rstrip("/"), "token": token}))
