"""Security of the embedded runtime end to end (`skyfn local up` as a user starts it,
with every log at DEBUG and Powertools asked to log whole events):

- the endpoint agent speaks as its endpoint: its credential is kept 0600, it reconnects
  with it after a restart (no user token needed), and heartbeats keep it online;
- Redis refuses clients without the service's password; another endpoint's credential
  cannot read the local endpoint's queue while tasks flow through it;
- after a full flow (tasks that succeed, fail and are cancelled; refused tokens; shares;
  an agent restart), no token, credential, password or key appears in any log.
"""
from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
import redis
import requests
import yaml

DEBUG_ENV = {"POWERTOOLS_LOG_LEVEL": "DEBUG", "POWERTOOLS_LOGGER_LOG_EVENT": "true", "SKYFN_LOG_LEVEL": "DEBUG"}


def double(x):
    return 2 * x


def explode(msg):
    raise ValueError(msg)


def nap(seconds):
    import time

    time.sleep(seconds)
    return seconds


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    from infra.local import runtime

    home = tmp_path_factory.mktemp("skyfn-secure")
    cfg = home / "endpoints" / "local"
    cfg.mkdir(parents=True)
    (cfg / "config.yaml").write_text(yaml.safe_dump({"workers": 1, "lease_seconds": 4, "heartbeat_period": 1,
                                                     "grace_period": 3, "log_level": "DEBUG"}))
    saved = {k: os.environ.get(k) for k in [*DEBUG_ENV, "SKYFN_HOME"]}
    os.environ.update(DEBUG_ENV, SKYFN_HOME=str(home))
    runtime.up(home, detach=True, echo=lambda *_: None)
    yield home
    runtime.down(home, echo=lambda *_: None)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def client(home):
    from skyfn import Client

    with Client() as c:
        yield c


def _record(home: Path) -> dict:
    from infra.local.state import StateDir

    return StateDir.at(home).read_runtime()


def _wait_online(client, name="local", timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e["name"] == name and e["status"] == "online" for e in client.list_endpoints()):
            return
        time.sleep(0.2)
    raise AssertionError(f"endpoint {name} not online after {timeout} s")


def test_redis_needs_the_service_password(home):
    port = _record(home)["redis_port"]
    anonymous = redis.Redis(port=port)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.ping()
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(port=port, password="guess").ping()


def test_agent_speaks_as_its_endpoint_and_reconnects_with_its_credential(home, client):
    from infra.local import agent

    cred_file = home / "endpoints" / "local" / "credential"
    assert stat.S_IMODE(cred_file.stat().st_mode) == 0o600
    ep = client.endpoint_id("local")
    assert cred_file.read_text().startswith(f"skyfn-agent.{ep}.")
    agent.stop("local", home)
    agent.start("local", home)
    _wait_online(client)
    log = (home / "endpoints" / "local" / "agent.log").read_text()
    assert f"connected as endpoint {ep} with its credential" in log
    fid = client.register_function(double)
    assert client.get_result(client.run(fid, 21, endpoint_id=ep), timeout=60) == 42


def test_another_endpoints_credential_cannot_read_the_local_queue(home, client):
    ep = client.endpoint_id("local")
    intruder = client._http.post("/endpoints", {"name": "intruder"})
    spy = redis.Redis.from_url(intruder["task_queue"]["url"])
    assert spy.ping()
    fid = client.register_function(nap)
    tid = client.run(fid, 0.5, endpoint_id=ep)
    for read in (lambda: spy.xrange(f"tasks:{ep}"), lambda: spy.xreadgroup("agents", "spy", {f"tasks:{ep}": ">"}),
                 lambda: spy.hgetall(f"t:{tid}"), lambda: spy.xrange("results"), lambda: spy.scan()):
        with pytest.raises(redis.exceptions.NoPermissionError):
            read()
    assert client.get_result(tid, timeout=60) == 0.5


def test_no_secret_in_any_log_after_a_full_flow(home, client):
    from infra.local import agent, runtime
    from infra.local.state import StateDir

    state = StateDir.at(home)
    url = client.service_url
    ep = client.endpoint_id("local")
    alice = client.config.token
    bob = runtime.mint_token(state, "bob")
    fid, bad = client.register_function(double), client.register_function(explode)
    ids = [client.run(fid, i, endpoint_id=ep) for i in range(5)]
    failing = client.run(bad, "the task failed on purpose", endpoint_id=ep)
    slow = client.run(client.register_function(nap), 30, endpoint_id=ep)
    assert [client.get_result(t, timeout=60) for t in ids] == [0, 2, 4, 6, 8]
    with pytest.raises(Exception, match="on purpose"):
        client.get_result(failing, timeout=60)
    client.cancel(slow)
    # refused calls: a forged token, an expired one, a user token on another's objects
    expired = runtime.mint_token(state, "alice", ttl_seconds=-3600)
    for token in ("not.a.jwt", expired, alice[:-4] + "AAAA"):
        r = requests.get(f"{url}/endpoints", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert r.status_code == 401
    h_bob = {"Authorization": f"Bearer {bob}"}
    assert requests.get(f"{url}/endpoints/{ep}", headers=h_bob, timeout=10).status_code == 404
    client._http.post(f"/shares/endpoints/{ep}", {"principal": "user:bob", "role": "run"})
    client._http.post(f"/shares/functions/{fid}", {"principal": "user:bob", "role": "run"})
    r = requests.post(f"{url}/tasks", headers=h_bob, timeout=10, json={
        "endpoint_id": ep, "tasks": [{"function_id": fid, "payload": _payload(7)}]})
    assert r.status_code == 202
    bob_task = r.json()["task_ids"][0]
    deadline = time.monotonic() + 60
    while requests.get(f"{url}/tasks/{bob_task}", headers=h_bob, timeout=10).json()["state"] != "SUCCEEDED":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    credential = (home / "endpoints" / "local" / "credential").read_text().strip()
    assert requests.get(f"{url}/endpoints", headers={"Authorization": f"Bearer {credential}"},
                        timeout=10).status_code == 403
    agent.stop("local", home)  # an agent restart: reconnects with its credential
    agent.start("local", home)
    _wait_online(client)

    key_body = "".join(state.signing_key().strip().splitlines()[1:-1])
    secrets = {"alice's token": alice, "bob's token": bob, "expired token": expired,
               "token signature": alice.rsplit(".", 1)[1], "agent credential": credential,
               "credential secret": credential.rsplit(".", 1)[1],
               "redis password": (home / "local" / "redis" / "redis.password").read_text().strip(),
               "signing key": key_body[20:60]}
    logs = [p for p in home.rglob("*") if p.is_file() and (p.suffix in (".log", ".out", ".err") or "log" in p.name)]
    text = {p: p.read_text(errors="replace") for p in logs}
    # the logs really are at DEBUG: the gateway's access log, the agent's debug lines
    service_log, agent_log = text[home / "local" / "service.log"], text[home / "endpoints" / "local" / "agent.log"]
    assert '"POST /tasks HTTP/1.1" 202' in service_log and "DEBUG" in agent_log
    assert len(text) >= 4  # service, agent, redis, moto
    found = [(name, str(p.relative_to(home))) for p, t in text.items() for name, s in secrets.items() if s in t]
    assert found == []


def _payload(x):
    from skyfn.protocol import pack_args

    return pack_args((x,), {})


def test_a_rotated_credential_handed_to_the_agent_is_taken_up(home, client):
    """The owner rotates the credential while the agent runs: heartbeats are refused until
    the owner puts the new credential in the agent's file, then they resume."""
    ep = client.endpoint_id("local")
    fresh = client._http.post(f"/endpoints/{ep}/credential", {})["agent_credential"]

    def last_beat():
        return client.get_endpoint(ep)["last_heartbeat"]

    time.sleep(2.5)  # heartbeats every second, all refused now
    refused_since = last_beat()
    time.sleep(1.5)
    assert last_beat() == refused_since
    from endpoint_agent.service.credential import save

    save(home / "endpoints" / "local" / "credential", fresh)
    deadline = time.monotonic() + 15
    while last_beat() == refused_since:
        assert time.monotonic() < deadline, "heartbeats did not resume with the new credential"
        time.sleep(0.2)
    fid = client.register_function(double)
    assert client.get_result(client.run(fid, 3, endpoint_id=ep), timeout=60) == 6


def test_sdk_shares_audit_and_local_login(home, client):
    """Last in this module: `skyfn login --local --user bob` replaces the client config."""
    import subprocess
    import sys

    from skyfn import Client

    ep = client.endpoint_id("local")
    fid = client.register_function(double)
    tid = client.run(fid, 4, endpoint_id=ep)
    assert client.get_result(tid, timeout=60) == 8
    audit = client.task_audit(tid)
    assert audit["submitter"] == client.whoami() and audit["endpoint_id"] == ep
    assert [e[0] for e in audit["events"]][:2] == ["CREATED", "QUEUED"] and audit["state"] == "SUCCEEDED"
    assert client.share("endpoints", ep, "user:bob")["shares"] == {"user:bob": "run"}
    client.share("functions", fid, "user:bob")
    r = subprocess.run([sys.executable, "-m", "skyfn.cli", "login", "--local", "--user", "bob", "--home", str(home)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    config = home / "config.json"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    with Client() as bob:
        assert bob.whoami() == "bob"
        assert bob.get_result(bob.run(fid, 5, endpoint_id=ep), timeout=60) == 10
    client.unshare("endpoints", ep, "user:bob")
    with Client() as bob:
        with pytest.raises(Exception, match="not found"):
            bob.run(fid, 5, endpoint_id=ep)
