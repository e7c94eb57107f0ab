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


# --- the idle fleet (issue 39) -------------------------------------------------------------------
IDLE_ITEMS = {"api_gateway", "lambda_invocations", "lambda_gb_s", "sqs", "dynamodb", "elasticache_memory",
              "cloudwatch_logs", "total"}


def _unit_prices() -> dict:
    """A price table where every price is 1 (per million, per GB-s, per hour, per GB), so
    each item reads back as the quantity behind it."""
    p = cost.load_prices()
    flat = {k: ({n: 1.0 for n in v} if isinstance(v, dict) else 1.0) for k, v in p["prices"].items()}
    return {**p, "prices": flat}


def test_idle_requests_follow_the_agents_periods():
    from benchmarks import cost_idle
    from endpoint_agent.config import EndpointConfig

    r = cost_idle.idle_requests(EndpointConfig())
    assert r["heartbeats"] == 60 / EndpointConfig().heartbeat_period == 6.0
    assert r["task_receives"] == r["control_receives"] == 3.0    # receive_wait 20 s: three long-polls a minute each
    assert r["connects"] == pytest.approx(60 / 2700)            # 1 h sessions refreshed 15 min early
    assert set(r) == {"heartbeats", "task_receives", "control_receives", "connects"}  # nothing of the reaper's
    slow = cost_idle.idle_requests(EndpointConfig(receive_wait=20, heartbeat_period=30))
    assert slow["task_receives"] == slow["control_receives"] == 3.0 and slow["heartbeats"] == 2.0
    assert cost_idle.idle_requests(EndpointConfig(receive_wait=1.2))["task_receives"] == 30.0  # WaitTimeSeconds = ceil
    assert cost_idle.idle_requests(EndpointConfig(receive_wait=0))["control_receives"] == 60.0  # control waits >= 1 s


def test_idle_fleet_arithmetic_on_small_inputs():
    from benchmarks import cost_idle
    from benchmarks.aws_pricing import GB, SECONDS_PER_MONTH
    from endpoint_agent.config import EndpointConfig
    from infra.aws.config import DeployConfig

    prices = _unit_prices()
    a = cost_idle.IdleAssumptions(heartbeat_ms=10, connect_ms=100, authorizer_ms=20, log_bytes_per_request=1024)
    cfg = EndpointConfig(heartbeat_period=60, receive_wait=20)        # 1 heartbeat, 3 + 3 receives a minute
    minutes = SECONDS_PER_MONTH / 60
    n = 200
    out = cost_idle.idle_fleet(n, prices, cfg, DeployConfig(auth="cognito"), a, redis_bytes=1000)["usd_per_month"]
    beats, connects = n * minutes, n * minutes / 45
    assert out["api_gateway"] == pytest.approx((beats + connects) / 1e6, rel=1e-3)
    assert out["lambda_invocations"] == pytest.approx((beats + connects) / 1e6, rel=1e-3)
    gb_s = (beats * 10 + connects * 100) / 1000 * FUNCTIONS["api"].memory_mb / 1024
    assert out["lambda_gb_s"] == pytest.approx(gb_s, rel=1e-3)
    # SQS: 3 + 3 receives a minute each (a heartbeat reads no queue)
    assert out["sqs"] == pytest.approx(n * minutes * 6 / 1e6, rel=1e-3)
    assert out["dynamodb"] == 0
    d = DeployConfig()
    node = cost_idle.NODE_MEMORY_GIB[d.redis_node_type] * GB * 0.75
    assert out["elasticache_memory"] == pytest.approx(n * 1000 / node * (1 + d.redis_replicas) * 730, abs=1e-4)
    assert out["cloudwatch_logs"] == pytest.approx((beats + connects) * 1024 / GB, rel=1e-3)
    assert out["total"] == pytest.approx(sum(v for k, v in out.items() if k != "total"), abs=1e-3)
    globus = cost_idle.idle_fleet(n, prices, cfg, DeployConfig(auth="globus"), a, redis_bytes=1000)["usd_per_month"]
    auths = n * minutes / 5                                           # one per endpoint per 5-minute cache
    assert globus["lambda_invocations"] == pytest.approx((beats + connects + auths) / 1e6, rel=1e-3)


def test_idle_fleet_scales_with_the_endpoints_and_long_polls_cost_less():
    from benchmarks import cost_idle

    prices = cost.load_prices()
    one, ten = cost_idle.idle_fleet(1_000, prices), cost_idle.idle_fleet(10_000, prices)
    assert ten["usd_per_month"]["total"] == pytest.approx(10 * one["usd_per_month"]["total"], rel=1e-3)
    assert ten["rates"]["api_requests_per_s"] == pytest.approx(1_000 + 10_000 / 2700, rel=1e-3)
    s = cost_idle.idle_summary(prices)
    assert s["receive_wait_1"]["10000"] > ten["usd_per_month"]["total"]  # a 1 s long-poll costs more


def test_cli_json_names_every_idle_item_and_the_price_dates(capsys):
    assert cost.main(["--json", "--tasks", "1000"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out.strip().splitlines()[-1])
    idle = data["idle_fleet"]
    assert set(idle["fleets"]) == {"1000", "10000"}
    for fleet in idle["fleets"].values():
        assert set(fleet["usd_per_month"]) == IDLE_ITEMS and fleet["usd_per_month"]["total"] > 0
    prices = cost.load_prices()
    assert idle["prices_date"] == data["prices_date"] == prices["date"]
    assert set(idle["prices_added"]) <= set(prices["prices"])       # every added price is in the table ...
    assert all(v[:4].isdigit() for v in idle["prices_added"].values())  # ... with the day it was added
    assert "idle fleet" in out and prices["date"] in out


def test_fleet_limits_follow_the_deploy_config():
    from benchmarks import cost_idle
    from endpoint_agent.config import EndpointConfig
    from infra.aws.config import DeployConfig

    a = cost_idle.IdleAssumptions(heartbeat_ms=50)
    cfg = EndpointConfig(heartbeat_period=60)                           # a heartbeat a minute, a connect per 45 min
    per = (1 + 1 / 45) / 60
    lim = cost_idle.fleet_limits(100, cfg, DeployConfig(api_rate_limit=10, api_burst_limit=20), a)
    assert lim["api_rps"] == pytest.approx(100 * per, abs=0.05)
    assert lim["endpoints_at_stage_rate"] == math.floor(10 / per) == 586
    assert lim["lambda_reserved"] == 50 + 1 + 5 + 2 * DeployConfig().history_drainers   # results, reaper, ui, history
    assert lim["api_concurrency"] == pytest.approx(100 / 60 * 0.05, abs=0.05)
    assert lim["endpoints_at_lambda_concurrency"] == math.floor(lim["lambda_unreserved"] / (0.05 / 60))
    defaults = cost_idle.fleet_limits()
    assert defaults["endpoints_at_stage_rate"] < 10_000 < defaults["endpoints_at_account_rate"]  # docs/deploy.md


def test_deploy_doc_states_the_idle_fleet_figures_the_model_computes():
    """docs/deploy.md "A fleet's limits and its idle bill" quotes the model: keep them equal."""
    from pathlib import Path

    from benchmarks import cost_idle

    doc = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    s = cost_idle.idle_summary(cost.load_prices())
    for fleet in s["fleets"].values():
        assert f"{fleet['usd_per_month']['total']:,.2f}" in doc
    for total in s["receive_wait_1"].values():
        assert f"{total:,.2f}" in doc
    lim = s["limits"]
    for key in ("endpoints_at_stage_rate", "endpoints_at_account_rate", "endpoints_at_lambda_concurrency"):
        assert f"{lim[key]:,}" in doc
    assert f"{cost_idle.REDIS_BYTES_PER_IDLE_ENDPOINT:,} B" in doc and f"{lim['api_rps']:,}/s" in doc
