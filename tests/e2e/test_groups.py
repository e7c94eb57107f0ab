"""Endpoint groups through the SDK and the embedded runtime: Client.create_group,
Executor(group=...), tagged functions placed by the group's policy, followup fail."""
from __future__ import annotations

import textwrap

import pytest

from skyfn import Executor, SkyfnAPIError
from skyfn.protocol import TaskFailed


def square(x):
    return x * x


def test_executor_on_a_group_runs_on_the_member_the_policy_picks(client, endpoint_id):
    # a second member with no agent: the policy must keep work away from it
    spare = client._http.post("/endpoints", {"name": "spare-site"})["endpoint_id"]
    group = client.create_group("pair", ["local", {"endpoint_id": spare, "name": "spare"}], policy=textwrap.dedent("""
        default:
          - workers: [local]
            strategy: best_first
          - workers: [spare]
        """))
    assert [m["name"] for m in group["members"]] == ["local", "spare"]
    with Executor(client=client, group=group["group_id"]) as ex:
        assert list(ex.map(square, range(20))) == [x * x for x in range(20)]
        fut = ex.submit(square, 7)
        assert fut.result(timeout=60) == 49
    assert client.get_task(fut.task_id)["endpoint_id"] == endpoint_id
    info = client.get_group(group["group_id"])
    local = info["members"][0]
    assert local["status"] == "online" and local["capacity"] == 2 and local["backlog"] == 0


def test_tagged_functions_and_followup_fail_through_the_sdk(client, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(textwrap.dedent("""
        loner:
          - workers: "*"
            affinity: partner
          - followup: fail
        """))
    import pathlib

    group = client.create_group("solo", ["local"], policy=pathlib.Path(policy))
    ok = client.register_function(square, tag="plain")
    lonely = client.register_function(square, tag="loner")
    assert client.get_result(client.run(ok, 3, group_id=group["group_id"]), timeout=60) == 9
    tid = client.run(lonely, 3, group_id=group["group_id"])
    with pytest.raises(TaskFailed) as info:
        client.get_result(tid, timeout=60)
    assert "placement in endpoint group 'solo': no valid worker for tag 'loner'" in str(info.value)
    assert "local runs no 'partner' function (affinity partner)" in str(info.value)


def test_a_bad_policy_is_refused_with_line_key_and_reason(client):
    with pytest.raises(SkyfnAPIError) as info:
        client.create_group("bad", ["local"], policy="t:\n  - workers: [local]\n    strategy: quickest\n")
    assert info.value.status == 422
    assert "line 3: t[1].strategy: unknown strategy 'quickest'" in str(info.value)
