"""Runs' records (lambdas/core/runs/runs.py): every Step Functions execution the service
starts for a user, under its id with its owner.

  run:<id>   hash: o owner, k kind, x execution ARN, c created
"""
from __future__ import annotations

from typing import Any


class RunStore:
    def __init__(self, client: Any):
        self.r = client

    def create(self, run_id: str, owner: str, kind: str, created: float, ttl: int) -> None:
        self.r.hset(f"run:{run_id}", mapping={"o": owner, "k": kind, "c": f"{created:.6f}"})
        self.r.expire(f"run:{run_id}", ttl)

    def started(self, run_id: str, execution_arn: str) -> None:
        self.r.hset(f"run:{run_id}", "x", execution_arn)

    def record(self, run_id: str) -> dict[str, str]:
        """The run's record ({} when there is none)."""
        return {k.decode(): v.decode() for k, v in self.r.hgetall(f"run:{run_id}").items()}
