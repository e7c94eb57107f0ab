"""The AWS app's archival path is sized for at least 10,000 tasks/s (issue 24): the history
rule's schedule and drainers, their inputs, the history function's timeout, memory,
reserved concurrency and batch settings, the history table's keys, TTL and billing, and the
capacity arithmetic of docs/deploy.md ("Archival capacity") computed from what the
templates deploy and the measured batch time in infra/aws/sizing.py."""
from __future__ import annotations

import json
import re

import pytest
from aws_cdk.assertions import Match

from infra.aws import sizing
from infra.aws.config import EVENTBRIDGE_MAX_TARGETS, DeployConfig

DRAINERS = DeployConfig.history_drainers  # the default deployment (the `synth` fixture)


def _history_rule(template: dict) -> dict:
    (rule,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Events::Rule"
               and all("HistoryFunction" in json.dumps(t["Arn"]) for t in r["Properties"]["Targets"])]
    return rule


def _history_function(template: dict, prefix: str = "skyfn-ci") -> dict:
    (fn,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"
             and r["Properties"].get("FunctionName") == f"{prefix}-history"]
    return fn


def _period_s(expression: str) -> int:
    m = re.fullmatch(r"rate\((\d+) (minute|minutes|hour|hours)\)", expression)
    assert m, expression
    return int(m.group(1)) * (60 if m.group(2).startswith("minute") else 3600)


@pytest.fixture(scope="module")
def svc(synth):
    return synth["raw"]["service"]


# --- what is deployed ---------------------------------------------------------------------------
def test_history_rule_starts_the_drainers_every_minute(synth):
    targets = [Match.object_like({
        "Id": f"Target{i}", "Input": json.dumps({"drainer": i}, separators=(",", ":")),
        "Arn": {"Fn::GetAtt": [Match.string_like_regexp("^HistoryFunction"), "Arn"]},
        "DeadLetterConfig": Match.any_value(),
        "RetryPolicy": {"MaximumRetryAttempts": 2, "MaximumEventAgeInSeconds": 300}}) for i in range(DRAINERS)]
    synth["templates"]["service"].has_resource_properties("AWS::Events::Rule", {
        "ScheduleExpression": "rate(1 minute)", "State": "ENABLED", "Targets": targets})  # exactly DRAINERS targets


def test_history_rule_inputs_name_each_drainer_once(svc):
    rule = _history_rule(svc)
    assert 1 <= len(rule["Targets"]) == DRAINERS == sizing.DEFAULT_DRAINERS <= EVENTBRIDGE_MAX_TARGETS
    assert sorted(json.loads(t["Input"])["drainer"] for t in rule["Targets"]) == list(range(DRAINERS))
    assert len({t["Id"] for t in rule["Targets"]}) == DRAINERS
    assert _period_s(rule["ScheduleExpression"]) == sizing.SCHEDULE_PERIOD_S == 60


def test_history_function_timeout_memory_concurrency_and_batch(synth):
    synth["templates"]["service"].has_resource_properties("AWS::Lambda::Function", {
        "FunctionName": "skyfn-ci-history", "Handler": "lambdas.history.handler",
        "Timeout": 60, "MemorySize": 1024, "ReservedConcurrentExecutions": 2 * DRAINERS,
        "Environment": {"Variables": Match.object_like({
            "SKYFN_HISTORY_BATCH": "2000", "SKYFN_HISTORY_DRAIN_MARGIN_S": "5",
            "SKYFN_TABLE_PREFIX": "skyfn-ci"})}})


def test_history_table_keys_ttl_billing(synth):
    synth["templates"]["data"].has_resource_properties("AWS::DynamoDB::Table", {
        "TableName": "skyfn-ci-history",
        "KeySchema": [{"AttributeName": "k", "KeyType": "HASH"}, {"AttributeName": "s", "KeyType": "RANGE"}],
        "AttributeDefinitions": [{"AttributeName": "k", "AttributeType": "S"},
                                 {"AttributeName": "s", "AttributeType": "S"}],
        "BillingMode": "PAY_PER_REQUEST", "GlobalSecondaryIndexes": Match.absent(),
        "ProvisionedThroughput": Match.absent(),
        "TimeToLiveSpecification": {"AttributeName": "expires_at", "Enabled": True},
        "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
        "SSESpecification": Match.object_like({"SSEEnabled": True, "SSEType": "KMS"})})
    tables = [r["Properties"]["TableName"] for r in synth["raw"]["data"]["Resources"].values()
              if r["Type"] == "AWS::DynamoDB::Table"]
    assert "skyfn-ci-tasks" not in tables  # replaced by the history pages


# --- the arithmetic, from the template -------------------------------------------------------------
def test_drain_capacity_is_at_least_10000_tasks_per_second_with_a_safety_factor_of_2(svc):
    """capacity = drainers x batch / seconds_per_batch x (timeout - margin) / period, with every
    term but the measured batch time read from the synthesized template."""
    rule, fn = _history_rule(svc), _history_function(svc)
    env = fn["Environment"]["Variables"]
    drainers, period = len(rule["Targets"]), _period_s(rule["ScheduleExpression"])
    batch, margin, timeout = int(env["SKYFN_HISTORY_BATCH"]), float(env["SKYFN_HISTORY_DRAIN_MARGIN_S"]), fn["Timeout"]
    assert batch == sizing.HISTORY_BATCH  # the batch whose time SECONDS_PER_BATCH measures
    duty = (timeout - margin) / period
    assert 0 < duty <= 1 and duty == sizing.duty_cycle()
    capacity = drainers * batch / sizing.SECONDS_PER_BATCH * duty
    assert capacity == pytest.approx(sizing.drain_capacity(drainers))
    assert capacity >= sizing.SAFETY_FACTOR * sizing.TARGET_TASKS_PER_S, (
        f"{drainers} drainers x {batch} / {sizing.SECONDS_PER_BATCH} s x {duty:.3f} = {capacity:,.0f} tasks/s; "
        f"need {sizing.SAFETY_FACTOR} x {sizing.TARGET_TASKS_PER_S:,}: more drainers (at most "
        f"{EVENTBRIDGE_MAX_TARGETS}) or a batch no slower than {sizing.max_seconds_per_batch():.3f} s")
    assert sizing.SECONDS_PER_BATCH <= sizing.max_seconds_per_batch(drainers)


def test_drainers_are_never_throttled_and_the_last_batch_fits_the_margin(svc):
    rule, fn = _history_rule(svc), _history_function(svc)
    drainers = len(rule["Targets"])
    # every drainer of a minute runs, and a late one overlapping the next minute's too
    assert fn["ReservedConcurrentExecutions"] >= 2 * drainers
    # a drainer takes a batch only with more than the margin left: a batch twice as slow as
    # measured still ends before the timeout
    assert float(fn["Environment"]["Variables"]["SKYFN_HISTORY_DRAIN_MARGIN_S"]) >= \
        sizing.SAFETY_FACTOR * sizing.SECONDS_PER_BATCH
    # one minute's drainers have returned by the next tick (the timeout is not longer than the period)
    assert fn["Timeout"] <= _period_s(rule["ScheduleExpression"])


def test_dynamodb_takes_the_target_rate_on_demand_and_per_partition():
    """At 10,000 tasks/s of one owner (the worst case: every page lands under one owner's
    partition key of that second of ids) the pages need less than DynamoDB's 1,000 WCU/s
    per partition, and the whole table less than a new on-demand table serves at once."""
    per_page = min(sizing.HISTORY_BATCH, sizing.PAGE_TASKS)
    wcu_per_task = sizing.write_units_per_task(per_page)
    one_owner = sizing.TARGET_TASKS_PER_S * sizing.page_write_units(per_page) / per_page
    assert one_owner < sizing.PARTITION_WCU_PER_S, f"{one_owner:.0f} WCU/s on one partition key"
    assert sizing.TARGET_TASKS_PER_S * wcu_per_task < sizing.ON_DEMAND_INITIAL_WCU_PER_S
    assert wcu_per_task < 0.2  # was 2 per task (item + GSI)


# --- the number of drainers follows the configuration ----------------------------------------------------
def test_drainers_follow_the_context(synth_five_drainers):
    svc = synth_five_drainers["raw"]["service"]
    rule, fn = _history_rule(svc), _history_function(svc, "skyfn-test5")
    assert [json.loads(t["Input"]) for t in rule["Targets"]] == [{"drainer": i} for i in range(5)]
    assert fn["ReservedConcurrentExecutions"] == 10
    assert sizing.drain_capacity(5) > sizing.drain_capacity(DRAINERS)
