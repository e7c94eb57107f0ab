"""The roles of the synthesized template in the embedded runtime's moto, and the
credentials the runtime works with once IAM is enforced. In order:

1. deployer_credentials(url): while enforcement is off, an IAM user allowed everything,
   tagged to stand in for AWS service principals in trust policies (moto_resources
   SERVICE_STAND_IN_TAG): the runtime provisions and does its own housekeeping with it.
2. create_roles(specs, url, credentials): each RoleSpec (resolved documents, plain JSON)
   created or brought up to date: trust policy, inline policies (policies no longer in
   the spec are deleted, so removing a statement or a policy takes effect), managed
   policies. AWS managed policies moto does not hold are skipped with a logged reason:
   the Lambda ones (AWSLambdaBasicExecutionRole, AWSLambdaVPCAccessExecutionRole) allow
   only logs, ec2 network-interface and xray calls the local runtime never makes.
3. enforce(url): moto checks every request from then on.
4. function_credentials(role_arn, session_name, ...): a session of a function's role,
   assumed by the deployer as Lambda assumes it on AWS (the trust policy must name
   lambda.amazonaws.com, or whichever service it names), as AWS_* environment variables.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.exceptions import ClientError

log = logging.getLogger("skyfn.iam")

DEPLOYER = "skyfn-deployer"
SERVICE_STAND_IN_TAG = "skyfn:service-stand-in"  # the same as moto_resources' (that module runs in moto)
ALLOW_ALL = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
# Before enforcement moto takes any signature; these keys only satisfy botocore.
_BOOTSTRAP = {"aws_access_key_id": "AKIAIOSFODNN7BOOTSTRP", "aws_secret_access_key": "bootstrap"}


@dataclass
class RoleSpec:
    """A role of the template, its documents resolved to plain JSON."""
    name: str
    assume_role_policy: dict
    policies: list[tuple[str, dict]] = field(default_factory=list)  # inline (name, document)
    managed_policy_arns: list[str] = field(default_factory=list)
    path: str = "/"
    description: str = ""


def role_spec(role) -> RoleSpec:
    """A role of the templates (infra.local.templates.model.Role, or anything with its
    fields) as the RoleSpec that create_roles takes."""
    return RoleSpec(role.name, role.assume_role_policy, policies=list(role.inline_policies.items()),
                    managed_policy_arns=list(role.managed_policy_arns), path=role.path,
                    description=role.description or "")


def _client(service: str, endpoint_url: str, credentials: dict | None, region: str):
    if credentials:
        kw = {"aws_access_key_id": credentials["AWS_ACCESS_KEY_ID"],
              "aws_secret_access_key": credentials["AWS_SECRET_ACCESS_KEY"]}
        if credentials.get("AWS_SESSION_TOKEN"):
            kw["aws_session_token"] = credentials["AWS_SESSION_TOKEN"]
    else:
        kw = dict(_BOOTSTRAP)
    return boto3.client(service, endpoint_url=endpoint_url, region_name=region, **kw)


def _code(exc: ClientError) -> str:
    return exc.response.get("Error", {}).get("Code", "")


def deployer_credentials(endpoint_url: str, user: str = DEPLOYER, region: str = "us-east-1") -> dict[str, str]:
    """AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY of `user`, allowed everything. Call it
    before enforce(): it creates the user, or replaces its keys, without credentials."""
    iam = _client("iam", endpoint_url, None, region)
    try:
        iam.create_user(UserName=user)
    except ClientError as exc:
        if _code(exc) != "EntityAlreadyExists":
            raise
    iam.put_user_policy(UserName=user, PolicyName="everything", PolicyDocument=json.dumps(ALLOW_ALL))
    iam.tag_user(UserName=user, Tags=[{"Key": SERVICE_STAND_IN_TAG, "Value": "*"}])
    for key in iam.list_access_keys(UserName=user)["AccessKeyMetadata"]:
        iam.delete_access_key(UserName=user, AccessKeyId=key["AccessKeyId"])
    key = iam.create_access_key(UserName=user)["AccessKey"]
    return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


def _is_aws_managed(arn: str) -> bool:
    return ":iam::aws:policy/" in arn


def create_roles(specs: list[RoleSpec], endpoint_url: str, credentials: dict | None = None,
                 region: str = "us-east-1") -> dict[str, Any]:
    """Create or update each role (idempotent). Answers {"roles": {name: arn},
    "skipped_managed": {name: [arn, ...]}} -- the AWS managed policies moto lacks."""
    iam = _client("iam", endpoint_url, credentials, region)
    arns: dict[str, str] = {}
    skipped: dict[str, list[str]] = {}
    for spec in specs:
        trust = json.dumps(spec.assume_role_policy)
        try:
            arns[spec.name] = iam.create_role(RoleName=spec.name, Path=spec.path or "/",
                                              AssumeRolePolicyDocument=trust,
                                              Description=spec.description or "")["Role"]["Arn"]
        except ClientError as exc:
            if _code(exc) != "EntityAlreadyExists":
                raise
            arns[spec.name] = iam.get_role(RoleName=spec.name)["Role"]["Arn"]
            iam.update_assume_role_policy(RoleName=spec.name, PolicyDocument=trust)
        wanted = dict(spec.policies)
        for name in iam.list_role_policies(RoleName=spec.name)["PolicyNames"]:
            if name not in wanted:
                iam.delete_role_policy(RoleName=spec.name, PolicyName=name)
        for name, document in wanted.items():
            iam.put_role_policy(RoleName=spec.name, PolicyName=name, PolicyDocument=json.dumps(document))
        attached = {p["PolicyArn"] for p in iam.list_attached_role_policies(RoleName=spec.name)["AttachedPolicies"]}
        for arn in attached - set(spec.managed_policy_arns):
            iam.detach_role_policy(RoleName=spec.name, PolicyArn=arn)
        for arn in spec.managed_policy_arns:
            if arn in attached:
                continue
            try:
                iam.attach_role_policy(RoleName=spec.name, PolicyArn=arn)
            except ClientError as exc:
                if _code(exc) not in ("NoSuchEntity", "NoSuchEntityException") or not _is_aws_managed(arn):
                    raise
                skipped.setdefault(spec.name, []).append(arn)
                log.info("role %s: AWS managed policy %s is not in moto (set MOTO_IAM_LOAD_MANAGED_POLICIES=true "
                         "to load them); skipped: it allows only logs/ec2/xray calls the local runtime never "
                         "makes", spec.name, arn)
    return {"roles": arns, "skipped_managed": skipped}


def enforce(endpoint_url: str, after: int = 0) -> str:
    """Switch moto's IAM enforcement on after `after` more requests; answers the previous
    setting. Every later request must be signed by known credentials their policies allow."""
    import requests

    answer = requests.post(f"{endpoint_url.rstrip('/')}/moto-api/reset-auth", data=str(int(after)).encode(),
                           timeout=10)
    answer.raise_for_status()
    return answer.json().get("PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT", "")


def relax(endpoint_url: str) -> str:
    """Switch enforcement off again (tests); answers the previous setting."""
    import requests

    answer = requests.post(f"{endpoint_url.rstrip('/')}/moto-api/reset-auth", data=b"inf", timeout=10)
    answer.raise_for_status()
    return answer.json().get("PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT", "")


def function_credentials(role_arn: str, session_name: str, duration: int = 43200, *, endpoint_url: str,
                         deployer: dict[str, str], policy: dict | None = None,
                         region: str = "us-east-1") -> dict[str, str]:
    """AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN of a session of
    `role_arn` named `session_name` (the function's name: refusals name it), assumed by
    the deployer; `policy`, a session policy, narrows it further."""
    sts = _client("sts", endpoint_url, deployer, region)
    kw: dict[str, Any] = {"RoleArn": role_arn, "RoleSessionName": session_name[:64], "DurationSeconds": duration}
    if policy is not None:
        kw["Policy"] = json.dumps(policy, separators=(",", ":"))
    creds = sts.assume_role(**kw)["Credentials"]
    return {"AWS_ACCESS_KEY_ID": creds["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
            "AWS_SESSION_TOKEN": creds["SessionToken"]}


def session(credentials: dict[str, str], region: str = "us-east-1") -> boto3.Session:
    """A boto3 session with the AWS_* credentials of deployer_credentials/function_credentials."""
    return boto3.Session(aws_access_key_id=credentials["AWS_ACCESS_KEY_ID"],
                         aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"],
                         aws_session_token=credentials.get("AWS_SESSION_TOKEN"), region_name=region)
