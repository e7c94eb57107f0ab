"""Deploys the Step Functions state machines into the embedded runtime's moto (served by
infra.local.standins.sfn.moto_bridge, so their Lambda steps run our handlers) and gives the API
handler the settings it needs to start them. The service process announces them first
(announce_state_machines: the ARNs follow from the names and the account), so the gateway's
handler environments, which inherit this process's environment, start while the tables and
the state machines are deployed (deploy_state_machines checks it made what was announced)."""
from __future__ import annotations

import os

# The step handlers get the service's settings, never the API's token-signing secret.
_NOT_FOR_STEPS = {"SKYFN_AUTH_SECRET"}


def step_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k.startswith(("SKYFN_", "POWERTOOLS_", "AWS_")) and k not in _NOT_FOR_STEPS
            or k == "PYTHONWARNINGS"}


def _names() -> dict[str, str]:
    return {"prefix": os.environ.get("SKYFN_TABLE_PREFIX", "skyfn"),
            "bucket": os.environ.get("SKYFN_BUCKET", "skyfn-payloads"),
            "region": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}


def deploy_state_machines(aws_endpoint: str | None = None, planned: dict[str, str] | None = None) -> dict[str, str]:
    """Deploy (idempotent) and export the API's run settings into os.environ. `planned`: the
    settings announce_state_machines exported already; the deployment must match them."""
    from infra.local.standins.sfn.deploy import api_env, check, deploy

    names = _names()
    dep = deploy(step_env(), prefix=names["prefix"], bucket=names["bucket"],
                 endpoint_url=aws_endpoint or os.environ.get("AWS_ENDPOINT_URL"), region=names["region"])
    env = api_env(dep)
    if planned is not None:
        check(dep, _plan(planned["account"]))  # os.environ has them: no change while environments start
    else:
        os.environ.update(env)
    return env


def _plan(account: str):
    from infra.local.standins.sfn.deploy import planned

    return planned(account=account, **_names())


def announce_state_machines(aws_endpoint: str | None = None, account: str | None = None) -> dict[str, str]:
    """Export the API's run settings of the state machines deploy_state_machines is about to
    deploy, named in advance from the `account` they go to (when not given: the caller's,
    from STS GetCallerIdentity), so the API's environments can start while they are
    deployed. Returns them, with "account"."""
    from infra.local.standins.sfn.deploy import api_env

    if account is None:
        import boto3

        sts = boto3.client("sts", region_name=_names()["region"],
                           endpoint_url=aws_endpoint or os.environ.get("AWS_ENDPOINT_URL"))
        account = sts.get_caller_identity()["Account"]
    env = api_env(_plan(account))
    os.environ.update(env)
    return {**env, "account": account}
