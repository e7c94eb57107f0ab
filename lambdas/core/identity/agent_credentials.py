"""Credentials of an endpoint agent in the AWS deployment: the service assumes the agent
role (infra/aws, stack AgentAccess) with a *session policy* that narrows the role's
prefix-wide permissions to one endpoint's queues, and hands the temporary credentials
to that endpoint's agent. The effective permissions are the intersection of the role's
policy and the session policy, so a leaked session reaches one endpoint's queues only.

What a session allows:
- on the endpoint's task and control queues (`<prefix>-tasks-<id>`, `<prefix>-control-<id>`):
  sqs:ReceiveMessage, sqs:DeleteMessage, sqs:ChangeMessageVisibility (the service creates
  the queues, so the agent never reads their attributes);
- on the results queue (`<prefix>-results`): sqs:SendMessage (results go back through it).
Nothing else: not other endpoints' queues, not the dead-letter queues, no queue management.
"""
from __future__ import annotations

import json
import re
from typing import Any

CONSUME_ACTIONS = ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility")
RESULT_ACTIONS = ("sqs:SendMessage",)
# STS rejects session policies over 2,048 characters (plain text, whitespace removed).
MAX_POLICY_CHARS = 2048
MAX_SESSION_SECONDS = 3600  # role chaining (a Lambda role assuming a role) caps sessions at 1 h

_PREFIX = re.compile(r"^arn:aws[a-z-]*:sqs:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,60}$")
_ENDPOINT = re.compile(r"^[A-Za-z0-9-]{1,64}$")


def queue_arns(queue_arn_prefix: str, endpoint_id: str) -> dict[str, str]:
    """ARNs of the endpoint's queues, named as lambdas/config.Settings names them for SQS."""
    if not isinstance(queue_arn_prefix, str) or not _PREFIX.match(queue_arn_prefix):
        raise ValueError(f"queue_arn_prefix {queue_arn_prefix!r} is not an SQS ARN prefix like "
                         "'arn:aws:sqs:us-east-1:123456789012:skyfn-prod' (no wildcards)")
    if not isinstance(endpoint_id, str) or not _ENDPOINT.match(endpoint_id):
        # Wildcards or separators here would widen the session to other endpoints' queues.
        raise ValueError(f"endpoint id {endpoint_id!r} must be 1-64 letters, digits or '-' (no wildcards)")
    return {"tasks": f"{queue_arn_prefix}-tasks-{endpoint_id}",
            "control": f"{queue_arn_prefix}-control-{endpoint_id}",
            "results": f"{queue_arn_prefix}-results"}


def session_policy(queue_arn_prefix: str, endpoint_id: str) -> dict[str, Any]:
    """The session policy document of one endpoint's agent."""
    arns = queue_arns(queue_arn_prefix, endpoint_id)
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ConsumeOwnQueues", "Effect": "Allow", "Action": list(CONSUME_ACTIONS),
             "Resource": [arns["tasks"], arns["control"]]},
            {"Sid": "ReturnResults", "Effect": "Allow", "Action": list(RESULT_ACTIONS),
             "Resource": [arns["results"]]},
        ],
    }


def session_policy_json(queue_arn_prefix: str, endpoint_id: str) -> str:
    """The policy as STS takes it (compact JSON), checked against STS's size limit."""
    text = json.dumps(session_policy(queue_arn_prefix, endpoint_id), separators=(",", ":"))
    if len(text) > MAX_POLICY_CHARS:
        raise ValueError(f"session policy of {len(text)} characters exceeds STS's {MAX_POLICY_CHARS}: "
                         "shorten the queue name prefix")
    return text


def assume_agent_role(sts: Any, role_arn: str, queue_arn_prefix: str, endpoint_id: str,
                      duration_seconds: int = MAX_SESSION_SECONDS) -> dict[str, Any]:
    """Temporary credentials for one endpoint's agent: {access_key_id, secret_access_key,
    session_token, expiration (ISO 8601)}. `sts` is a boto3 STS client."""
    if not 900 <= duration_seconds <= MAX_SESSION_SECONDS:
        raise ValueError(f"duration_seconds must be between 900 and {MAX_SESSION_SECONDS}, not {duration_seconds}")
    answer = sts.assume_role(RoleArn=role_arn, RoleSessionName=f"endpoint-{endpoint_id}"[:64],
                             Policy=session_policy_json(queue_arn_prefix, endpoint_id),
                             DurationSeconds=duration_seconds)
    creds = answer["Credentials"]
    expiration = creds["Expiration"]
    return {"access_key_id": creds["AccessKeyId"], "secret_access_key": creds["SecretAccessKey"],
            "session_token": creds["SessionToken"],
            "expiration": expiration.isoformat() if hasattr(expiration, "isoformat") else str(expiration)}
