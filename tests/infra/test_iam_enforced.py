"""IAM enforced in the embedded runtime's moto (issue 25; infra/local/standins/iam): a moto server
started by the repo's launcher with SKYFN_MOTO_IAM_RESOURCES=1, roles created with
infra.local.standins.iam.roles, enforcement switched on, and every call made with a function's
session credentials. What the role's policy allows works; the same call on another
resource is refused with an AccessDenied naming the action, the resource and the
session (the function); removing a statement refuses what it allowed; the access log
and the least-privilege report see both."""
from __future__ import annotations

import json
import os
import time
import uuid

import boto3
import pytest
import requests
from botocore.config import Config
from botocore.exceptions import ClientError

from infra.local.standins.iam import policy as iam_policy
from infra.local.standins.iam import report as iam_report
from infra.local.standins.iam import roles as iam_roles

REGION = "us-east-1"
ACCOUNT = "123456789012"
FUNCTION = "skyfn-dev-api"          # the session name: a function's name
WORKER = "skyfn-dev-iam-worker"     # a Lambda function a state machine runs through the bridge
HANDLER = "tests.infra.test_iam_enforced.put_item_handler"


def put_item_handler(event, context):
    """Run by the bridge as WORKER, with its role's session: a PutItem on event["table"]."""
    boto3.client("dynamodb", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name=REGION).put_item(
        TableName=event["table"], Item={"pk": {"S": event["pk"]}})
    return {"written": event["table"]}


def arn(service: str, rest: str) -> str:
    return f"arn:aws:{service}:{REGION}:{ACCOUNT}:{rest}"


def _trust(principal: dict) -> dict:
    return {"Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": principal, "Action": "sts:AssumeRole"}]}


class World:
    """What the fixture provisioned: names, ARNs, role specs, clients' credentials."""


def _function_policy(w: World, with_sqs: bool = True) -> dict:
    statements = [
        {"Sid": "TableA", "Effect": "Allow",
         "Action": ["dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:Query", "dynamodb:BatchWriteItem",
                    "dynamodb:DeleteItem"],
         "Resource": [w.table_a_arn, f"{w.table_a_arn}/index/*"]},
        {"Sid": "RunM", "Effect": "Allow", "Action": "states:StartExecution", "Resource": w.machine_m},
        {"Sid": "ReadM", "Effect": "Allow", "Action": "states:DescribeExecution",
         "Resource": w.machine_m.replace(":stateMachine:", ":execution:") + ":*"},
        {"Sid": "Secret", "Effect": "Allow", "Action": "secretsmanager:GetSecretValue",
         "Resource": arn("secretsmanager", f"secret:{w.secret}-??????")},
        {"Sid": "Payloads", "Effect": "Allow", "Action": ["s3:PutObject", "s3:GetObject*"],
         "Resource": f"arn:aws:s3:::{w.bucket}/allowed/*"},
        {"Sid": "AgentSessions", "Effect": "Allow", "Action": "sts:AssumeRole", "Resource": w.agent_role_arn},
        # A condition this request context never satisfies: must not refuse anything else.
        {"Sid": "PassFlowRole", "Effect": "Allow", "Action": "iam:PassRole", "Resource": w.flow_role_arn,
         "Condition": {"StringEquals": {"iam:PassedToService": "states.amazonaws.com"}}},
    ]
    if with_sqs:
        statements.append({"Sid": "Results", "Effect": "Allow", "Action": "sqs:SendMessage",
                           "Resource": w.queue_1_arn})
    return {"Version": "2012-10-17", "Statement": statements}


def _specs(w: World, with_sqs: bool = True) -> list[iam_roles.RoleSpec]:
    lambda_trust = _trust({"Service": "lambda.amazonaws.com"})
    return [
        iam_roles.RoleSpec(w.fn_role, lambda_trust, [("ApiDefaultPolicy", _function_policy(w, with_sqs))],
                           ["arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"]),
        iam_roles.RoleSpec(w.agent_role, _trust({"AWS": w.fn_role_arn}), [("Queues", {
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sqs:SendMessage",
                                                    "Resource": arn("sqs", f"{w.prefix}-*")}]})]),
        iam_roles.RoleSpec(w.worker_role, lambda_trust, [("Write", {
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "dynamodb:PutItem",
                                                    "Resource": w.table_a_arn}]})]),
        iam_roles.RoleSpec(w.flow_role, _trust({"Service": "states.amazonaws.com"}), [("Invoke", {
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "lambda:InvokeFunction",
                                                    "Resource": [w.worker_arn, f"{w.worker_arn}:*"]}]})]),
    ]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from infra.local.processes import start_moto

    workdir = tmp_path_factory.mktemp("iam-moto")
    access_log = workdir / "access.jsonl"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SKYFN_MOTO_IAM_RESOURCES", "1")
        mp.setenv("SKYFN_IAM_ACCESS_LOG", str(access_log))
        mp.setenv("SKYFN_BRIDGE_EXTRA_HANDLERS", HANDLER)
        server = start_moto(workdir)
    try:
        w = World()
        w.url, w.access_log, u = server.url, access_log, uuid.uuid4().hex[:6]
        w.prefix = f"iam{u}"
        w.table_a, w.table_b = f"{w.prefix}-a", f"{w.prefix}-b"
        w.table_a_arn, w.table_b_arn = arn("dynamodb", f"table/{w.table_a}"), arn("dynamodb", f"table/{w.table_b}")
        w.fn_role, w.agent_role, w.worker_role, w.flow_role = (f"{w.prefix}-{r}" for r in ("api", "agent", "worker",
                                                                                              "flow"))
        w.fn_role_arn, w.agent_role_arn, w.worker_role_arn, w.flow_role_arn = (
            f"arn:aws:iam::{ACCOUNT}:role/{r}" for r in (w.fn_role, w.agent_role, w.worker_role, w.flow_role))
        w.worker_arn = arn("lambda", f"function:{WORKER}")
        w.secret, w.other_secret = f"{w.prefix}/auth", f"{w.prefix}/other"
        w.bucket = f"{w.prefix}-payloads"
        w.deployer = iam_roles.deployer_credentials(w.url)
        admin = iam_roles.session(w.deployer)
        w.admin = admin
        ddb = admin.client("dynamodb", endpoint_url=w.url)
        for table in (w.table_a, w.table_b):
            ddb.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                             AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                                   {"AttributeName": "g", "AttributeType": "S"}],
                             KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                             GlobalSecondaryIndexes=[{"IndexName": "by-g", "Projection": {"ProjectionType": "ALL"},
                                                      "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}]}])
        sqs = admin.client("sqs", endpoint_url=w.url)
        w.queue_1 = sqs.create_queue(QueueName=f"{w.prefix}-q1")["QueueUrl"]
        w.queue_2 = sqs.create_queue(QueueName=f"{w.prefix}-q2")["QueueUrl"]
        w.queue_1_arn, w.queue_2_arn = arn("sqs", f"{w.prefix}-q1"), arn("sqs", f"{w.prefix}-q2")
        sm = admin.client("secretsmanager", endpoint_url=w.url)
        w.secret_arn = sm.create_secret(Name=w.secret, SecretString="s3cret")["ARN"]
        w.other_secret_arn = sm.create_secret(Name=w.other_secret, SecretString="other")["ARN"]
        admin.client("s3", endpoint_url=w.url).create_bucket(Bucket=w.bucket)
        w.machine_m, w.machine_n = arn("states", f"stateMachine:{w.prefix}-m"), arn("states",
                                                                                   f"stateMachine:{w.prefix}-n")
        w.specs = _specs(w)
        result = iam_roles.create_roles(w.specs, w.url, w.deployer)
        assert result["skipped_managed"] == {w.fn_role: [
            "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"]}
        sfn = admin.client("stepfunctions", endpoint_url=w.url)
        passing = json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}})
        for machine in (w.machine_m, w.machine_n):
            sfn.create_state_machine(name=machine.rsplit(":", 1)[1], definition=passing, roleArn=w.flow_role_arn)
        admin.client("lambda", endpoint_url=w.url).create_function(
            FunctionName=WORKER, Runtime="python3.11", Role=w.worker_role_arn, Handler=HANDLER,
            Code={"ZipFile": b"PK\x05\x06" + b"\x00" * 18}, Timeout=60,
            Environment={"Variables": {"AWS_ENDPOINT_URL": w.url, "AWS_DEFAULT_REGION": REGION}})
        w.invoker = arn("states", f"stateMachine:{w.prefix}-invoker")
        sfn.create_state_machine(name=f"{w.prefix}-invoker", roleArn=w.flow_role_arn, definition=json.dumps({
            "StartAt": "Write", "States": {"Write": {"Type": "Task", "Resource": w.worker_arn, "End": True}}}))
        iam_roles.enforce(w.url)
        w.fn = iam_roles.function_credentials(w.fn_role_arn, FUNCTION, endpoint_url=w.url, deployer=w.deployer)
        w.session = iam_roles.session(w.fn)
        yield w
    finally:
        server.stop()


def client(w: World, service: str, session=None):
    config = Config(retries={"max_attempts": 1}, signature_version="s3v4" if service == "s3" else None)
    return (session or w.session).client(service, endpoint_url=w.url, config=config)


def denied(call, *needles: str) -> str:
    with pytest.raises(ClientError) as err:
        call()
    text = str(err.value)
    assert err.value.response["Error"]["Code"] in ("AccessDenied", "AccessDeniedException"), text
    for needle in needles:
        assert needle in text, (needle, text)
    return text


def test_dynamodb_reaches_table_a_only(world):
    w = world
    ddb = client(w, "dynamodb")
    ddb.put_item(TableName=w.table_a, Item={"pk": {"S": "1"}, "g": {"S": "x"}})
    assert ddb.get_item(TableName=w.table_a, Key={"pk": {"S": "1"}})["Item"]["g"] == {"S": "x"}
    got = ddb.query(TableName=w.table_a, IndexName="by-g", KeyConditionExpression="g = :g",
                    ExpressionAttributeValues={":g": {"S": "x"}})
    assert got["Count"] == 1
    ddb.batch_write_item(RequestItems={w.table_a: [{"PutRequest": {"Item": {"pk": {"S": "2"}}}}]})
    text = denied(lambda: ddb.put_item(TableName=w.table_b, Item={"pk": {"S": "1"}}),
                  "dynamodb:PutItem", FUNCTION, w.fn_role, w.table_b_arn)
    assert f"assumed-role/{w.fn_role}/{FUNCTION}" in text
    denied(lambda: ddb.query(TableName=w.table_b, IndexName="by-g", KeyConditionExpression="g = :g",
                             ExpressionAttributeValues={":g": {"S": "x"}}),
           "dynamodb:Query", f"{w.table_b_arn}/index/by-g")
    # every table of a batch must be allowed
    denied(lambda: ddb.batch_write_item(RequestItems={
        w.table_a: [{"PutRequest": {"Item": {"pk": {"S": "3"}}}}],
        w.table_b: [{"PutRequest": {"Item": {"pk": {"S": "3"}}}}]}), "dynamodb:BatchWriteItem", w.table_b_arn)
    # an action the statement does not list, on the allowed table
    denied(lambda: ddb.scan(TableName=w.table_a), "dynamodb:Scan")
    # a transaction is authorized per item, with the item's own action
    denied(lambda: ddb.transact_write_items(TransactItems=[
        {"Put": {"TableName": w.table_a, "Item": {"pk": {"S": "4"}}}},
        {"Update": {"TableName": w.table_a, "Key": {"pk": {"S": "1"}}, "UpdateExpression": "SET g = :g",
                    "ExpressionAttributeValues": {":g": {"S": "y"}}}}]), "dynamodb:UpdateItem", w.table_a_arn)
    admin_ddb = client(w, "dynamodb", w.admin)
    assert "Item" not in admin_ddb.get_item(TableName=w.table_a, Key={"pk": {"S": "4"}})


def test_step_functions_start_and_describe_on_machine_m_only(world):
    w = world
    sfn = client(w, "stepfunctions")
    execution = sfn.start_execution(stateMachineArn=w.machine_m, input="{}")["executionArn"]
    assert sfn.describe_execution(executionArn=execution)["stateMachineArn"] == w.machine_m
    denied(lambda: sfn.start_execution(stateMachineArn=w.machine_n, input="{}"), "states:StartExecution",
           w.machine_n, FUNCTION)
    other = client(w, "stepfunctions", w.admin).start_execution(stateMachineArn=w.machine_n)["executionArn"]
    denied(lambda: sfn.describe_execution(executionArn=other), "states:DescribeExecution", other)


def test_secrets_by_arn_and_by_name_for_the_granted_secret_only(world):
    w = world
    sm = client(w, "secretsmanager")
    assert sm.get_secret_value(SecretId=w.secret_arn)["SecretString"] == "s3cret"
    assert sm.get_secret_value(SecretId=w.secret)["SecretString"] == "s3cret"
    denied(lambda: sm.get_secret_value(SecretId=w.other_secret), "secretsmanager:GetSecretValue",
           w.other_secret_arn)
    denied(lambda: sm.get_secret_value(SecretId=w.other_secret_arn), "secretsmanager:GetSecretValue")
    denied(lambda: sm.describe_secret(SecretId=w.secret), "secretsmanager:DescribeSecret", w.secret_arn)


def test_sqs_and_a_session_policy_narrowing_the_agent_role(world):
    w = world
    sqs = client(w, "sqs")
    sqs.send_message(QueueUrl=w.queue_1, MessageBody="ok")
    sqs.send_message_batch(QueueUrl=w.queue_1, Entries=[{"Id": "1", "MessageBody": "ok"}])  # = sqs:SendMessage
    denied(lambda: sqs.send_message(QueueUrl=w.queue_2, MessageBody="no"), "sqs:SendMessage", w.queue_2_arn)
    # the API (this function's session) hands an agent a session of the agent role narrowed to queue 1
    narrow = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sqs:SendMessage",
                                                      "Resource": w.queue_1_arn}]}
    creds = client(w, "sts").assume_role(RoleArn=w.agent_role_arn, RoleSessionName="endpoint-a",
                                         Policy=json.dumps(narrow))["Credentials"]
    agent = boto3.Session(aws_access_key_id=creds["AccessKeyId"], aws_secret_access_key=creds["SecretAccessKey"],
                          aws_session_token=creds["SessionToken"], region_name=REGION)
    agent_sqs = client(w, "sqs", agent)
    agent_sqs.send_message(QueueUrl=w.queue_1, MessageBody="ok")
    # the agent role allows queue 2, the session policy does not: refused (intersection)
    denied(lambda: agent_sqs.send_message(QueueUrl=w.queue_2, MessageBody="no"), "sqs:SendMessage",
           "no session policy allows", "endpoint-a")
    # without a session policy the role alone decides
    full = client(w, "sts").assume_role(RoleArn=w.agent_role_arn, RoleSessionName="endpoint-b")["Credentials"]
    client(w, "sqs", boto3.Session(aws_access_key_id=full["AccessKeyId"],
                                   aws_secret_access_key=full["SecretAccessKey"],
                                   aws_session_token=full["SessionToken"], region_name=REGION)).send_message(
        QueueUrl=w.queue_2, MessageBody="ok")
    # the trust policy decides who may assume a role: the worker role trusts Lambda only
    denied(lambda: client(w, "sts").assume_role(RoleArn=w.worker_role_arn, RoleSessionName="intruder"),
           "sts:AssumeRole", "trust policy")


def test_s3_presigned_urls_signed_with_a_session(world):
    w = world
    s3 = client(w, "s3")
    put = s3.generate_presigned_url("put_object", Params={"Bucket": w.bucket, "Key": "allowed/p1"}, ExpiresIn=300)
    assert requests.put(put, data=b"payload", timeout=10).status_code == 200
    get = s3.generate_presigned_url("get_object", Params={"Bucket": w.bucket, "Key": "allowed/p1"}, ExpiresIn=300)
    answer = requests.get(get, timeout=10)
    assert answer.status_code == 200 and answer.content == b"payload"
    refused = requests.put(s3.generate_presigned_url("put_object", Params={"Bucket": w.bucket, "Key": "other/p1"},
                                                     ExpiresIn=300), data=b"x", timeout=10)
    assert refused.status_code == 403 and b"AccessDenied" in refused.content
    assert b"s3:PutObject" in refused.content and FUNCTION.encode() in refused.content
    tampered = put.replace("allowed/p1", "allowed/p2")
    assert requests.put(tampered, data=b"x", timeout=10).status_code == 403
    expired = s3.generate_presigned_url("put_object", Params={"Bucket": w.bucket, "Key": "allowed/p3"}, ExpiresIn=1)
    time.sleep(2)
    assert requests.put(expired, data=b"x", timeout=10).status_code == 403
    unsigned = requests.put(f"{w.url}/{w.bucket}/allowed/p4", data=b"x", timeout=10)
    assert unsigned.status_code == 403
    # presigned POST forms, as the API hands them out (skyfn/data/connectors/s3.py)
    form = s3.generate_presigned_post(w.bucket, "allowed/f1", ExpiresIn=300,
                                      Conditions=[["content-length-range", 1, 100]])
    posted = requests.post(form["url"], data=form["fields"], files={"file": ("f1", b"form")}, timeout=10)
    assert posted.status_code == 204, posted.content
    assert s3.get_object(Bucket=w.bucket, Key="allowed/f1")["Body"].read() == b"form"
    too_big = requests.post(form["url"], data=form["fields"], files={"file": ("f1", b"x" * 101)}, timeout=10)
    assert too_big.status_code == 403
    moved = requests.post(form["url"], data={**form["fields"], "key": "allowed/f2"}, files={"file": ("f", b"x")},
                          timeout=10)
    assert moved.status_code == 403
    other = s3.generate_presigned_post(w.bucket, "other/f1", ExpiresIn=300)
    refused_form = requests.post(other["url"], data=other["fields"], files={"file": ("f", b"x")}, timeout=10)
    assert refused_form.status_code == 403 and b"s3:PutObject" in refused_form.content
    # the SDK's own signed calls too
    assert s3.get_object(Bucket=w.bucket, Key="allowed/p1")["Body"].read() == b"payload"
    denied(lambda: s3.put_object(Bucket=w.bucket, Key="other/p2", Body=b"x"))


def test_state_machine_runs_the_function_with_its_role(world):
    """Step Functions invokes the worker as the machine's role; the worker's handler runs
    with its own role's session (named after the function)."""
    w = world
    sfn = client(w, "stepfunctions", w.admin)

    def run(table: str) -> dict:
        execution = sfn.start_execution(stateMachineArn=w.invoker, name=uuid.uuid4().hex,
                                        input=json.dumps({"table": table, "pk": uuid.uuid4().hex}))["executionArn"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            d = sfn.describe_execution(executionArn=execution)
            if d["status"] != "RUNNING":
                return d
            time.sleep(0.2)
        raise AssertionError("execution still running")

    done = run(w.table_a)
    assert done["status"] == "SUCCEEDED", done
    assert json.loads(done["output"]) == {"written": w.table_a}
    failed = run(w.table_b)
    assert failed["status"] == "FAILED"
    history = json.dumps(sfn.get_execution_history(executionArn=failed["executionArn"])["events"], default=str)
    assert "dynamodb:PutItem" in history and f"assumed-role/{w.worker_role}/{WORKER}" in history


def test_removing_a_statement_refuses_what_it_allowed(world):
    w = world
    sqs = client(w, "sqs")
    sqs.send_message(QueueUrl=w.queue_1, MessageBody="before")
    iam_roles.create_roles(_specs(w, with_sqs=False), w.url, w.deployer)
    try:
        denied(lambda: sqs.send_message(QueueUrl=w.queue_1, MessageBody="after"), "sqs:SendMessage",
               w.queue_1_arn, FUNCTION)
    finally:
        iam_roles.create_roles(w.specs, w.url, w.deployer)
    sqs.send_message(QueueUrl=w.queue_1, MessageBody="restored")


def test_unknown_credentials_are_refused(world):
    w = world
    stranger = boto3.Session(aws_access_key_id="AKIAUNKNOWNUNKNOWN00", aws_secret_access_key="x", region_name=REGION)
    with pytest.raises(ClientError) as err:
        client(w, "dynamodb", stranger).get_item(TableName=w.table_a, Key={"pk": {"S": "1"}})
    assert err.value.response["Error"]["Code"] in ("InvalidClientTokenId", "UnrecognizedClientException")


def test_access_log_and_least_privilege_report(world):
    w = world
    ddb = client(w, "dynamodb")
    ddb.get_item(TableName=w.table_a, Key={"pk": {"S": "1"}})
    denied(lambda: ddb.get_item(TableName=w.table_b, Key={"pk": {"S": "1"}}))
    entries = iam_report.read_log(w.access_log)
    mine = [e for e in entries if e["principal"].endswith(f"assumed-role/{w.fn_role}/{FUNCTION}")]
    assert {"action": "dynamodb:GetItem", "resource": w.table_a_arn, "allowed": True}.items() <= mine[-2].items()
    assert {"action": "dynamodb:GetItem", "resource": w.table_b_arn, "allowed": False}.items() <= mine[-1].items()
    usage = {u.principal: u for u in iam_report.usage(entries, iam_report.roles_policies(w.specs))}
    api = usage[f"arn:aws:sts::{ACCOUNT}:assumed-role/{w.fn_role}/{FUNCTION}"]
    assert api.session == FUNCTION and api.role == w.fn_role
    assert "dynamodb:GetItem" in api.used_actions and "dynamodb:DeleteItem" in api.allowed_actions
    assert "dynamodb:DeleteItem" in api.unused_allowed and "iam:PassRole" in api.unused_allowed
    assert "dynamodb:GetItem" not in api.unused_allowed and "s3:GetObject*" not in api.unused_allowed
    assert any(r["action"] == "dynamodb:GetItem" and r["resource"] == w.table_b_arn for r in api.refused)
    lines = iam_report.refusals(entries)
    assert any(line.startswith(f"{FUNCTION} (role {w.fn_role}): dynamodb:GetItem on {w.table_b_arn}")
               for line in lines)
    assert FUNCTION in iam_report.format_report([api])


# -- the evaluator alone ----------------------------------------------------------------------

def test_conditions_follow_aws_semantics():
    pass_role = {"Statement": [{"Effect": "Allow", "Action": "iam:PassRole", "Resource": "arn:aws:iam::1:role/f",
                                "Condition": {"StringEquals": {"iam:PassedToService": "states.amazonaws.com"}}},
                               {"Effect": "Allow", "Action": "sqs:*", "Resource": "*"}]}
    ev = iam_policy.evaluate
    assert ev([pass_role], "iam:PassRole", "arn:aws:iam::1:role/f",
              {"iam:PassedToService": "states.amazonaws.com"})[0] == iam_policy.ALLOW
    assert ev([pass_role], "iam:PassRole", "arn:aws:iam::1:role/f",
              {"iam:PassedToService": "ec2.amazonaws.com"})[0] == iam_policy.IMPLICIT
    # a key absent from the request: the statement does not apply, nothing else is affected
    assert ev([pass_role], "iam:PassRole", "arn:aws:iam::1:role/f", {})[0] == iam_policy.IMPLICIT
    assert ev([pass_role], "sqs:SendMessage", "arn:aws:sqs:r:1:q", {})[0] == iam_policy.ALLOW
    deny_unless = {"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"},
                                 {"Effect": "Deny", "Action": "s3:*", "Resource": "*",
                                  "Condition": {"StringNotEquals": {"aws:PrincipalAccount": "1"}}}]}
    assert ev([deny_unless], "s3:GetObject", "arn:aws:s3:::b/k", {"aws:PrincipalAccount": "1"})[0] == iam_policy.ALLOW
    assert ev([deny_unless], "s3:GetObject", "arn:aws:s3:::b/k", {"aws:PrincipalAccount": "2"})[0] == iam_policy.DENY
    assert ev([deny_unless], "s3:GetObject", "arn:aws:s3:::b/k", {})[0] == iam_policy.DENY  # negated: absent = true
    if_exists = {"Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*",
                                "Condition": {"StringEqualsIfExists": {"s3:prefix": "home/"}}}]}
    assert ev([if_exists], "s3:ListBucket", "arn:aws:s3:::b", {})[0] == iam_policy.ALLOW
    assert ev([if_exists], "s3:ListBucket", "arn:aws:s3:::b", {"s3:prefix": "etc/"})[0] == iam_policy.IMPLICIT
    not_resource = {"Statement": [{"Effect": "Allow", "NotAction": "iam:*", "NotResource": "arn:aws:s3:::secret/*"}]}
    assert ev([not_resource], "s3:GetObject", "arn:aws:s3:::public/k")[0] == iam_policy.ALLOW
    assert ev([not_resource], "s3:GetObject", "arn:aws:s3:::secret/k")[0] == iam_policy.IMPLICIT
    assert ev([not_resource], "iam:CreateUser", "*")[0] == iam_policy.IMPLICIT
    # wildcards: * and ?, actions case-insensitive, a "." in an ARN is no regex
    wild = {"Statement": [{"Effect": "Allow", "Action": "DynamoDB:Get*",
                           "Resource": "arn:aws:secretsmanager:r:1:secret:a.b-??????"}]}
    assert ev([wild], "dynamodb:GetItem", "arn:aws:secretsmanager:r:1:secret:a.b-AbC123")[0] == iam_policy.ALLOW
    assert ev([wild], "dynamodb:GetItem", "arn:aws:secretsmanager:r:1:secret:aXb-AbC123")[0] == iam_policy.IMPLICIT
    assert ev([wild], "dynamodb:GetItem", "arn:aws:secretsmanager:r:1:secret:a.b-AbC12")[0] == iam_policy.IMPLICIT


def test_trust_principals():
    role_trust = {"Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                 "Principal": {"AWS": "arn:aws:iam::1:role/api"}}]}
    session = iam_policy.Caller(arn="arn:aws:sts::1:assumed-role/api/fn", account="1",
                                role_arn="arn:aws:iam::1:role/api")
    stranger = iam_policy.Caller(arn="arn:aws:sts::1:assumed-role/other/fn", account="1",
                                 role_arn="arn:aws:iam::1:role/other")
    assert iam_policy.evaluate([role_trust], "sts:AssumeRole", "r", caller=session) == (iam_policy.ALLOW,
                                                                                        iam_policy.SPECIFIC_MATCH)
    assert iam_policy.evaluate([role_trust], "sts:AssumeRole", "r", caller=stranger)[0] == iam_policy.IMPLICIT
    service_trust = {"Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                    "Principal": {"Service": ["lambda.amazonaws.com"]}}]}
    lam = iam_policy.Caller(arn="lambda.amazonaws.com", account="", services=frozenset({"lambda.amazonaws.com"}))
    states = iam_policy.Caller(arn="states.amazonaws.com", account="", services=frozenset({"states.amazonaws.com"}))
    assert iam_policy.evaluate([service_trust], "sts:AssumeRole", "r", caller=lam)[0] == iam_policy.ALLOW
    assert iam_policy.evaluate([service_trust], "sts:AssumeRole", "r", caller=states)[0] == iam_policy.IMPLICIT
    account_trust = {"Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"AWS": "1"}}]}
    assert iam_policy.evaluate([account_trust], "sts:AssumeRole", "r", caller=session) == (iam_policy.ALLOW,
                                                                                           iam_policy.ACCOUNT_MATCH)
