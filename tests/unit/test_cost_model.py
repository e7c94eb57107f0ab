"""benchmarks/cost.py: the pieces of the cost model that follow the code (SQS batching
and 64 KiB billing, packing, the fan-out ASL walk) and the use of the CDK app's config."""
from __future__ import annotations

import json
import math

import pytest

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


# --- the durable history in pages (issue 24) ---------------------------------------------------
def test_history_pages_cost_a_share_of_a_page_instead_of_two_writes_per_task():
    from infra.aws import sizing

    prices = cost.load_prices()
    a = cost.ASSUMPTIONS
    per_page = cost.tasks_per_page(a)
    assert per_page == min(sizing.PAGE_TASKS, sizing.HISTORY_BATCH, int(a.throughput_tasks_per_s))
    page_units = math.ceil((sizing.PAGE_OVERHEAD_BYTES + per_page * a.history_page_bytes_per_task) / 1024)
    assert sizing.write_units_per_task(per_page) == (page_units + 1) / per_page  # + the page's marker
    _, after = cost.history_cost(100_000, 100, prices["prices"])
    _, before = cost.history_cost(100_000, 100, prices["prices"], archive="items")
    assert before == 2 * 100_000 + 100  # task item + owner-index entry, and the submission records
    assert after == 100_000 * (page_units + 1) / per_page + 100 and after < before / 10
    batch_after = cost.scenario(100_000, 1_000, prices)
    batch_before = cost.scenario(100_000, 1_000, prices, archive="items")
    assert batch_after["dynamodb"] < batch_before["dynamodb"] and batch_after["total"] < batch_before["total"]


def test_drainers_are_billed_for_their_busy_time():
    from dataclasses import replace

    prices = cost.load_prices()["prices"]
    a = cost.ASSUMPTIONS
    fast, _ = cost.history_cost(1_000_000, 1_000, prices, a)
    slow, _ = cost.history_cost(1_000_000, 1_000, prices, replace(a, history_seconds_per_batch=2 * a.history_seconds_per_batch))
    idle, _ = cost.history_cost(1_000_000, 1_000, prices, replace(a, history_seconds_per_batch=0.0))
    assert idle < fast < slow and (slow - idle) == pytest.approx(2 * (fast - idle), rel=0.05)
    assert cost.fixed_monthly(cost.load_prices())["history_drainers_idle"] > 0  # 4 invocations a minute, always


def test_sizing_follows_the_handlers_defaults(monkeypatch):
    """infra/aws/sizing.py restates what the handlers use; keep them equal."""
    from infra.aws import sizing
    from lambdas.adapters import history_pages
    from lambdas.config import settings

    assert sizing.PAGE_TASKS == history_pages.PAGE_TASKS
    for name in ("SKYFN_HISTORY_BATCH", "SKYFN_HISTORY_DRAIN_MARGIN_S"):
        monkeypatch.delenv(name, raising=False)
    settings.cache_clear()
    try:
        assert settings().history_batch == sizing.HISTORY_BATCH
        assert settings().history_drain_margin_s == sizing.HISTORY_DRAIN_MARGIN_S
    finally:
        settings.cache_clear()


def test_cli_reports_the_archive_before_and_after(capsys):
    assert cost.main(["--json", "--tasks", "1000000"]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    archive = data["archive"]
    for name in cost.SCENARIOS:
        assert archive["after"][name]["history"] < archive["before"][name]["history"]
        assert archive["after"][name]["total"] == data["scenarios"][name]["total"]
    assert archive["capacity"]["tasks_per_s"] >= 10_000 and archive["write_units_per_task"] < 2
