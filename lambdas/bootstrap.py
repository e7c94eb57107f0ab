"""Creates what the service needs (DynamoDB tables, the results queue); idempotent.
In AWS the CDK stacks create these; the embedded runtime calls ensure_resources()."""
from __future__ import annotations

from lambdas.core import deps


def ensure_resources() -> None:
    deps.dynamo().ensure_tables()
    deps.results_queue()
