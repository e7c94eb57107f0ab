"""Endpoint configuration: defaults, the template, errors naming key, value and what is
allowed, and where the service URL and token come from."""
from __future__ import annotations

import json
import os

import pytest
import yaml

from endpoint_agent.config import ConfigError, EndpointConfig, load_config, parse_config, resolve_service, template, \
    write_template
from endpoint_agent.paths import EndpointPaths


def test_defaults():
    cfg = parse_config({})
    assert cfg.workers == len(os.sched_getaffinity(0))
    assert cfg.prefetch == max(256, 64 * cfg.workers)
    assert cfg.capacity == cfg.workers + cfg.prefetch
    assert (cfg.heartbeat_period, cfg.lease_seconds, cfg.grace_period) == (10.0, 60.0, 30.0)
    assert cfg.provider == "local" and not cfg.static_queues
    assert parse_config({"workers": 3, "prefetch": 0}).capacity == 3


def test_template_is_valid_and_documented(home):
    text = template("demo")
    parsed = parse_config(yaml.safe_load(text))
    # every key commented out is a default; the one section set is data: a new endpoint keeps
    # large arguments by reference in its own Redis (started when redis-server is installed)
    assert parsed.model_copy(update={"data": None}) == parse_config({})
    assert parsed.data.default == "redis" and parsed.data.redis.start == "auto" and not parsed.data.stores
    for key in ("service_url", "workers", "prefetch", "heartbeat_period", "lease_seconds", "receive_batch",
                "result_batch", "grace_period"):
        assert key in text
    paths = EndpointPaths("demo")
    write_template(paths)
    assert load_config(paths.config).workers >= 1
    with pytest.raises(FileExistsError):
        write_template(paths)
    write_template(paths, force=True)


@pytest.mark.parametrize("data, key, value, allowed", [
    ({"workers": "many"}, "workers", "'many'", "an integer from 1 to 4096"),
    ({"workers": 0}, "workers", "0", "an integer from 1 to 4096"),
    ({"provider": "slurmish"}, "provider", "'slurmish'", "one of: local"),
    ({"lease_seconds": -5}, "lease_seconds", "-5", "from 1 to 43200"),
    ({"log_level": "LOUD"}, "log_level", "'LOUD'", "DEBUG, INFO, WARNING, ERROR"),
    ({"service_url": "ftp://x"}, "service_url", "'ftp://x'", "http:// or https:// URL"),
    ({"task_queue": {"kind": "kafka", "name": "q", "url": "x"}, "results_queue": {"kind": "redis", "name": "r",
      "url": "redis://"}}, "task_queue.kind", "'kafka'", "kind: redis|sqs"),
])
def test_errors_name_key_value_and_allowed(data, key, value, allowed):
    with pytest.raises(ConfigError) as info:
        parse_config(data, "config.yaml")
    msg = str(info.value)
    assert f"key '{key}'" in msg and f"value {value}" in msg and allowed in msg, msg


def test_unknown_key_lists_allowed_keys():
    with pytest.raises(ConfigError) as info:
        parse_config({"wrokers": 2})
    msg = str(info.value)
    assert "unknown key 'wrokers'" in msg and "workers" in msg and "value 2" in msg


def test_an_obsolete_key_is_ignored_with_a_warning_naming_it(caplog):
    with caplog.at_level("WARNING", logger="skyfn.agent.config"):
        cfg = parse_config({"result_flush_ms": 5, "workers": 3})
    assert cfg.workers == 3 and "result_flush_ms" not in cfg.model_dump()
    assert "result_flush_ms is obsolete and ignored" in caplog.text and "remove it" in caplog.text


def test_bad_yaml_and_bad_shape(tmp_path):
    p = tmp_path / "config.yaml"
    p.write_text("workers: [1,\n")
    with pytest.raises(ConfigError, match="line"):
        load_config(p)
    p.write_text("- workers\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(p)
    with pytest.raises(ConfigError, match="configure"):
        load_config(tmp_path / "missing.yaml")


def test_service_from_yaml_env_or_client_config(home, monkeypatch):
    with pytest.raises(ConfigError, match="no service URL"):
        resolve_service(EndpointConfig())
    (home / "config.json").write_text(json.dumps({"service_url": "http://client:1/", "token": "tok-client"}))
    assert resolve_service(EndpointConfig()) == ("http://client:1", "tok-client")
    monkeypatch.setenv("SKYFN_SERVICE_URL", "http://env:2")
    monkeypatch.setenv("SKYFN_TOKEN", "tok-env")
    assert resolve_service(EndpointConfig()) == ("http://env:2", "tok-env")
    assert resolve_service(EndpointConfig(service_url="http://yaml:3", token="tok-yaml")) == ("http://yaml:3", "tok-yaml")
