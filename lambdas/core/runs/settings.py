"""Settings of the runs (batches, flows, SPMD groups) and the rendezvous server, read once from the environment (the names are
listed in stepfunctions/catalog.py: API_ENV and each step's env)."""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from lambdas.core.errors import Unavailable


@dataclass(frozen=True)
class RunSettings:
    bucket: str
    batch_fanout_arn: str
    spmd_group_arn: str
    run_task_arn: str
    flow_role_arn: str
    machine_prefix: str
    rendezvous_address: str
    rendezvous_secret: str

    def need(self, attr: str, what: str) -> str:
        value = getattr(self, attr)
        if not value:
            raise Unavailable(f"{what} is not deployed here ({attr.upper()} is unset): deploy the workflows "
                              "(`cdk deploy`, or `skyfn local up`, which deploys them to its moto)")
        return value


@functools.lru_cache(maxsize=1)
def run_settings() -> RunSettings:
    e = os.environ.get
    return RunSettings(
        bucket=e("SKYFN_BUCKET", ""),
        batch_fanout_arn=e("SKYFN_BATCH_FANOUT_ARN", ""),
        spmd_group_arn=e("SKYFN_SPMD_GROUP_ARN", ""),
        run_task_arn=e("SKYFN_RUN_TASK_FUNCTION_ARN", ""),
        flow_role_arn=e("SKYFN_FLOW_ROLE_ARN", ""),
        machine_prefix=e("SKYFN_STATE_MACHINE_PREFIX", e("SKYFN_TABLE_PREFIX", "skyfn")),
        rendezvous_address=e("SKYFN_RENDEZVOUS_ADDRESS", ""),
        rendezvous_secret=e("SKYFN_RENDEZVOUS_SECRET", ""),
    )
