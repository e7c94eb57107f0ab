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
    cdk_out = os.environ.get("SKYFN_TEST_CDK_OUT")
    (cfg / "config.yaml").write_text(yaml.safe_dump({
        # From the templates the queues are SQS in moto, which the runtime runs at low priority
        # (as a managed service it takes none of the task path's CPU): a lease is extended by
        # calls to it, and 4 s is shorter than its worst answer during a 10,000-task burst.
        "workers": 2, "lease_seconds": 30 if cdk_out else 4, "heartbeat_period": 1, "grace_period": 5,
        "data": {"default": "redis", "redis": {"start": True}},  # skyfn.data: the endpoint's own Redis
    }))
    old = os.environ.get("SKYFN_HOME")
    os.environ["SKYFN_HOME"] = str(home)
    # `make test-deploy` (issue 25): the same suites against the runtime started from the
    # synthesized templates, IAM enforced
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
    """After a run from the templates: the refused requests of its IAM access log, whose
    lines are also appended to $SKYFN_TEST_IAM_REPORT when set (the least-privilege report
    of `make test-deploy`: python -m infra.local.standins.iam.report_cli --log FILE --cdk-out DIR)."""
    from infra.local import template_runtime
    from infra.local.standins.iam import report
    from infra.local.state import StateDir

    log = template_runtime.access_log(StateDir.at(home))
    entries = report.read_log(log)
    out = os.environ.get("SKYFN_TEST_IAM_REPORT")
    if out and log.exists():
        with open(out, "a") as f:
            f.write(log.read_text())
    refused = report.refusals(entries)
    print(f"IAM from the templates: {len(entries)} checked requests, {len(refused)} refused")
    return refused


def service_s3(home):
    """(an S3 client, the payload bucket) of the runtime in `home`, to look at what the
    service stored: the deployer's keys and the templates' bucket when IAM is enforced."""
    import boto3

    from infra.local import template_runtime
    from infra.local.state import StateDir

    state = StateDir.at(home)
    record = state.read_runtime()
    keys = record.get("aws_deployer") or {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    bucket = "skyfn-payloads"
    if record.get("from_templates"):
        api = next(f for f in template_runtime.load(state)["functions"].values() if f["handler"] == "lambdas.api.handler")
        bucket = api["env"]["SKYFN_BUCKET"]
    s3 = boto3.client("s3", endpoint_url=record["aws_endpoint"], region_name="us-east-1",
                      aws_access_key_id=keys["AWS_ACCESS_KEY_ID"], aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"])
    return s3, bucket


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
