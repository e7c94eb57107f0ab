"""The embedded runtime for the run tests (package-scoped: it and its environment end with this
package, so no other suite sees them), started as a user starts it (`skyfn local
up --detach` in a private SKYFN_HOME): moto through infra.local.standins.sfn.moto_bridge (state
machines run the real step handlers), the endpoint `local` with 4 workers (an SPMD group
of 4 runs all its ranks at once), a real rendezvous server, and a short heartbeat
timeout so that an endpoint whose agent is gone is marked offline within seconds."""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _wait_file(path: Path, proc: subprocess.Popen, timeout: float = 15.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if proc.poll() is not None:
            raise RuntimeError(f"the rendezvous server exited with code {proc.returncode}")
        time.sleep(0.05)
    raise TimeoutError("the rendezvous server did not report its port")


@pytest.fixture(scope="package")
def rendezvous_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("rendezvous")
    secret = secrets.token_hex(16)
    env = dict(os.environ, SKYFN_RENDEZVOUS_SECRET=secret, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "rendezvous", "--host", "127.0.0.1", "--port", "0",
                             "--port-file", str(d / "port"), "--log-level", "warning"],
                            env=env, cwd=REPO, stdout=open(d / "log", "wb"), stderr=subprocess.STDOUT)
    try:
        port = int(_wait_file(d / "port", proc))
        yield {"address": f"127.0.0.1:{port}", "secret": secret}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture(scope="package")
def wf_home(tmp_path_factory, rendezvous_server):
    from infra.local import runtime

    home = tmp_path_factory.mktemp("skyfn-wf-home")
    cfg = home / "endpoints" / "local"
    cfg.mkdir(parents=True)
    (cfg / "config.yaml").write_text(yaml.safe_dump({"workers": 4, "heartbeat_period": 1}))
    overrides = {"SKYFN_HOME": str(home), "SKYFN_HEARTBEAT_TIMEOUT": "4",
                 "SKYFN_RENDEZVOUS_ADDRESS": rendezvous_server["address"],
                 "SKYFN_RENDEZVOUS_SECRET": rendezvous_server["secret"]}
    old = {k: os.environ.get(k) for k in overrides}
    os.environ.update(overrides)
    os.environ.pop("AWS_ENDPOINT_URL", None)
    try:
        cdk_out = os.environ.get("SKYFN_TEST_CDK_OUT")  # `make test-deploy` (issue 25): from the templates
        runtime.up(home, detach=True, from_templates=bool(cdk_out), cdk_out=cdk_out, echo=lambda *_: None)
        yield home
    finally:
        runtime.down(home, echo=lambda *_: None)
        if os.environ.get("SKYFN_TEST_CDK_OUT"):
            from tests.e2e.conftest import iam_report

            refused = iam_report(home)
            assert refused == [], f"AccessDenied under the templates' policies: {refused}"
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def client(wf_home):
    from skyfn import Client

    with Client() as c:
        yield c


@pytest.fixture
def endpoint(client):
    return client.endpoint_id("local")


@pytest.fixture(scope="package")
def offline_endpoint(wf_home):
    """An endpoint that was online once (one heartbeat) and whose agent is gone: the
    reaper marks it offline once the heartbeat timeout (4 s here, 30 s from the templates) has passed."""
    from skyfn import Client

    with Client() as c:
        ep = c._http.post("/endpoints", {"name": "gone-away"})["endpoint_id"]
        c._http.post(f"/endpoints/{ep}/heartbeat", {"stats": {}})
        # 4 s here; from the templates (`make test-deploy`) the stack's default heartbeat timeout, 30 s
        deadline = time.monotonic() + 60
        while c.get_endpoint(ep)["status"] != "offline":
            assert time.monotonic() < deadline, "the reaper never marked the silent endpoint offline"
            time.sleep(0.5)
    return ep
