"""The embedded runtime, started once for the e2e suite exactly as a user starts it
(`skyfn local up --detach` in a private SKYFN_HOME), with a local endpoint of 2 workers
and short leases so that a killed agent's tasks come back quickly. With SKYFN_TEST_CDK_OUT
set (`make test-deploy`), it is started from that cloud assembly (`--from-templates`)."""
from __future__ import annotations

import os

import pytest
import yaml


@pytest.fixture(scope="session")
def local_home(tmp_path_factory):
    from infra.local import runtime

    home = tmp_path_factory.mktemp("skyfn-home")
    cfg = home / "endpoints" / "local"
    cfg.mkdir(parents=True)
    (cfg / "config.yaml").write_text(yaml.safe_dump({
        "workers": 2, "lease_seconds": 4, "heartbeat_period": 1, "grace_period": 5,
        "data": {"default": "redis", "redis": {"start": True}},  # skyfn.data: the endpoint's own Redis
    }))
    old = os.environ.get("SKYFN_HOME")
    os.environ["SKYFN_HOME"] = str(home)
    # `make test-deploy` (issue 25): the same suites against the runtime started from the
    # synthesized templates, IAM enforced
    cdk_out = os.environ.get("SKYFN_TEST_CDK_OUT")
    runtime.up(home, detach=True, from_templates=bool(cdk_out), cdk_out=cdk_out, echo=lambda *_: None)
    yield home
    runtime.down(home, echo=lambda *_: None)
    if cdk_out:
        refused = iam_report(home)
        assert refused == [], f"AccessDenied under the templates' policies: {refused}"
    if old is None:
        os.environ.pop("SKYFN_HOME", None)
    else:
        os.environ["SKYFN_HOME"] = old


def iam_report(home) -> list[str]:
    """After a run from the templates: the least-privilege report of what the suites used
    (appended as JSON to $SKYFN_TEST_IAM_REPORT when set) and the refused requests."""
    import json

    from infra.local import template_runtime
    from infra.local.iam import report
    from infra.local.state import StateDir

    entries = report.read_log(template_runtime.access_log(StateDir.at(home)))
    refused = report.refusals(entries)
    out = os.environ.get("SKYFN_TEST_IAM_REPORT")
    if out:
        used: dict[str, set] = {}
        for e in entries:
            if e.get("allowed"):
                used.setdefault(e["principal"], set()).add(e["action"])
        with open(out, "a") as f:
            f.write(json.dumps({"home": str(home), "used": {p: sorted(a) for p, a in used.items()},
                                "refused": refused}) + "\n")
    print(f"IAM from the templates: {len(entries)} checked requests, {len(refused)} refused")
    return refused


@pytest.fixture
def client(local_home):
    from skyfn import Client

    with Client() as c:
        yield c


@pytest.fixture
def endpoint_id(client):
    return client.endpoint_id("local")


class HotStore:
    """The runtime's hot store (its Redis), to check what the service did to task records."""

    def __init__(self, url: str):
        import redis

        self.r = redis.Redis.from_url(url, decode_responses=True)

    def consumed(self, task_ids) -> list[str]:
        """The ids whose result counts as retrieved (marked: kept SKYFN_RESULT_TTL once
        archived), not left unread (kept SKYFN_UNRETRIEVED_TTL, 7 days)."""
        return [t for t in task_ids if self.r.hget(f"t:{t}", "rt") is not None]


@pytest.fixture
def hot_store(local_home):
    from infra.local.state import StateDir

    store = HotStore(StateDir.at(local_home).read_runtime()["redis_url"])
    yield store
    store.r.close()
