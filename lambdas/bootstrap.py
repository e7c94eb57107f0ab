"""Creates what the service needs (DynamoDB tables, the results queue); idempotent.
In AWS the CDK stacks create these; the embedded runtime calls ensure_resources()."""
from __future__ import annotations

from lambdas.config import settings
from lambdas.core import deps


def ensure_resources() -> None:
    deps.dynamo().ensure_tables()
    deps.results_queue()
    if settings().queue_kind == "redis":
        from lambdas.core.identity.agent_keys import refresh_queue_logins

        refresh_queue_logins()  # queue logins an older service made get today's rules
