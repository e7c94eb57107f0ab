"""The embedded runtime's rendezvous server: what the AWS app's ECS rendezvous service is in
a deployment (for direct sessions that reach an agent through it, docs/direct-from-a-laptop.md,
and the communicator's groups).

The service process runs it on a thread of its own, on 127.0.0.1, with a secret kept in
the runtime's state (`rendezvous.secret`, 0600, made once), and hands the handlers
SKYFN_RENDEZVOUS_ADDRESS and SKYFN_RENDEZVOUS_SECRET. Where the environment already names a
rendezvous server (both variables set), that one is used and none is started.
"""
from __future__ import annotations

import os
import secrets

ADDRESS_ENV, SECRET_ENV = "SKYFN_RENDEZVOUS_ADDRESS", "SKYFN_RENDEZVOUS_SECRET"
_running = None  # this process's server (a ThreadHandle), once started


def secret_of(state) -> str:
    path = state.root / "rendezvous.secret"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    state.ensure()
    try:  # O_EXCL: two concurrent starts agree on one secret
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    secret = secrets.token_hex(32)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret


def local_rendezvous(state) -> dict[str, str]:
    """The handlers' rendezvous settings: the environment's, else this process's own server
    (started on first call)."""
    global _running
    if os.environ.get(ADDRESS_ENV) and os.environ.get(SECRET_ENV):
        return {ADDRESS_ENV: os.environ[ADDRESS_ENV], SECRET_ENV: os.environ[SECRET_ENV]}
    secret = secret_of(state)
    if _running is None:
        from rendezvous.runner import serve_in_thread

        _running = serve_in_thread("127.0.0.1", 0, secret)
    return {ADDRESS_ENV: _running.address, SECRET_ENV: secret}
