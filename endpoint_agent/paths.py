"""Where an endpoint keeps its state: `$SKYFN_HOME/endpoints/<name>/`.

SKYFN_HOME defaults to ~/.skyfn. The endpoint directory holds config.yaml, agent.pid,
agent.log and status.json (docs/contracts.md, "Client configuration").
"""
from __future__ import annotations

import os
import re
from pathlib import Path

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # skyfn.protocol.api.NAME_PATTERN


def skyfn_home() -> Path:
    return Path(os.environ.get("SKYFN_HOME") or Path.home() / ".skyfn").expanduser()


def endpoints_dir() -> Path:
    return skyfn_home() / "endpoints"


def check_name(name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise ValueError(
            f"invalid endpoint name {name!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


class EndpointPaths:
    """The files of one endpoint."""

    def __init__(self, name: str, root: Path | None = None):
        self.name = check_name(name)
        self.dir = (root or endpoints_dir()) / name

    @property
    def config(self) -> Path:
        return self.dir / "config.yaml"

    @property
    def pid(self) -> Path:
        return self.dir / "agent.pid"

    @property
    def log(self) -> Path:
        return self.dir / "agent.log"

    @property
    def status(self) -> Path:
        return self.dir / "status.json"

    @property
    def credential(self) -> Path:
        """The endpoint's own credential (0600; endpoint_agent/service/credential.py)."""
        return self.dir / "credential"

    def ensure(self) -> "EndpointPaths":
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self
