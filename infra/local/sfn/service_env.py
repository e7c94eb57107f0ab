"""Deploys the Step Functions state machines into the embedded runtime's moto (served by
infra.local.sfn.moto_bridge, so their Lambda steps run our handlers) and gives the API
handler the settings it needs to start them. Called by the service process after
ensure_resources(), before the gateway starts its handler environments (they inherit
this process's environment)."""
from __future__ import annotations

import os

# The step handlers get the service's settings, never the API's token-signing secret.
_NOT_FOR_STEPS = {"SKYFN_AUTH_SECRET"}


def step_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k.startswith(("SKYFN_", "POWERTOOLS_", "AWS_")) and k not in _NOT_FOR_STEPS
            or k == "PYTHONWARNINGS"}


def deploy_state_machines(aws_endpoint: str | None = None) -> dict[str, str]:
    """Deploy (idempotent) and export the API's run settings into os.environ."""
    from infra.local.sfn.deploy import api_env, deploy

    dep = deploy(step_env(), prefix=os.environ.get("SKYFN_TABLE_PREFIX", "skyfn"),
                 bucket=os.environ.get("SKYFN_BUCKET", "skyfn-payloads"),
                 endpoint_url=aws_endpoint or os.environ.get("AWS_ENDPOINT_URL"),
                 region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
    env = api_env(dep)
    os.environ.update(env)
    return env
