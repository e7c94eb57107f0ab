"""The endpoint's own credential, on the agent's side.

Registering with the owner's token (POST /endpoints) hands the agent its endpoint's
credential (skyfn.protocol.credentials). The agent keeps it in
`$SKYFN_HOME/endpoints/<name>/credential` (0600) and from then on speaks as the endpoint:
heartbeats carry it, and a later start needs no user token at all -- it connects with
the credential (POST /endpoints/<id>/connect) and logs in to its queues with it.
SKYFN_ENDPOINT_CREDENTIAL overrides the file (an operator hands the credential to a
login node without the owner's token ever being there). Never logged.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from skyfn.private_file import write_private
from skyfn.protocol.credentials import parse, with_secret

ENV = "SKYFN_ENDPOINT_CREDENTIAL"


def load(path: Path) -> Optional[str]:
    value = os.environ.get(ENV, "").strip()
    if not value:
        try:
            value = path.read_text().strip()
        except OSError:
            return None
    return value if parse(value) else None


def save(path: Path, credential: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(path, credential + "\n")


def forget(path: Path) -> None:
    path.unlink(missing_ok=True)


def endpoint_of(credential: str) -> str:
    parsed = parse(credential)
    if parsed is None:
        raise ValueError("not an endpoint credential")
    return parsed[0]


def complete(descriptor, credential: str, replace: bool = False):
    """A queue descriptor whose URL names the endpoint's Redis user, with the secret put in
    (`replace`: in place of the one it holds, after a rotation)."""
    return descriptor.model_copy(update={"url": with_secret(descriptor.url, credential, replace=replace)})


def use_aws_session(initial: dict, refresh) -> None:
    """SQS deployments: make the endpoint's session credentials (the agent role narrowed to
    this endpoint's queues) the process's default AWS credentials, refreshed through
    `refresh()` (POST /endpoints/<id>/connect again) before they expire."""
    import boto3
    import botocore.session
    from botocore.credentials import RefreshableCredentials

    def metadata(c: dict) -> dict:
        return {"access_key": c["access_key_id"], "secret_key": c["secret_access_key"],
                "token": c["session_token"], "expiry_time": c["expiration"]}

    creds = RefreshableCredentials.create_from_metadata(metadata(initial), lambda: metadata(refresh()),
                                                        "skyfn-endpoint-connect")
    session = botocore.session.get_session()
    session._credentials = creds  # botocore has no public setter for refreshable credentials
    boto3.setup_default_session(botocore_session=session)
