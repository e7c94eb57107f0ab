"""infra/aws/config.py: context validation (no CDK needed, runs in every virtualenv)."""
from __future__ import annotations

import pytest

from infra.aws.config import FUNCTIONS, ConfigError, DeployConfig


def test_defaults_and_cli_environment():
    c = DeployConfig.from_context({}, {"CDK_DEFAULT_REGION": "eu-central-1", "CDK_DEFAULT_ACCOUNT": "123456789012"})
    assert (c.stage, c.region, c.account, c.auth, c.prefix) == ("dev", "eu-central-1", "123456789012", "cognito",
                                                                "skyfn-dev")
    assert not c.retain_data and DeployConfig(stage="prod").retain_data
    assert c.stack_name("service") == "Skyfn-dev-service"


def test_context_values_are_parsed():
    c = DeployConfig.from_context({"stage": "prod", "region": "us-west-2", "auth": "globus",
                                   "globus_audience": "abc", "nat_gateways": "2", "alarm_email": "ops@lab.org"})
    assert (c.auth, c.globus_issuer, c.globus_audience, c.nat_gateways, c.alarm_email) == (
        "globus", "https://auth.globus.org", "abc", 2, "ops@lab.org")


@pytest.mark.parametrize("ctx, message", [
    ({"stage": "Prod!"}, "context stage='Prod!'"),
    ({"region": "mars-1"}, "is not an AWS region"),
    ({"account": "12"}, "12-digit"),
    ({"auth": "ldap"}, "allowed values are cognito, globus"),
    ({"auth": "globus"}, "-c globus_audience=<client id>"),
    ({"auth": "globus", "globus_audience": "a", "globus_issuer": "http://x"}, "https://"),
    ({"nat_gateways": "three"}, "nat_gateways='three' is not an integer"),
    ({"nat_gateways": 5}, "out of range"),
    ({"alarm_email": "nobody"}, "not an email"),
    ({"redis_node_type": "r7g.large"}, "ElastiCache node type"),
    ({"history_drainers": "6"}, "at most 5; pass -c history_drainers=<1..5>"),  # EventBridge: 5 targets a rule
    ({"history_drainers": 0}, "history_drainers=0 is out of range"),
    ({"history_drainers": "four"}, "history_drainers='four' is not an integer"),
])
def test_bad_context_is_refused_with_the_fix(ctx, message):
    with pytest.raises(ConfigError, match=None) as info:
        DeployConfig.from_context(ctx, {})
    assert message in str(info.value)


def test_function_sizes_fit_lambda_limits():
    for spec in FUNCTIONS.values():
        assert 128 <= spec.memory_mb <= 10240 and 1 <= spec.timeout_s <= 900
    assert FUNCTIONS["api"].timeout_s <= 29  # API Gateway's integration timeout


def test_history_drainers_default_and_bounds():
    assert DeployConfig().history_drainers == DeployConfig.from_context({}, {}).history_drainers == 4
    assert DeployConfig.from_context({"history_drainers": "5"}, {}).history_drainers == 5
    with pytest.raises(ConfigError, match="at most 5 targets"):
        DeployConfig(history_drainers=6)
    history = FUNCTIONS["history"]
    assert history.timeout_s == 60 and history.memory_mb >= 1024  # zlib is CPU-bound: CPU scales with memory


def test_backlog_bounds_default_and_context():
    """The bounds of backpressure (SKYFN_BACKLOG_MAX, SKYFN_BACKLOG_MEMORY_FRACTION) and the
    HistoryBacklog alarm's threshold, half the bound."""
    c = DeployConfig.from_context({}, {})
    assert (c.backlog_max, c.backlog_memory_fraction, c.backlog_alarm_threshold) == (1_000_000, 0.8, 500_000)
    c = DeployConfig.from_context({"backlog_max": "200000", "backlog_memory_fraction": "0.7"}, {})
    assert (c.backlog_max, c.backlog_memory_fraction, c.backlog_alarm_threshold) == (200_000, 0.7, 100_000)
    with pytest.raises(ConfigError, match="backlog_max=10 is out of range"):
        DeployConfig.from_context({"backlog_max": "10"}, {})
    for bad in ("0", "1.5", "most"):
        with pytest.raises(ConfigError, match=f"backlog_memory_fraction='{bad}' is not a fraction"):
            DeployConfig.from_context({"backlog_memory_fraction": bad}, {})
