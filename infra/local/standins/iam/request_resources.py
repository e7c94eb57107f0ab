"""The resources of a request, as IAM checks them, for moto's response classes
(infra.local.standins.iam.moto_resources installs them; runs inside the moto server).

moto evaluates a statement's Resource only against what a response class's
`_determine_resource()` returns, else "*", which no ARN-scoped statement matches. Each
function here returns the checks AWS makes for one request -- (IAM action, resource ARN,
extra context) -- e.g. one per table of a BatchWriteItem, one per item of a
TransactWriteItems with the item's own action, the index ARN of a Query on an index, the
implicit iam:PassRole (iam:PassedToService=states.amazonaws.com) of CreateStateMachine.
SQS's and STS's own are extended.
"""
from __future__ import annotations

import json
from urllib.parse import unquote

Check = tuple  # (iam action or None for the request's own, resource ARN, extra context dict)


# -- helpers over a moto response object -----------------------------------------------------

def _params(resp) -> dict:
    for candidate in (getattr(resp, "params", None), getattr(resp, "body", None)):
        if isinstance(candidate, dict) and candidate:
            return candidate
    raw = getattr(resp, "body", None) or getattr(resp, "raw_body", None)
    if isinstance(raw, (bytes, str)) and raw:
        try:
            parsed = json.loads(raw)
            if isinstance(parsed, dict):
                return parsed
        except ValueError:
            pass
    return {k: v[0] for k, v in (getattr(resp, "querystring", None) or {}).items() if v}


def _arn(resp, service: str, rest: str) -> str:
    from moto.utilities.utils import get_partition

    return f"arn:{get_partition(resp.region)}:{service}:{resp.region}:{resp.current_account}:{rest}"


# -- 1. request resources per service --------------------------------------------------------

def _table_arn(resp, name: str) -> str:
    return name if str(name).startswith("arn:") else _arn(resp, "dynamodb", f"table/{name}")


_TRANSACT_ACTIONS = {"Put": "dynamodb:PutItem", "Update": "dynamodb:UpdateItem", "Delete": "dynamodb:DeleteItem",
                     "ConditionCheck": "dynamodb:ConditionCheckItem", "Get": "dynamodb:GetItem"}


def dynamodb_resource(resp) -> list[Check]:
    p, action = _params(resp), resp._get_action()
    if action in ("BatchGetItem", "BatchWriteItem"):
        return [(None, _table_arn(resp, t), {}) for t in (p.get("RequestItems") or {})] or [(None, "*", {})]
    if action in ("TransactWriteItems", "TransactGetItems"):
        checks = []
        for item in p.get("TransactItems") or []:
            for kind, body in item.items():
                if kind in _TRANSACT_ACTIONS and isinstance(body, dict):
                    checks.append((_TRANSACT_ACTIONS[kind], _table_arn(resp, body.get("TableName")), {}))
        return checks or [(None, "*", {})]
    table = p.get("TableName") or p.get("ResourceArn")
    if not table:
        return [(None, "*", {})]
    arn = _table_arn(resp, table)
    if action in ("Query", "Scan") and p.get("IndexName"):
        arn = f"{arn}/index/{p['IndexName']}"
    return [(None, arn, {})]


def stepfunctions_resource(resp) -> list[Check]:
    p, action = _params(resp), resp._get_action()
    checks: list[Check] = []
    if action == "CreateStateMachine" and p.get("name"):
        checks.append((None, _arn(resp, "states", f"stateMachine:{p['name']}"), {}))
    for key in ("stateMachineArn", "executionArn", "resourceArn", "mapRunArn", "activityArn"):
        if p.get(key):
            checks.append((None, p[key], {}))
            break
    if not checks:
        checks.append((None, "*", {}))
    if action in ("CreateStateMachine", "UpdateStateMachine") and p.get("roleArn"):
        checks.append(("iam:PassRole", p["roleArn"], {"iam:PassedToService": "states.amazonaws.com"}))
    return checks


def _secret_arn(resp, secret_id: str) -> str:
    if str(secret_id).startswith("arn:"):
        return secret_id
    try:
        from moto.secretsmanager.models import secretsmanager_backends

        return secretsmanager_backends[resp.current_account][resp.region].describe_secret(secret_id).arn
    except Exception:
        return _arn(resp, "secretsmanager", f"secret:{secret_id}")


def secretsmanager_resource(resp) -> list[Check]:
    p, action = _params(resp), resp._get_action()
    if action == "BatchGetSecretValue" and p.get("SecretIdList"):
        return [(None, _secret_arn(resp, s), {}) for s in p["SecretIdList"]]
    if action == "CreateSecret" and p.get("Name"):
        return [(None, _arn(resp, "secretsmanager", f"secret:{p['Name']}"), {})]
    secret = p.get("SecretId")
    return [(None, _secret_arn(resp, secret) if secret else "*", {})]


def lambda_resource(resp) -> list[Check]:
    path = unquote(resp.path.split("?")[0])
    marker = "/functions/"
    if marker not in path:
        return [(None, "*", {})]
    name = path.split(marker, 1)[1]
    name = name.rsplit("/", 1)[0] if name.endswith(("/invocations", "/invoke-async", "/configuration", "/code",
                                                     "/policy", "/concurrency", "/url", "/versions")) else name
    name = name.rstrip("/")
    if not name.startswith("arn:"):
        name = _arn(resp, "lambda", f"function:{name}")
    qualifier = (getattr(resp, "querystring", None) or {}).get("Qualifier", [None])[0]
    return [(None, f"{name}:{qualifier}" if qualifier and name.count(":") == 6 else name, {})]


def sqs_resource(resp, original) -> list[Check]:
    """moto's own finds an existing queue's ARN; CreateQueue (and a queue not there yet)
    are authorized on AWS against the ARN the queue has or will have."""
    action = resp._get_action()
    if action == "CreateQueue":
        name = _params(resp).get("QueueName")
        return [(None, _arn(resp, "sqs", name) if name else "*", {})]
    found = original(resp)
    if found == "*" and action not in ("ListQueues",):
        try:
            name = resp._get_queue_name()
        except Exception:
            name = ""
        if name:
            return [(None, _arn(resp, "sqs", name), {})]
    return [(None, found, {})]


def sts_resource(resp, original) -> list[Check]:
    found = original(resp)
    context = {}
    if found != "*":
        params = {k: v[0] for k, v in (resp.querystring or {}).items() if v}
        for key, ctx in (("RoleSessionName", "sts:RoleSessionName"), ("ExternalId", "sts:ExternalId")):
            if params.get(key):
                context[ctx] = params[key]
    return [(None, found, context)]


def install() -> None:
    """Give moto's response classes the resources of their requests (idempotent)."""
    from moto.awslambda.responses import LambdaResponse
    from moto.dynamodb.responses import DynamoHandler
    from moto.secretsmanager.responses import SecretsManagerResponse
    from moto.sqs.responses import SQSResponse
    from moto.stepfunctions.responses import StepFunctionResponse
    from moto.sts.responses import TokenResponse

    DynamoHandler._determine_resource = dynamodb_resource
    StepFunctionResponse._determine_resource = stepfunctions_resource
    SecretsManagerResponse._determine_resource = secretsmanager_resource
    LambdaResponse._determine_resource = lambda_resource
    for cls, fn in ((SQSResponse, sqs_resource), (TokenResponse, sts_resource)):
        original = cls.__dict__["_determine_resource"]
        if not getattr(original, "_skyfn", False):
            def determine(self, _original=original, _fn=fn):
                return _fn(self, _original)
            determine._skyfn = True
            cls._determine_resource = determine
