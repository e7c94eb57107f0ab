"""The Globus Flows action provider on the embedded runtime, over HTTP with the user's token,
as a flow's step would call it: run -> ACTIVE (Running) -> SUCCEEDED with the function's
result computed by the real endpoint; a running action cancelled (its task stops on the
worker); every document exchanged validated with globus-action-provider-tools' schemas."""
from __future__ import annotations

import time
import uuid

import pytest
import requests

from tests.service import ap_schemas


def slow_square(x, seconds):
    import time

    time.sleep(seconds)
    return x * x


class Provider:
    def __init__(self, client):
        self.url = client.service_url.rstrip("/") + "/flows-ap"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {client.config.token}"
        self.documents: list[dict] = []

    def call(self, method, path, body=None, kind="ActionStatus"):
        resp = self.session.request(method, self.url + path, json=body, timeout=30)
        where = f"{method} /flows-ap{path} -> {resp.status_code}"
        if body is not None:
            self.documents.append({"kind": "ActionRequest", "where": where, "doc": body})
        if resp.ok:
            self.documents.append({"kind": kind, "where": where, "doc": resp.json()})
        return resp.status_code, resp.json()

    def wait(self, action_id, pred, timeout=60.0):
        deadline = time.monotonic() + timeout
        while True:
            status, st = self.call("GET", f"/actions/{action_id}")
            assert status == 200, st
            if pred(st):
                return st
            assert time.monotonic() < deadline, f"action never matched: {st}"
            time.sleep(0.2)


@pytest.fixture
def provider(client):
    p = Provider(client)
    yield p
    p.session.close()


def test_flow_step_runs_a_function_and_is_cancelled_while_running(client, endpoint_id, provider):
    fid = client.register_function(slow_square)
    status, desc = provider.call("GET", "", kind="ActionProviderDescription")
    assert status == 200 and desc["log_supported"] is True

    body = {"function_id": fid, "endpoint_id": endpoint_id, "args": [12], "kwargs": {"seconds": 1.5}}
    status, st = provider.call("POST", "/run", {"request_id": str(uuid.uuid4()), "body": body, "label": "square"})
    assert status == 202 and st["status"] == "ACTIVE", st
    action_id = st["action_id"]
    running = provider.wait(action_id, lambda s: s["display_status"] == "Running" or s["status"] != "ACTIVE")
    assert running["status"] == "ACTIVE", running  # 1.5 s of work: seen while it runs
    done = provider.wait(action_id, lambda s: s["status"] != "ACTIVE")
    assert done["status"] == "SUCCEEDED" and done["details"]["result"] == 144, done
    assert client.get_result(done["details"]["task_id"], timeout=10) == 144  # the same task, for the SDK too
    status, log = provider.call("GET", f"/{action_id}/log?limit=100", kind="ActionLogReturn")
    assert [e["code"] for e in log["entries"]][:2] == ["CREATED", "QUEUED"]
    assert "RUNNING" in [e["code"] for e in log["entries"]]

    # long ones on both workers, cancelled while they run: the actions FAIL as Cancelled and the
    # workers stop them (a quick action then runs well before 120 s)
    body = {"function_id": fid, "endpoint_id": endpoint_id, "args": [3], "kwargs": {"seconds": 120}}
    long_ids = []
    for _ in range(2):
        status, st = provider.call("POST", "/actions", {"request_id": str(uuid.uuid4()), "body": body})
        assert status == 202
        long_ids.append(st["action_id"])
    for long_id in long_ids:
        provider.wait(long_id, lambda s: s["display_status"] == "Running")
    t0 = time.monotonic()
    for long_id in long_ids:
        status, st = provider.call("POST", f"/actions/{long_id}/cancel")
        assert status == 200 and st["status"] == "FAILED" and st["details"]["code"] == "Cancelled", st
        assert client.get_task(st["details"]["task_id"])["state"] == "CANCELLED"
    status, st = provider.call("POST", "/run", {"request_id": str(uuid.uuid4()),
                                                "body": {**body, "args": [5], "kwargs": {"seconds": 0}}})
    quick = provider.wait(st["action_id"], lambda s: s["status"] != "ACTIVE", timeout=60)
    assert quick["details"]["result"] == 25 and time.monotonic() - t0 < 60
    long_id = long_ids[0]
    status, released = provider.call("DELETE", f"/actions/{long_id}")
    assert status == 200 and released["status"] == "FAILED"

    report = ap_schemas.validate(provider.documents)
    assert report["errors"] == [], report["errors"]
    assert report["checked"] >= 10
