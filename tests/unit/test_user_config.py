"""The rules of a submission's user_config (skyfn/protocol/user_config.py), which the service
(400) and the SDK (ValueError before sending) apply with the same message."""
from __future__ import annotations

import pytest

from skyfn.protocol.user_config import MAX_USER_CONFIG_BYTES, MAX_USER_CONFIG_DEPTH, problem


def nested(levels: int, leaf=None):
    value = leaf if leaf is not None else {}
    for _ in range(levels - 1):
        value = {"k": value}
    return value


@pytest.mark.parametrize("config", [
    {}, {"account": "p1", "cores": 4, "gpu": True, "mods": ["a", "b"], "x": None, "f": 1.5},
    nested(MAX_USER_CONFIG_DEPTH), {"s": "é" * ((MAX_USER_CONFIG_BYTES - 8) // 2)},
])
def test_valid_user_configs(config):
    assert problem(config) is None


@pytest.mark.parametrize("config,words", [
    (None, "not null"), ([], "not an array"), ("x", "not a string"), (3, "not a number"), (True, "not a boolean"),
    (nested(MAX_USER_CONFIG_DEPTH + 1), f"deeper than {MAX_USER_CONFIG_DEPTH}"),
    (nested(MAX_USER_CONFIG_DEPTH, leaf=[[]]), f"deeper than {MAX_USER_CONFIG_DEPTH}"),  # lists count too
    ({"s": "é" * (MAX_USER_CONFIG_BYTES // 2)}, "bytes encoded, over the limit"),  # UTF-8 bytes, not characters
    ({1: "a"}, "keys must be strings"), ({"n": float("nan")}, "JSON data"), ({"s": {1, 2}}, "JSON data"),
])
def test_invalid_user_configs_name_the_problem(config, words):
    why = problem(config)
    assert why is not None and words in why and why.startswith("user_config")


def test_a_hostile_depth_is_bounded():
    value: list = []
    for _ in range(100_000):  # far past any recursion limit
        value = [value]
    assert "deeper than" in problem({"v": value})
