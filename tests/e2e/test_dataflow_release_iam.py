"""Releasing dependents (issue 26) through the raw API, on each path that needs a grant of
the results function's or the reaper's role (infra/aws/stacks/service.py `_dataflow_release`;
docs/deploy.md "Least privilege: allowed against used"): a function body no longer in Redis
(the functions table), an envelope too large for its pack (put under args/, fetched with a
presigned GET), an input's result kept in S3 (a presigned GET of results/), and a release
the results function left to the reaper's sweep. Under `make test-deploy` (IAM enforced,
the templates' roles) the runtime's access log must show each role doing it. The tasks run
on an endpoint whose agent does not release dependents itself (`local_results_mb: 0`), so
every edge goes through the service."""
from __future__ import annotations

import time

import pytest

from skyfn.protocol.dataflow import Input
from skyfn.protocol.serialize import pack_args
from tests.e2e.conftest import service_s3
from tests.e2e.processes import extra_agent


@pytest.fixture
def endpoint_id(local_home, client):
    """An endpoint whose agent reports no `park` feature: its dependents wait in the service."""
    with extra_agent(local_home, client, "released-by-service",
                     {"workers": 2, "heartbeat_period": 1, "local_results_mb": 0}) as ep:
        yield ep["endpoint_id"]


def inc(x):
    return x + 1


def late(seconds, value):
    import time as _t

    _t.sleep(seconds)
    return value


def blob(n, seed):
    return bytes([seed]) * n


def measure(*blobs):
    return [len(b) for b in blobs], sorted({b[:1] for b in blobs}), b"\0" * 300_000


def inc_large(x):
    return x + 1, b"\0" * 300_000


def run_after(client, endpoint_id, function_id, input_task_id, *extra_inputs):
    """Submit one task whose arguments are its inputs' results (Input placeholders), raw."""
    inputs = [input_task_id, *extra_inputs]
    payload = pack_args(tuple(Input(i) for i in range(len(inputs))), {})
    (task_id,) = client.submit_tasks([{"function_id": function_id, "payload": payload, "inputs": inputs}],
                                     endpoint_id)
    return task_id


def from_templates(home) -> bool:
    from infra.local.state import StateDir

    return bool(StateDir.at(home).read_runtime().get("from_templates"))


def used(home, function_suffix: str, action: str, since: int, resource_part: str = "") -> bool:
    """Whether the function's role made an allowed `action` request (on a resource holding
    `resource_part`) after the access log's first `since` lines (from the templates only:
    moto's IAM access log)."""
    from infra.local import template_runtime
    from infra.local.standins.iam import report
    from infra.local.state import StateDir

    entries = report.read_log(template_runtime.access_log(StateDir.at(home)))[since:]
    return any(e.get("allowed") and e.get("action") == action and resource_part in e.get("resource", "")
               and report.split_principal(e.get("principal", ""))[1].endswith(function_suffix) for e in entries)


def log_length(home) -> int:
    from infra.local import template_runtime
    from infra.local.standins.iam import report
    from infra.local.state import StateDir

    return len(report.read_log(template_runtime.access_log(StateDir.at(home)))) if from_templates(home) else 0


def test_a_dependent_whose_function_left_redis_is_released_with_its_body_from_the_table(
        client, endpoint_id, hot_store, local_home):
    since = log_length(local_home)
    slow, fid = client.register_function(late), client.register_function(inc)
    (a,) = client.submit_tasks([{"function_id": slow, "payload": pack_args((3, 41), {})}], endpoint_id)
    b = run_after(client, endpoint_id, fid, a)
    assert client.get_task(b)["state"] == "WAITING"
    assert hot_store.r.delete(f"fn:{fid}") == 1  # the body is read from DynamoDB at release
    assert client.get_result(b, timeout=90) == 42
    if from_templates(local_home):
        assert used(local_home, "-results", "dynamodb:GetItem", since)
        assert used(local_home, "-results", "sqs:SendMessage", since)


def test_an_envelope_too_large_for_its_pack_and_an_input_in_s3(client, endpoint_id, local_home):
    """Two inline results of 160 KB and one of 1 MiB kept in S3: the envelope (> 256 KiB)
    is put under args/ by the results function, which also signs the GETs of it and of the
    S3 result that the agent fetches."""
    since = log_length(local_home)
    s3, bucket = service_s3(local_home)

    def args_objects() -> int:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="args/")
        return sum(page.get("KeyCount", 0) for page in pages)

    before = args_objects()
    make, fid = client.register_function(blob), client.register_function(measure)
    a, b, c = client.submit_tasks([{"function_id": make, "payload": pack_args((n, seed), {})}
                                   for n, seed in ((120_000, 1), (120_000, 2), (1 << 20, 3))], endpoint_id)
    d = run_after(client, endpoint_id, fid, a, b, c)
    sizes, heads, pad = client.get_result(d, timeout=120)
    assert list(sizes) == [120_000, 120_000, 1 << 20] and list(heads) == [b"\x01", b"\x02", b"\x03"]
    assert len(pad) == 300_000 and client.get_task(d)["result_url"]  # uploaded with the form its pack carried
    assert client.get_task(c)["result_url"], "the 1 MiB input's result was expected in S3"
    assert args_objects() > before, "the envelope was expected under args/"
    if from_templates(local_home):
        # the envelope, and D's result uploaded with the form in the pack the results function sent
        assert used(local_home, "-results", "s3:PutObject", since, "/args/")
        assert used(local_home, "-results", "s3:PutObject", since, "/results/")
        assert used(local_home, "-results", "s3:GetObject", since, "/args/")  # the GETs it signed
        assert used(local_home, "-results", "s3:GetObject", since, "/results/")


def test_the_reaper_sends_what_the_results_function_left(client, endpoint_id, hot_store, local_home):
    """As if the results function stopped between writing A's result and telling A's
    dependents: A is not put on `settled`, B stays WAITING; once A is there, the reaper's
    sweep (every 5 s) releases B and sends it; B's large result goes up with the form the
    reaper signed."""
    since = log_length(local_home)
    slow, fid = client.register_function(late), client.register_function(inc_large)
    (a,) = client.submit_tasks([{"function_id": slow, "payload": pack_args((3, 41), {})}], endpoint_id)
    b = run_after(client, endpoint_id, fid, a)
    assert hot_store.r.hdel(f"t:{a}", "wd") == 1, "A finished before the test could hold its dependents"
    assert client.get_result(a, timeout=60) == 41
    time.sleep(1)
    assert client.get_task(b)["state"] == "WAITING"
    hot_store.r.rpush("settled", a)
    value, pad = client.get_result(b, timeout=60)
    assert value == 42 and len(pad) == 300_000
    if from_templates(local_home):
        assert used(local_home, "-reaper", "sqs:SendMessage", since)
        assert used(local_home, "-reaper", "s3:PutObject", since, "/results/")
