"""benchmarks/cost.py: the pieces of the cost model that follow the code (SQS batching
and 64 KiB billing, packing, the fan-out ASL walk) and the use of the CDK app's config."""
from __future__ import annotations

import json
import math

from benchmarks import cost
from infra.aws.config import FUNCTIONS
from skyfn.protocol.messages import PACK_MAX_TASKS


def test_sqs_billing_follows_the_adapters_batching():
    assert cost.sqs_requests([]) == 0
    assert cost.sqs_requests([100]) == 1
    assert cost.sqs_requests([100] * 10) == 1 and cost.sqs_requests([100] * 11) == 2   # 10 per call
    assert cost.sqs_requests([64 * 1024 + 1]) == 2                                     # 64 KiB chunks
    assert cost.sqs_requests([200 * 1024, 200 * 1024]) == 2 * math.ceil(200 / 64)      # 256 KiB per call


def test_task_packs_respect_the_pack_limits():
    a = cost.ASSUMPTIONS
    packs = cost.task_packs(1000, a)
    per_pack = (packs[0] - a.function_bytes) // a.task_bytes
    assert per_pack <= PACK_MAX_TASKS and sum((p - a.function_bytes) // a.task_bytes for p in packs) == 1000
    assert cost.task_packs(1, a) == [a.function_bytes + a.task_bytes]


def test_fanout_transitions_walk_the_asl():
    base = cost.fanout_transitions(chunks=0, polls=0)
    per_chunk = cost.fanout_transitions(chunks=1, polls=0) - base
    per_poll = cost.fanout_transitions(chunks=0, polls=1) - base
    assert base >= 3 and per_chunk >= 1 and per_poll >= 2
    assert cost.fanout_transitions(10, 5) == base + 10 * per_chunk + 5 * per_poll


def test_batching_is_cheaper_and_lambda_cost_follows_the_configured_memory(monkeypatch):
    prices = cost.load_prices()
    single = cost.scenario(100_000, 1, prices)
    batch = cost.scenario(100_000, 1_000, prices)
    assert 0 < batch["total"] < single["total"]
    assert single["step_functions"] == 0 and cost.scenario(100_000, 10_000, prices)["step_functions"] > 0
    doubled = {k: v.__class__(**{**v.__dict__, "memory_mb": v.memory_mb * 2}) for k, v in FUNCTIONS.items()}
    monkeypatch.setattr(cost, "FUNCTIONS", doubled)
    assert cost.scenario(100_000, 1, prices)["lambda_api"] > 1.5 * single["lambda_api"]  # GB-s double; requests do not


def test_cli_prints_a_table_and_json_last(capsys):
    assert cost.main(["--json", "--tasks", "1000"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    data = json.loads(lines[-1])
    assert set(data["scenarios"]) == {"single", "batch", "fanout"} and data["tasks"] == 1000
    assert data["lambda_memory_mb"]["api"] == FUNCTIONS["api"].memory_mb
    assert any(line.startswith("total") for line in lines)
