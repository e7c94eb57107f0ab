"""What the AWS deployment adds to the service, on moto and a real Redis: the agent's
session policy (lambdas/core/identity/agent_credentials.py) and a real AssumeRole with it,
secrets loaded into the environment at cold start (lambdas/core/identity/secret_env.py), the
Redis AUTH token joined to SKYFN_REDIS_URL, and TTL on the durable history."""
from __future__ import annotations

import json
import os

import boto3
import pytest
import redis

from lambdas.core.identity import agent_credentials as ac
from lambdas.core.identity import secret_env
from skyfn.protocol import pack_args, serialize_function
from skyfn.protocol.messages import ResultPack, TaskResult

PREFIX = "arn:aws:sqs:us-east-1:123456789012:skyfn-prod"
EP = "3f1c2a9e-7b6d-4c1e-9a51-2d0f6b8e4c11"


def inc(x):
    return x + 1


# --- agent session policy ----------------------------------------------------------
def test_session_policy_reaches_only_the_endpoints_own_queues():
    policy = ac.session_policy(PREFIX, EP)
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert set(by_sid) == {"ConsumeOwnQueues", "ReturnResults"}
    consume = by_sid["ConsumeOwnQueues"]
    assert consume["Effect"] == "Allow"
    assert sorted(consume["Action"]) == ["sqs:ChangeMessageVisibility", "sqs:DeleteMessage", "sqs:ReceiveMessage"]
    assert consume["Resource"] == [f"{PREFIX}-tasks-{EP}", f"{PREFIX}-control-{EP}"]
    assert by_sid["ReturnResults"]["Action"] == ["sqs:SendMessage"]
    assert by_sid["ReturnResults"]["Resource"] == [f"{PREFIX}-results"]
    text = json.dumps(policy)
    assert "*" not in text and "-dlq" not in text


def test_session_policy_names_match_the_services_queue_names(monkeypatch):
    from lambdas.config import settings

    monkeypatch.setenv("SKYFN_QUEUE_KIND", "sqs")
    monkeypatch.setenv("SKYFN_SQS_PREFIX", "skyfn-prod")
    settings.cache_clear()
    try:
        s = settings()
        arns = ac.queue_arns(PREFIX, EP)
        assert arns["tasks"].rsplit(":", 1)[1] == s.task_queue_name(EP)
        assert arns["control"].rsplit(":", 1)[1] == s.control_queue_name(EP)
        assert arns["results"].rsplit(":", 1)[1] == s.results_queue_name
    finally:
        settings.cache_clear()


@pytest.mark.parametrize("endpoint_id", ["*", "ab*", "a?b", "a/b", "", "x" * 65, "a:b"])
def test_session_policy_refuses_ids_that_would_widen_it(endpoint_id):
    with pytest.raises(ValueError, match="no wildcards"):
        ac.session_policy(PREFIX, endpoint_id)


@pytest.mark.parametrize("prefix", ["skyfn-prod", "arn:aws:sqs:us-east-1:123456789012:skyfn-*",
                                    "arn:aws:sqs:us-east-1:12345:skyfn", "arn:aws:s3:::bucket"])
def test_session_policy_refuses_a_bad_prefix(prefix):
    with pytest.raises(ValueError, match="SQS ARN prefix"):
        ac.session_policy(prefix, EP)


def test_session_policy_fits_sts_limit():
    longest = "arn:aws-us-gov:sqs:us-gov-west-1:123456789012:" + "p" * 60
    text = ac.session_policy_json(longest, "e" * 64)
    assert len(text) <= ac.MAX_POLICY_CHARS
    assert json.loads(text) == ac.session_policy(longest, "e" * 64)


def test_assume_agent_role_returns_session_credentials(aws_endpoint, unique):
    iam = boto3.client("iam", endpoint_url=aws_endpoint)
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                     "Principal": {"AWS": "arn:aws:iam::123456789012:root"}}]}
    role = iam.create_role(RoleName=f"agent-{unique}", AssumeRolePolicyDocument=json.dumps(trust))["Role"]
    creds = ac.assume_agent_role(boto3.client("sts", endpoint_url=aws_endpoint), role["Arn"], PREFIX, EP)
    assert set(creds) == {"access_key_id", "secret_access_key", "session_token", "expiration"}
    assert creds["access_key_id"] and creds["session_token"]
    with pytest.raises(ValueError, match="between 900 and 3600"):
        ac.assume_agent_role(boto3.client("sts", endpoint_url=aws_endpoint), role["Arn"], PREFIX, EP, 7200)


# --- secrets into the environment ----------------------------------------------------
def test_secret_env_loads_named_secrets_once(aws_endpoint, monkeypatch, unique):
    sm = boto3.client("secretsmanager", endpoint_url=aws_endpoint)
    arn = sm.create_secret(Name=f"rdv-{unique}", SecretString="s3cr3t-value")["ARN"]
    monkeypatch.delenv("SKYFN_TEST_SECRET", raising=False)
    monkeypatch.setenv(secret_env.VARIABLE, json.dumps({"SKYFN_TEST_SECRET": arn}))
    assert secret_env.load(sm) == ["SKYFN_TEST_SECRET"]
    assert os.environ["SKYFN_TEST_SECRET"] == "s3cr3t-value"
    assert secret_env.load(sm) == []  # already set: not fetched again


def test_secret_env_errors_name_the_variable_not_the_value(aws_endpoint, monkeypatch, unique):
    sm = boto3.client("secretsmanager", endpoint_url=aws_endpoint)
    monkeypatch.delenv("SKYFN_TEST_SECRET", raising=False)
    missing = f"arn:aws:secretsmanager:us-east-1:123456789012:secret:gone-{unique}"
    monkeypatch.setenv(secret_env.VARIABLE, json.dumps({"SKYFN_TEST_SECRET": missing}))
    with pytest.raises(secret_env.SecretEnvError, match="cannot read the secret of SKYFN_TEST_SECRET"):
        secret_env.load(sm)
    monkeypatch.setenv(secret_env.VARIABLE, "{not json")
    with pytest.raises(secret_env.SecretEnvError, match="is not JSON"):
        secret_env.load(sm)
    monkeypatch.setenv(secret_env.VARIABLE, json.dumps({"SKYFN_TEST_SECRET": 5}))
    with pytest.raises(secret_env.SecretEnvError, match="secret ARNs"):
        secret_env.load(sm)


def test_redis_password_joins_the_url(monkeypatch):
    from lambdas.config import settings, with_password

    url = with_password("rediss://master.x.cache.amazonaws.com:6379/0", "tok/en@1")
    assert url == "rediss://:tok%2Fen%401@master.x.cache.amazonaws.com:6379/0"
    kwargs = redis.Redis.from_url(url).connection_pool.connection_kwargs
    assert kwargs["password"] == "tok/en@1" and kwargs["host"] == "master.x.cache.amazonaws.com"
    assert with_password("redis://127.0.0.1:6379/0", "") == "redis://127.0.0.1:6379/0"
    monkeypatch.setenv("SKYFN_REDIS_URL", "rediss://h:6380/0")
    monkeypatch.setenv("SKYFN_REDIS_PASSWORD", "abc")
    settings.cache_clear()
    try:
        assert settings().redis_url == "rediss://:abc@h:6380/0"
    finally:
        settings.cache_clear()


# --- TTL of the durable history ---------------------------------------------------------
def test_history_items_carry_expires_at_when_a_ttl_is_set(api, monkeypatch):
    import time

    from lambdas.core import deps
    from lambdas.history import flush
    from lambdas.results import apply_pack

    monkeypatch.setenv("SKYFN_HISTORY_TTL_DAYS", "30")
    deps.reset()
    _, f = api.call("POST", "/functions", {"function": serialize_function(inc)})
    _, e = api.call("POST", "/endpoints", {"name": "ttl"})
    _, s = api.call("POST", "/tasks", {"endpoint_id": e["endpoint_id"],
                                       "tasks": [{"function_id": f["function_id"], "payload": pack_args((1,), {})}]})
    tid = s["task_ids"][0]
    apply_pack(ResultPack(endpoint_id=e["endpoint_id"], results=[TaskResult(task_id=tid, state="SUCCEEDED",
                                                                            result="json 3.11\n2")]))
    assert flush() == {"taken": 2, "submissions": 1, "tasks": 1, "pages": 1}
    item = deps.dynamo().get_task("alice", tid)
    sub = deps.dynamo().get_submission(item["submission_id"])
    table = deps.dynamo().history_table
    stored = table.scan()["Items"]  # the page and the owner's marker of its minute
    assert sorted(i["k"].split("#")[0] for i in stored) == ["m", "p"]
    for record in (sub, *stored):
        assert abs(float(record["expires_at"]) - (time.time() + 30 * 86400)) < 120
