"""Secrets into the environment at cold start, in the AWS deployment.

The CDK app never puts a secret value into a function's configuration (anyone allowed to
read the configuration would read the secret). It sets SKYFN_SECRET_ENV to a JSON object
mapping environment variable names to Secrets Manager secret ARNs, e.g.
`{"SKYFN_REDIS_PASSWORD": "arn:...", "SKYFN_RENDEZVOUS_SECRET": "arn:..."}`;
load() fetches each secret once and sets the variable, before any settings are read
(lambdas/__init__.py calls it on first import). Without SKYFN_SECRET_ENV nothing happens
and boto3 is not imported. Values are never logged.
"""
from __future__ import annotations

import json
import os
from typing import Any

VARIABLE = "SKYFN_SECRET_ENV"


class SecretEnvError(RuntimeError):
    """SKYFN_SECRET_ENV is malformed or a secret cannot be read; the message names which."""


def load(client: Any = None) -> list[str]:
    """Set each variable of SKYFN_SECRET_ENV from its secret; returns the names set.
    A variable already set (a developer's override) is left alone."""
    raw = os.environ.get(VARIABLE, "").strip()
    if not raw:
        return []
    try:
        mapping = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SecretEnvError(f"{VARIABLE} is not JSON ({exc.msg}): expected {{\"NAME\": \"<secret arn>\"}}") from None
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str) and v
                                                for k, v in mapping.items()):
        raise SecretEnvError(f"{VARIABLE} must map variable names to secret ARNs (strings)")
    todo = {name: arn for name, arn in mapping.items() if not os.environ.get(name)}
    if not todo:
        return []
    if client is None:
        import boto3

        client = boto3.client("secretsmanager")
    done = []
    for name, arn in todo.items():
        try:
            value = client.get_secret_value(SecretId=arn)["SecretString"]
        except Exception as exc:  # botocore errors: name the variable and secret, never a value
            raise SecretEnvError(f"cannot read the secret of {name} ({arn}): {type(exc).__name__}: {exc}") from None
        os.environ[name] = value
        done.append(name)
    return done
