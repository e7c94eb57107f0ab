"""An endpoint agent's credential reaches its own endpoint's queues and nothing else.

Redis Streams path (the embedded runtime's queues), on a real redis-server: the
credential from registration logs in as the endpoint's Redis ACL user; receiving from the
endpoint's own queue works through the real queue adapter, while another endpoint's
queue, the task records, the results others post and key listing are refused by Redis
itself (NOPERM). A result an agent posts for a task routed elsewhere is dropped by the
results handler. Rotating or revoking the credential locks the old one out.

SQS path (AWS), on moto with IAM enforcement switched on: the session policy document
of lambdas/core/identity/agent_credentials.py, attached to the agent role (moto evaluates role
policies but not session policies), allows the real calls of the SQS queue adapter on the
endpoint's queues and refuses the same calls on another endpoint's queue.
"""
from __future__ import annotations

import json

import boto3
import pytest
import redis
from botocore.exceptions import ClientError

from skyfn.protocol import pack_args, serialize_function
from skyfn.protocol.queues import open_queue


def inc(x):
    return x + 1


@pytest.fixture
def two_endpoints(api):
    _, fn = api.call("POST", "/functions", {"function": serialize_function(inc)})
    _, a = api.call("POST", "/endpoints", {"name": "site-a"})
    _, b = api.call("POST", "/endpoints", {"name": "site-b"})
    tasks = {}
    for reg in (a, b):
        status, sub = api.call("POST", "/tasks", {"endpoint_id": reg["endpoint_id"], "tasks": [
            {"function_id": fn["function_id"], "payload": pack_args((i,), {})} for i in range(3)]})
        assert status == 202
        tasks[reg["endpoint_id"]] = sub["task_ids"]
    return a, b, tasks


def _as_agent(reg) -> redis.Redis:
    return redis.Redis.from_url(reg["task_queue"]["url"])


def test_agent_credential_receives_only_its_own_tasks(two_endpoints):
    a, b, tasks = two_endpoints
    queue = open_queue(a["task_queue"], consumer="agent-a", visibility_timeout=30)
    got = queue.receive(max_messages=10)
    received = [t["task_id"] for m in got for t in json.loads(m.body)["tasks"]]
    assert sorted(received) == sorted(tasks[a["endpoint_id"]])
    queue.delete([m.receipt for m in got])
    # the same login, pointed at endpoint B's queue through the same adapter
    stolen = open_queue({**a["task_queue"], "name": b["task_queue"]["name"]}, consumer="thief", visibility_timeout=30)
    with pytest.raises(redis.exceptions.NoPermissionError):
        stolen.receive(max_messages=10)
    r = _as_agent(a)
    b_stream, b_task = b["task_queue"]["name"], tasks[b["endpoint_id"]][0]
    for call in (lambda: r.xrange(b_stream), lambda: r.xreadgroup("agents", "thief", {b_stream: ">"}),
                 lambda: r.xrange("results"), lambda: r.hgetall(f"t:{b_task}"), lambda: r.scan(),
                 lambda: r.keys("*"), lambda: r.execute_command("ACL", "LIST"), lambda: r.config_get("*"),
                 lambda: r.eval("return redis.call('XRANGE', KEYS[1], '-', '+')", 1, b_stream),
                 lambda: r.get(f"agentcred:{b['endpoint_id']}"), lambda: r.flushall()):
        with pytest.raises(redis.exceptions.NoPermissionError):
            call()
    # B's tasks are untouched: its own agent gets all three (one pack)
    [pack] = open_queue(b["task_queue"], consumer="agent-b").receive(max_messages=10)
    assert sorted(t["task_id"] for t in json.loads(pack.body)["tasks"]) == sorted(tasks[b["endpoint_id"]])


def test_a_result_for_a_task_routed_elsewhere_is_dropped(two_endpoints, api):
    from lambdas.results import apply_pack
    from skyfn.protocol.messages import ResultPack, TaskResult

    a, b, tasks = two_endpoints
    results = open_queue(a["results_queue"], consumer="agent-a")
    b_task, a_task = tasks[b["endpoint_id"]][0], tasks[a["endpoint_id"]][0]
    # agent A can post to the results stream (write-only) ...
    results.send([ResultPack(endpoint_id=a["endpoint_id"], results=[
        TaskResult(task_id=b_task, state="SUCCEEDED", result="json 3.11\n666"),
        TaskResult(task_id=a_task, state="SUCCEEDED", result="json 3.11\n1")]).model_dump_json().encode()])
    service_side = open_queue({"kind": "redis", "name": "results", "url": api_redis_url()}, consumer="gateway")
    [msg] = service_side.receive(max_messages=10)
    # ... but the results handler stores only what was routed to the sender
    stored, dup, unknown = apply_pack(ResultPack.model_validate_json(msg.body))
    assert (stored, dup, unknown) == (1, 0, 1)
    assert api.call("GET", f"/tasks/{b_task}")[1]["state"] == "QUEUED"
    assert api.call("GET", f"/tasks/{a_task}")[1]["result"] == "json 3.11\n1"


def api_redis_url() -> str:
    from lambdas.config import settings

    return settings().redis_url


def test_rotated_credential_cannot_log_in_and_revoked_one_is_cut_off(two_endpoints, api):
    a, _, _ = two_endpoints
    live = _as_agent(a)
    assert live.xlen(a["task_queue"]["name"]) == 1
    status, rotated = api.call("POST", f"/endpoints/{a['endpoint_id']}/credential")
    assert status == 201
    with pytest.raises(redis.exceptions.AuthenticationError):
        _as_agent(a).ping()
    assert live.xlen(a["task_queue"]["name"]) == 1  # a connection made before keeps working until revoked
    assert api.call("DELETE", f"/endpoints/{a['endpoint_id']}/credential")[0] == 200
    with pytest.raises((redis.exceptions.ConnectionError, redis.exceptions.AuthenticationError)):
        live.xlen(a["task_queue"]["name"])


# --- SQS: the session policy under an IAM evaluator ------------------------------------------
ACCOUNT = "123456789012"
REGION = "us-east-1"
PREFIX = "skyfn-prod"


def _as_moto_evaluates(policy: dict) -> dict:
    """AWS authorizes SQS batch calls with the single-message action (DeleteMessageBatch
    needs sqs:DeleteMessage); moto checks the batch action's own name. The same document,
    with each allowed action's batch name next to it."""
    batch = {"sqs:DeleteMessage": "sqs:DeleteMessageBatch", "sqs:SendMessage": "sqs:SendMessageBatch",
             "sqs:ChangeMessageVisibility": "sqs:ChangeMessageVisibilityBatch"}
    for st in policy["Statement"]:
        st["Action"] = st["Action"] + [batch[a] for a in st["Action"] if a in batch]
    return policy


def test_sqs_session_policy_reaches_only_the_endpoints_queues(monkeypatch):
    from moto import mock_aws
    from moto.core import set_initial_no_auth_action_count

    from lambdas.core.identity import agent_credentials as ac
    from skyfn.protocol.queues.sqs import SqsQueue

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    ep_a, ep_b = "ep-aaaa-1111", "ep-bbbb-2222"

    @set_initial_no_auth_action_count(3)
    @mock_aws
    def run():
        iam = boto3.client("iam", region_name=REGION)
        # the first three calls run unauthenticated: an administrator for the set-up
        iam.create_user(UserName="admin")
        iam.put_user_policy(UserName="admin", PolicyName="all", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="admin")["AccessKey"]
        admin = boto3.Session(aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"],
                              region_name=REGION)
        sqs = admin.client("sqs")
        urls = {name: sqs.create_queue(QueueName=name)["QueueUrl"]
                for name in (f"{PREFIX}-tasks-{ep_a}", f"{PREFIX}-tasks-{ep_b}", f"{PREFIX}-control-{ep_a}",
                             f"{PREFIX}-results")}
        for url in urls.values():
            sqs.send_message(QueueUrl=url, MessageBody='{"task": 1}')
        arn_prefix = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{PREFIX}"
        trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                         "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:user/admin"}}]}
        aiam = admin.client("iam")
        role = aiam.create_role(RoleName=f"{PREFIX}-agent", AssumeRolePolicyDocument=json.dumps(trust))["Role"]
        aiam.put_role_policy(RoleName=role["RoleName"], PolicyName="session",
                             PolicyDocument=json.dumps(_as_moto_evaluates(ac.session_policy(arn_prefix, ep_a))))
        creds = ac.assume_agent_role(admin.client("sts"), role["Arn"], arn_prefix, ep_a)
        agent = boto3.Session(aws_access_key_id=creds["access_key_id"], aws_secret_access_key=creds["secret_access_key"],
                              aws_session_token=creds["session_token"], region_name=REGION).client("sqs")
        own = SqsQueue(f"{PREFIX}-tasks-{ep_a}", client=agent, url=urls[f"{PREFIX}-tasks-{ep_a}"])
        got = own.receive(max_messages=10)
        assert [m.body for m in got] == [b'{"task": 1}']
        own.delete([m.receipt for m in got])
        control = SqsQueue(f"{PREFIX}-control-{ep_a}", client=agent, url=urls[f"{PREFIX}-control-{ep_a}"])
        assert len(control.receive(max_messages=10)) == 1
        results = SqsQueue(f"{PREFIX}-results", client=agent, url=urls[f"{PREFIX}-results"])
        results.send([b'{"endpoint_id": "ep-aaaa-1111"}'])
        other = SqsQueue(f"{PREFIX}-tasks-{ep_b}", client=agent, url=urls[f"{PREFIX}-tasks-{ep_b}"])
        for call in (lambda: other.receive(max_messages=10), lambda: other.send([b"x"]),
                     lambda: results.receive(max_messages=10)):
            with pytest.raises(ClientError) as err:
                call()
            assert "AccessDenied" in str(err.value) and "not authorized" in str(err.value)
        assert sqs.get_queue_attributes(QueueUrl=urls[f"{PREFIX}-tasks-{ep_b}"], AttributeNames=[
            "ApproximateNumberOfMessages"])["Attributes"]["ApproximateNumberOfMessages"] == "1"

    run()
