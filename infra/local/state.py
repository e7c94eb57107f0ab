"""Files of the embedded runtime. `$SKYFN_HOME` (default ~/.skyfn) holds the client
configuration `config.json`; `$SKYFN_HOME/local/` holds the runtime's state:

    signing_key.pem      ES256 private key of the local token issuer (0600, created once, kept)
    jwks.json            its public half, the key set the service verifies tokens with
    redis/               also users.acl (Redis users: the service's, one per endpoint agent)
                         and redis.password (the service's Redis password, 0600)
    runtime.json         ports and URLs of the running deployment (written by `up`)
    redis.pid moto.pid service.pid    one pid file per process we started (pid, start time)
    redis/               redis-server's directory: the append-only file (kept by `down`), redis.log
    moto/moto.log        moto server's log
    service.log          the gateway / event-source mapping / scheduler process's log
"""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from skyfn.private_file import write_private

PROCESS_NAMES = ("redis", "moto", "service")


def skyfn_home(home: str | os.PathLike | None = None) -> Path:
    if home is not None:
        return Path(home).expanduser()
    return Path(os.environ.get("SKYFN_HOME") or "~/.skyfn").expanduser()


@dataclass(frozen=True)
class StateDir:
    home: Path

    @classmethod
    def at(cls, home: str | os.PathLike | None = None) -> "StateDir":
        return cls(skyfn_home(home))

    @property
    def root(self) -> Path:
        return self.home / "local"

    @property
    def client_config(self) -> Path:
        return self.home / "config.json"

    @property
    def runtime_file(self) -> Path:
        return self.root / "runtime.json"

    @property
    def secret_file(self) -> Path:
        return self.root / "auth_secret"

    @property
    def signing_key_file(self) -> Path:
        return self.root / "signing_key.pem"

    @property
    def jwks_file(self) -> Path:
        return self.root / "jwks.json"

    @property
    def service_log(self) -> Path:
        return self.root / "service.log"

    def pidfile(self, name: str) -> Path:
        return self.root / f"{name}.pid"

    def workdir(self, name: str) -> Path:
        return self.root / name

    def endpoint_dir(self, name: str) -> Path:
        return self.home / "endpoints" / name

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)

    # -- secret, runtime record, client config --------------------------------------

    def auth_secret(self, create: bool = True) -> str | None:
        """The local HMAC secret, created (random, 0600) on first use."""
        try:
            return self.secret_file.read_text().strip()
        except FileNotFoundError:
            if not create:
                return None
        self.ensure()
        secret = secrets.token_urlsafe(48)
        try:  # O_EXCL: two concurrent `up`s agree on one secret
            fd = os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return self.secret_file.read_text().strip()
        with os.fdopen(fd, "w") as f:
            f.write(secret + "\n")
        return secret

    def signing_key(self, create: bool = True) -> str | None:
        """The local issuer's private key (PEM), created with its JWKS on first use."""
        try:
            pem = self.signing_key_file.read_text()
            if not self.jwks_file.exists():
                self._write_jwks(pem)
            return pem
        except FileNotFoundError:
            if not create:
                return None
        from lambdas.core.identity.jwt_keys import new_signing_key

        self.ensure()
        pem, _ = new_signing_key()
        try:  # O_EXCL: two concurrent `up`s agree on one key
            fd = os.open(self.signing_key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return self.signing_key(create=False)
        with os.fdopen(fd, "w") as f:
            f.write(pem)
        self._write_jwks(pem)
        return pem

    def _write_jwks(self, pem: str) -> None:
        from lambdas.core.identity.jwt_keys import public_jwks

        tmp = self.jwks_file.with_name(f".jwks.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(public_jwks(pem), indent=2) + "\n")
        os.replace(tmp, self.jwks_file)

    def read_runtime(self) -> dict:
        try:
            return json.loads(self.runtime_file.read_text())
        except (OSError, ValueError):
            return {}

    def write_runtime(self, record: dict) -> None:
        write_private(self.runtime_file, json.dumps(record, indent=2) + "\n")

    def write_client_config(self, service_url: str, token: str) -> None:
        """`$SKYFN_HOME/config.json` for the SDK and endpoint agents; other keys are kept."""
        try:
            config = json.loads(self.client_config.read_text())
            if not isinstance(config, dict):
                config = {}
        except (OSError, ValueError):
            config = {}
        config.update(service_url=service_url, token=token)
        write_private(self.client_config, json.dumps(config, indent=2) + "\n")
