"""The AWS price table and the billing rules every cost model of benchmarks/ shares: the
table's loading (benchmarks/aws_prices.yaml: dated, its sources named) and Lambda's
per-invocation and per-GB-second billing. benchmarks/cost.py (tasks) and
benchmarks/cost_idle.py (the idle fleet) price with these."""
from __future__ import annotations

import math
from pathlib import Path

import yaml

PRICES = Path(__file__).with_name("aws_prices.yaml")
HOURS_PER_MONTH = 730
SECONDS_PER_MONTH = HOURS_PER_MONTH * 3600
GB = 1024 ** 3


def load_prices(path: Path = PRICES) -> dict:
    data = yaml.safe_load(path.read_text())
    for key in ("date", "region", "prices", "sources"):
        if key not in data:
            raise SystemExit(f"{path}: missing '{key}'")
    return data


def lambda_cost(invocations: float, ms_each: float, memory_mb: int, p: dict) -> float:
    """USD of `invocations` of `ms_each` (billed per started millisecond) at `memory_mb`."""
    gb_s = invocations * math.ceil(ms_each) / 1000 * memory_mb / 1024
    return gb_s * p["lambda_arm64_per_gb_second"] + invocations / 1e6 * p["lambda_requests_per_million"]
