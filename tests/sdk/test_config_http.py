"""Client configuration and the HTTP transport: errors surfaced, retries idempotent."""
from __future__ import annotations

import json
import os

import pytest

from skyfn import Client, ConfigError, SkyfnAPIError, SkyfnConnectionError
from skyfn.config import load_config, write_config
from skyfn.protocol.serialize import pack_args

from . import funcs


def test_missing_config_is_a_clear_error(skyfn_home):
    with pytest.raises(ConfigError) as info:
        Client()
    msg = str(info.value)
    assert "skyfn local up" in msg and "SKYFN_SERVICE_URL" in msg and "SKYFN_TOKEN" in msg
    assert str(skyfn_home / "config.json") in msg


def test_config_file_env_and_arguments_precedence(skyfn_home, monkeypatch):
    path = write_config("http://file:1/", "file-token", home=skyfn_home)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert json.loads(path.read_text()) == {"service_url": "http://file:1", "token": "file-token"}
    cfg = load_config()
    assert (cfg.service_url, cfg.token) == ("http://file:1", "file-token")
    assert "file-token" not in repr(cfg)
    monkeypatch.setenv("SKYFN_SERVICE_URL", "http://env:2")
    monkeypatch.setenv("SKYFN_TOKEN", "env-token")
    cfg = load_config()
    assert (cfg.service_url, cfg.token, cfg.source) == ("http://env:2", "env-token", "environment")
    cfg = load_config(service_url="http://arg:3", token="arg-token")
    assert (cfg.service_url, cfg.token, cfg.source) == ("http://arg:3", "arg-token", "argument")


def test_token_missing_and_bad_file(skyfn_home, monkeypatch):
    monkeypatch.setenv("SKYFN_SERVICE_URL", "http://env:2")
    with pytest.raises(ConfigError, match="token"):
        load_config()
    skyfn_home.mkdir(parents=True)
    (skyfn_home / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config()
    with pytest.raises(ConfigError, match="http://"):
        load_config(service_url="ftp://x", token="t")


def test_4xx_message_is_surfaced(client, service):
    with pytest.raises(SkyfnAPIError) as info:
        client.run("no-such-function", 1, endpoint_id=service.local_endpoint)
    err = info.value
    assert err.status == 400 and err.code == "invalid_request"
    assert "unknown function no-such-function" in err.message and "unknown function" in str(err)
    assert service.count("POST", "/tasks") == 1  # 4xx is never retried


def test_bad_token_is_401(service):
    c = Client(service_url=service.url, token="wrong")
    with pytest.raises(SkyfnAPIError) as info:
        c.list_endpoints()
    assert info.value.status == 401 and "bearer token" in info.value.message


def test_validation_error_from_models_surfaced(client, service):
    fid = client.register_function(funcs.add)
    with pytest.raises(SkyfnAPIError) as info:
        client._http.post("/tasks", {"tasks": [], "endpoint_id": service.local_endpoint})
    assert info.value.status == 400 and "tasks" in info.value.message
    assert fid


@pytest.mark.parametrize("action", ["drop_after", "503_after", "drop_before", "503_before"])
def test_submission_retried_with_same_idempotency_key(client, service, action):
    fid = client.register_function(funcs.add)
    service.inject("POST", "/tasks", action)
    batch = client.create_batch(endpoint_id=service.local_endpoint)
    for i in range(5):
        batch.add(fid, i, 1)
    ids = client.batch_run(batch)
    assert service.count("POST", "/tasks") == 2
    # exactly one set of tasks exists, and the ids returned are those of that set
    assert sorted(ids) == sorted(service.tasks)
    assert len(service.submissions) == 1
    assert [client.get_result(t, timeout=5) for t in ids] == [1, 2, 3, 4, 5]


def test_status_and_get_retried(client, service):
    fid = client.register_function(funcs.add)
    tid = client.run(fid, 2, 3, endpoint_id=service.local_endpoint)
    service.inject("POST", "/tasks/status", "drop_before")
    service.inject("POST", "/tasks/status", "503_before")
    service.inject("GET", f"/tasks/{tid}", "drop_before")
    assert client.get_result(tid, timeout=5) == 5
    assert client.get_task(tid)["state"] == "SUCCEEDED"


def test_unreachable_service_gives_up(skyfn_home):
    from infra.local.processes import free_port

    c = Client(service_url=f"http://127.0.0.1:{free_port()}", token="t", retries=2, backoff=0.01)
    with pytest.raises(SkyfnConnectionError, match="cannot reach the skyfn service"):
        c.list_endpoints()


def test_default_client_rides_out_an_outage_longer_than_a_retry_count(service, skyfn_home):
    """Twenty dropped connections and 503s in a row (a service restarting) cost a default
    client time, not the call: transient failures are retried for up to retry_seconds."""
    service.inject("POST", "/tasks", "drop_after", times=10)
    service.inject("POST", "/tasks", "503_before", times=10)
    c = Client(service_url=service.url, token=service.token, backoff=0.001, retry_seconds=60)
    fid = c.register_function(len)
    ids = c.submit_tasks([{"function_id": fid, "payload": pack_args(([1, 2],), {})}], service.local_endpoint)
    assert len(ids) == 1 and len(service.tasks) == 1  # ten processed attempts, one task (same key)
    c.close()


def test_retry_seconds_bounds_the_wait_for_an_unreachable_service(skyfn_home):
    from infra.local.processes import free_port

    c = Client(service_url=f"http://127.0.0.1:{free_port()}", token="t", backoff=0.01, retry_seconds=0.5)
    with pytest.raises(SkyfnConnectionError, match="cannot reach the skyfn service"):
        c.list_endpoints()


def test_transport_reads_proxies_and_ca_bundle_from_the_environment_once(monkeypatch, tmp_path):
    """requests' environment rules, applied when the client is made."""
    import urllib3

    from skyfn.http import connection_pool

    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "example.org")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    proxied = connection_pool("https://svc.example.com", 4)
    assert isinstance(proxied, urllib3.ProxyManager) and proxied.proxy.port == 9
    assert proxied.connection_pool_kw["ca_certs"] == str(bundle)
    direct = connection_pool("https://example.org", 4)
    assert type(direct) is urllib3.PoolManager
    assert type(connection_pool("http://127.0.0.1:1", 4)) is urllib3.PoolManager
