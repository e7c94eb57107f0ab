"""The embedded runtime for the light agent and fleet host tests (package-scoped: it and its
environment end with this package), started as a user starts it (`skyfn local up --detach`
in a private SKYFN_HOME), its own endpoint `local` with one worker, and a short heartbeat
timeout (8 s) so that an endpoint whose agent stopped is marked offline within seconds."""
from __future__ import annotations

import os
import time

import pytest
import yaml


@pytest.fixture(scope="package")
def fleet_home(tmp_path_factory):
    from infra.local import runtime

    home = tmp_path_factory.mktemp("skyfn-fleet-home")
    cfg = home / "endpoints" / "local"
    cfg.mkdir(parents=True)
    (cfg / "config.yaml").write_text(yaml.safe_dump({"workers": 1, "heartbeat_period": 1}))
    overrides = {"SKYFN_HOME": str(home), "SKYFN_HEARTBEAT_TIMEOUT": "8"}
    old = {k: os.environ.get(k) for k in overrides}
    os.environ.update(overrides)
    try:
        cdk_out = os.environ.get("SKYFN_TEST_CDK_OUT")  # `make test-deploy`: from the templates
        runtime.up(home, detach=True, from_templates=bool(cdk_out), cdk_out=cdk_out, echo=lambda *_: None)
        yield home
    finally:
        runtime.down(home, echo=lambda *_: None)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def client(fleet_home):
    from skyfn import Client

    with Client() as c:
        yield c


def wait_for(pred, what: str, timeout: float = 60.0, every: float = 0.3):
    """pred()'s first true value, polled; AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def statuses(client, ids) -> dict[str, str]:
    """endpoint id -> status, for the ids given."""
    want = set(ids)
    return {e["endpoint_id"]: e["status"] for e in client.list_endpoints() if e["endpoint_id"] in want}
