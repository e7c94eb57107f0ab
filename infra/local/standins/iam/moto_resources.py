"""IAM enforcement in the moto server faithful enough to run skyfn's synthesized roles:
runs inside the moto process (infra.local.standins.sfn.moto_bridge calls install() when
SKYFN_MOTO_IAM_RESOURCES=1). moto switches enforcement on with POST /moto-api/reset-auth
(infra.local.standins.iam.roles.enforce); until then nothing here refuses anything.

What moto does and what is patched here, each for a reason:

1. Request resources (infra.local.standins.iam.request_resources): moto evaluates a statement's
   Resource only against a response class's `_determine_resource()`, else "*"; those of
   DynamoDB, Step Functions, Secrets Manager and Lambda are added, SQS's and STS's extended.
2. Evaluation. IAMRequestBase.check_action_permitted is replaced by infra.local.standins.iam.policy
   (moto's own: no NotResource, a failed Condition counted as an explicit Deny even on an
   Allow statement, Service principals of trust policies unsupported, the session policy
   of AssumeRole ignored). A session's permissions are the intersection of its role's
   policies and its session policy; sts:AssumeRole also needs the role's trust policy;
   sessions past their expiration are refused; API names map to IAM actions where they
   differ (lambda Invoke -> lambda:InvokeFunction, sqs *Batch -> the single action, S3
   ListObjectsV2 -> s3:ListBucket...). A refusal names the principal, the action and the
   resource, as AWS does.
3. Presigned S3 URLs. moto reads the Authorization header of every request it
   authorizes; a presigned URL has none (its signature is in the query string). Its
   SigV4 query signature and expiry are checked here and the request is authorized as
   the signer, as S3 does.
4. Service principals. On AWS, Lambda and Step Functions assume a function's or state
   machine's role. Here service_credentials() does it through the STS backend after
   checking the role's trust policy names the service; the state machine interpreter's
   clients (moto signs them with the fixed key "ak") use the machine's role, and the
   bridge's execution environments get their function's role (function_env).

Every authorized or refused check is appended to $SKYFN_IAM_ACCESS_LOG (JSON lines:
time, principal, action, resource, allowed, reason, api) when that variable is set.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
from typing import Any
from urllib.parse import parse_qsl

from infra.local.standins.iam import policy as iam_policy
from infra.local.standins.iam import request_resources

log = logging.getLogger("skyfn.iam")

ENABLE_ENV = "SKYFN_MOTO_IAM_RESOURCES"
ACCESS_LOG_ENV = "SKYFN_IAM_ACCESS_LOG"
# An IAM user carrying this tag stands in for the AWS service principals it lists ("*": all)
# in trust policies: the deployer, which assumes functions' roles as Lambda would.
SERVICE_STAND_IN_TAG = "skyfn:service-stand-in"
STATES_SESSION = "StepFunctions"

Check = request_resources.Check


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "").lower() in ("1", "true", "yes")


# -- 2. evaluation ---------------------------------------------------------------------------

# API operation -> IAM action, where they differ.
ACTION_NAMES = {
    "lambda:Invoke": "lambda:InvokeFunction",
    "sqs:SendMessageBatch": "sqs:SendMessage", "sqs:DeleteMessageBatch": "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibilityBatch": "sqs:ChangeMessageVisibility",
    "s3:ListObjects": "s3:ListBucket", "s3:ListObjectsV2": "s3:ListBucket", "s3:HeadBucket": "s3:ListBucket",
    "s3:HeadObject": "s3:GetObject", "s3:SelectObjectContent": "s3:GetObject",
    "s3:ListObjectVersions": "s3:ListBucketVersions", "s3:ListMultipartUploads": "s3:ListBucketMultipartUploads",
    "s3:ListParts": "s3:ListMultipartUploadParts", "s3:CreateMultipartUpload": "s3:PutObject",
    "s3:UploadPart": "s3:PutObject", "s3:UploadPartCopy": "s3:PutObject", "s3:CompleteMultipartUpload": "s3:PutObject",
    "s3:CopyObject": "s3:PutObject", "s3:DeleteObjects": "s3:DeleteObject", "s3:ListBuckets": "s3:ListAllMyBuckets",
    "s3:GetBucketCors": "s3:GetBucketCORS", "s3:PutBucketCors": "s3:PutBucketCORS",
    "s3:GetBucketLifecycleConfiguration": "s3:GetLifecycleConfiguration",
    "s3:PutBucketLifecycleConfiguration": "s3:PutLifecycleConfiguration",
    "s3:GetBucketNotificationConfiguration": "s3:GetBucketNotification",
    "s3:PutBucketNotificationConfiguration": "s3:PutBucketNotification",
    "s3:GetBucketEncryption": "s3:GetEncryptionConfiguration", "s3:PutBucketEncryption": "s3:PutEncryptionConfiguration",
    "s3:GetBucketAccelerateConfiguration": "s3:GetAccelerateConfiguration",
    "s3:GetBucketReplication": "s3:GetReplicationConfiguration",
    "s3:GetObjectLockConfiguration": "s3:GetBucketObjectLockConfiguration",
    "s3:GetBucketOwnershipControls": "s3:GetBucketOwnershipControls",
    "s3:GetObjectAttributes": "s3:GetObjectAttributes",
}

_log_lock = threading.Lock()


def access_log(entry: dict) -> None:
    path = os.environ.get(ACCESS_LOG_ENV)
    if not path:
        return
    line = json.dumps(entry, separators=(",", ":")) + "\n"
    with _log_lock, open(path, "a", encoding="utf-8") as f:
        f.write(line)


def _documents(moto_policies) -> list[dict]:
    from moto.iam.access_control import IAMPolicy

    docs = []
    for p in moto_policies:
        try:
            docs.append(IAMPolicy(p)._policy_json)
        except Exception:  # an AWS managed policy moto has no document for
            log.warning("policy %r has no readable document: not evaluated", p)
    return docs


def _assumed_role(account: str, partition: str, access_key_id: str):
    from moto.sts.models import sts_backends

    return sts_backends[account][partition].get_assumed_role_from_access_key(access_key_id)


def _caller(req) -> tuple[iam_policy.Caller, list[dict], list[dict], Any]:
    """The caller, its identity policies, its session policies and its session (if any)."""
    from moto.iam.access_control import AssumedRoleAccessKey

    key = req._access_key
    account, partition = key.account_id, key.partition
    if isinstance(key, AssumedRoleAccessKey):
        session = _assumed_role(account, partition, key._access_key_id)
        role_arn = session.role_arn if session else None
        caller = iam_policy.Caller(arn=key.arn, account=account, role_arn=role_arn)
        session_docs = [iam_policy.load(session.policy)] if session is not None and session.policy else []
        return caller, _documents(key.collect_policies()), session_docs, session
    services: frozenset = frozenset()
    try:
        for tag in key.backend.list_user_tags(key._owner_user_name):
            if tag.get("Key") == SERVICE_STAND_IN_TAG:
                services = frozenset(s.strip() for s in str(tag.get("Value", "")).split(",") if s.strip())
    except Exception:
        pass
    caller = iam_policy.Caller(arn=key.arn, account=account, services=services)
    return caller, _documents(key.collect_policies()), [], None


def _context(req, caller: iam_policy.Caller, extra: dict) -> dict:
    now = dt.datetime.now(dt.timezone.utc)
    ctx = {"aws:PrincipalArn": caller.role_arn or caller.arn, "aws:PrincipalAccount": caller.account,
           "aws:PrincipalType": "AssumedRole" if caller.role_arn else "User",
           "aws:CurrentTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "aws:EpochTime": str(int(now.timestamp())),
           "aws:SecureTransport": "false", "aws:RequestedRegion": req._region}
    if not caller.role_arn:
        ctx["aws:username"] = caller.arn.rsplit("/", 1)[-1]
    ctx.update(extra or {})
    return ctx


def decide(req, action: str, resource: str, extra: dict | None = None) -> tuple[bool, str]:
    """(allowed, why) for one check of the request `req` (a moto IAMRequestBase)."""
    caller, identity, session_docs, session = _caller(req)
    if session is not None and session.expiration < dt.datetime.now(dt.timezone.utc).replace(tzinfo=None):
        return False, "the session has expired"
    ctx = _context(req, caller, extra or {})
    d_identity, _ = iam_policy.evaluate(identity, action, resource, ctx)
    if d_identity == iam_policy.DENY:
        return False, "with an explicit deny in an identity-based policy"
    if action.lower() == "sts:assumerole" and ":role/" in resource:
        try:
            role = req.backend.get_role_by_arn(resource)
        except Exception:
            role = None
        if role is None:
            return False, "because the role does not exist"
        d_trust, level = iam_policy.evaluate([iam_policy.load(role.assume_role_policy_document)], action,
                                             resource, ctx, caller)
        if d_trust != iam_policy.ALLOW:
            return False, "because the role's trust policy does not allow it"
        if level != iam_policy.SPECIFIC_MATCH and d_identity != iam_policy.ALLOW:
            return False, f"because no identity-based policy allows the {action} action"
    elif d_identity != iam_policy.ALLOW:
        return False, f"because no identity-based policy allows the {action} action"
    if session_docs:
        d_session, _ = iam_policy.evaluate(session_docs, action, resource, ctx)
        if d_session == iam_policy.DENY:
            return False, "with an explicit deny in a session policy"
        if d_session != iam_policy.ALLOW:
            return False, f"because no session policy allows the {action} action"
    return True, "allowed"


def _expand(req, resource) -> list[Check]:
    own = ACTION_NAMES.get(req._action, req._action)
    checks = resource if isinstance(resource, list) else [(None, resource, {})]
    out = [(action or own, res, ctx or {}) for action, res, ctx in checks]
    if req._action == "s3:DeleteObjects":
        out = _delete_objects_checks(req, out)
    return out


def _delete_objects_checks(req, checks: list[Check]) -> list[Check]:
    """S3 authorizes each key of a DeleteObjects as an s3:DeleteObject on that object."""
    import xmltodict

    try:
        body = xmltodict.parse(req._body or b"")
        objects = body.get("Delete", {}).get("Object", [])
        keys = [o["Key"] for o in (objects if isinstance(objects, list) else [objects])]
    except Exception:
        return checks
    bucket = checks[0][1]
    return [("s3:DeleteObject", f"{bucket}/{k}", {}) for k in keys] or checks


def check_action_permitted(self, resource) -> None:
    """Replaces IAMRequestBase.check_action_permitted (see the module docstring, 2)."""
    if self._action == "sts:GetCallerIdentity":  # always allowed, as on AWS
        return
    for action, res, extra in _expand(self, resource):
        allowed, why = decide(self, action, res, extra)
        access_log({"time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"),
                    "principal": self._access_key.arn, "action": action, "resource": res, "allowed": allowed,
                    "reason": why, "api": self._action})
        if not allowed:
            message = (f"User: {self._access_key.arn} is not authorized to perform: {action} "
                       f"on resource: {res} {why}")
            log.warning("AccessDenied: %s", message)
            raise _denied(self, message)


def _denied(req, message: str) -> Exception:
    from moto.core.exceptions import JsonRESTError, _RESTError

    if req._service == "s3":
        from moto.s3.exceptions import S3ClientError

        err = S3ClientError("AccessDenied", message)
        if "BucketName" in req._data:
            err.bucket_name = req._data["BucketName"]
        return err
    if _json_protocol(req._headers):  # SQS keeps its query-protocol code under JSON
        err = JsonRESTError("AccessDenied" if req._service == "sqs" else "AccessDeniedException", message)
    else:
        err = _RESTError("AccessDenied", message)
    err.code = 403
    return err


def _json_protocol(headers) -> bool:
    return bool(headers.get("X-Amz-Target") or headers.get("x-amz-target"))


def _json_errors(method):
    """moto answers authentication failures in XML, which JSON-protocol clients (DynamoDB,
    Step Functions, Secrets Manager, SQS) cannot read: the same error in JSON for them."""
    from moto.core.exceptions import _RESTError

    def raise_error(self, *args):
        try:
            method(self, *args)
        except _RESTError as exc:
            if not _json_protocol(self._headers):
                raise
            err = exc.to_json()
            err.code = exc.code
            raise err from None
    raise_error._skyfn = True
    return raise_error


# -- 3. presigned S3 URLs and forms -------------------------------------------------------------

def _field(fields: dict, name: str):
    for k, v in fields.items():
        if k.lower() == name.lower():
            return v[0] if isinstance(v, list) else v
    return None


def _post_policy_violation(policy: dict, fields: dict, bucket: str, size: int) -> str | None:
    """Why a presigned POST's form breaks its signed policy, else None (S3's checks of
    expiration, exact and starts-with field conditions and content-length-range)."""
    try:
        expires = dt.datetime.fromisoformat(str(policy["expiration"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return "the policy has no valid expiration"
    if dt.datetime.now(dt.timezone.utc) > expires:
        return "the policy has expired"

    def value(name: str) -> str:
        name = name.lstrip("$")
        return bucket if name.lower() == "bucket" else str(_field(fields, name) or "")

    for cond in policy.get("conditions", []):
        if isinstance(cond, dict):
            for name, wanted in cond.items():
                if value(name) != str(wanted):
                    return f"the field {name} does not match the policy"
        elif isinstance(cond, list) and cond and str(cond[0]).lower() == "content-length-range":
            if not int(cond[1]) <= size <= int(cond[2]):
                return f"the content length {size} is outside {cond[1]}..{cond[2]}"
        elif isinstance(cond, list) and len(cond) == 3:
            op, name, wanted = str(cond[0]).lower(), str(cond[1]), str(cond[2])
            if (op == "eq" and value(name) != wanted) or (op == "starts-with" and not value(name).startswith(wanted)):
                return f"the field {name.lstrip('$')} does not match the policy"
    return None


def _presigned_request_classes():
    import base64
    import hashlib
    import hmac

    from botocore.auth import S3SigV4QueryAuth
    from botocore.awsrequest import AWSRequest
    from moto.iam.access_control import CreateAccessKeyFailure, S3IAMRequest, create_access_key
    from moto.s3.exceptions import S3ClientError
    from moto.utilities.utils import get_partition

    class _Signed(S3IAMRequest):
        """An S3 request whose SigV4 signature is not in an Authorization header."""

        def _setup(self, account_id, method, path, data, body, headers, action, credential: str, token):
            self.account_id = account_id
            self._method, self._path, self._data, self._body, self._headers = method, path, data, body, headers
            parts = (credential or "").split("/")
            if len(parts) < 5:
                raise S3ClientError("AuthorizationQueryParametersError", "the credential is malformed")
            self._credential = parts
            self._region, self._service = parts[2], parts[3]
            self._action = f"{self._service}:{action[0] if isinstance(action, list) else action}"
            key_headers = dict(headers)
            if token:
                key_headers["X-Amz-Security-Token"] = token
            try:
                self._access_key = create_access_key(account_id=account_id, partition=get_partition(self._region),
                                                     access_key_id=parts[0], headers=key_headers)
            except CreateAccessKeyFailure as e:
                self._raise_invalid_access_key(e.reason)

    class PresignedURL(_Signed):
        """A presigned URL: SigV4 query-string signature, checked with its expiry."""

        def __init__(self, account_id, method, path, data, body, headers, action):
            self._query = dict(parse_qsl(path.partition("?")[2], keep_blank_values=True))
            self._setup(account_id, method, path, data, body, headers, action, self._query.get("X-Amz-Credential"),
                        self._query.get("X-Amz-Security-Token"))

        def check_signature(self) -> None:
            q = self._query
            try:
                signed_at = dt.datetime.strptime(q["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.timezone.utc)
                expires = int(q.get("X-Amz-Expires", "604800"))
            except (KeyError, ValueError):
                raise S3ClientError("AuthorizationQueryParametersError", "X-Amz-Date or X-Amz-Expires is malformed")
            if dt.datetime.now(dt.timezone.utc) > signed_at + dt.timedelta(seconds=expires):
                raise S3ClientError("AccessDenied", "Request has expired")
            names = [h for h in q.get("X-Amz-SignedHeaders", "host").split(";") if h]
            lowered = {k.lower(): v for k, v in self._headers.items()}
            headers = {n: lowered.get(n, "") for n in names}
            raw_path, _, raw_query = self._path.partition("?")
            kept = "&".join(part for part in raw_query.split("&") if not part.startswith("X-Amz-Signature="))
            request = AWSRequest(method=self._method, url=f"http://{lowered.get('host', '')}{raw_path}?{kept}",
                                 headers=headers)
            request.context["timestamp"] = q["X-Amz-Date"]
            auth = S3SigV4QueryAuth(self._access_key.create_credentials(), self._service, self._region,
                                    expires=expires)
            canonical = auth.canonical_request(request)
            expected = auth.signature(auth.string_to_sign(request, canonical), request)
            if not hmac.compare_digest(expected, q.get("X-Amz-Signature", "")):
                self._raise_signature_does_not_match()

    class PresignedPost(_Signed):
        """A presigned POST form: the signature covers its base64 policy, whose conditions
        the form must meet."""

        def __init__(self, account_id, method, path, data, body, headers, action, fields, bucket):
            self._fields, self._bucket = fields, bucket
            self._setup(account_id, method, path, data, body, headers, action, _field(fields, "x-amz-credential"),
                        _field(fields, "x-amz-security-token"))

        def check_signature(self) -> None:
            policy_b64 = str(_field(self._fields, "policy") or "")
            secret = self._access_key.create_credentials().secret_key
            date, region, service = self._credential[1], self._credential[2], self._credential[3]
            key = ("AWS4" + secret).encode()
            for part in (date, region, service, "aws4_request"):
                key = hmac.new(key, part.encode(), hashlib.sha256).digest()
            expected = hmac.new(key, policy_b64.encode(), hashlib.sha256).hexdigest()
            if not hmac.compare_digest(expected, str(_field(self._fields, "x-amz-signature") or "")):
                self._raise_signature_does_not_match()
            try:
                policy = json.loads(base64.b64decode(policy_b64))
            except ValueError:
                raise S3ClientError("InvalidPolicyDocument", "Invalid Policy: Invalid JSON.")
            body = self._body if isinstance(self._body, (bytes, str)) else b""
            why = _post_policy_violation(policy, self._fields, self._bucket, len(body))
            if why:
                raise S3ClientError("AccessDenied", f"Invalid according to Policy: {why}")

    return PresignedURL, PresignedPost


def _install_authentication() -> None:
    from urllib.parse import urlparse

    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.core.exceptions import _RESTError
    from moto.iam.access_control import IAMRequest, IAMRequestBase, S3IAMRequest

    IAMRequestBase.check_action_permitted = check_action_permitted
    for name in ("_raise_invalid_access_key", "_raise_signature_does_not_match"):
        if not getattr(IAMRequest.__dict__[name], "_skyfn", False):
            setattr(IAMRequest, name, _json_errors(IAMRequest.__dict__[name]))
    original = ActionAuthenticatorMixin.__dict__["_authenticate_and_authorize_action"]
    if getattr(original, "_skyfn", False):
        return
    presigned_url, presigned_post = _presigned_request_classes()

    def authenticate_and_authorize(self, iam_request_cls, resource="*"):
        enforced = ActionAuthenticatorMixin.request_count >= settings.INITIAL_NO_AUTH_ACTION_COUNT
        if not enforced or "Authorization" in self.headers:
            return original(self, iam_request_cls, resource)
        if self.headers.get("X-Amz-Target") in ActionAuthenticatorMixin.PUBLIC_OPERATIONS:
            return None
        query = urlparse(self.uri).query
        path = self.raw_path + ("?" + query if query else "")
        common = dict(account_id=self.current_account, method=self.method, path=path, data=self.data,
                      body=self.raw_body, headers=self.headers)
        fields = self.querystring or {}
        if iam_request_cls is S3IAMRequest and "X-Amz-Signature" in fields:
            request = presigned_url(action=self._get_action(), **common)
        elif iam_request_cls is S3IAMRequest and self.method == "POST" and _field(fields, "x-amz-signature"):
            bucket = resource.split(":::", 1)[-1].split("/", 1)[0]
            common["body"] = self.body
            request = presigned_post(action="PutObject", fields=fields, bucket=bucket, **common)
            resource = f"{resource.split('/', 1)[0]}/{_field(fields, 'key')}"
        else:
            # moto would fail with a KeyError (HTTP 500) on an unsigned request; AWS refuses it.
            err = _RESTError("MissingAuthenticationToken", "Request is missing Authentication Token")
            err.code = 403
            raise err
        request.check_signature()
        request.check_action_permitted(resource)
        return None

    authenticate_and_authorize._skyfn = True
    ActionAuthenticatorMixin._authenticate_and_authorize_action = authenticate_and_authorize


# -- 4. service principals ---------------------------------------------------------------------

_credentials: dict[tuple[str, str], Any] = {}
_credentials_lock = threading.Lock()


def service_credentials(role_arn: str, session_name: str, service: str, duration: int = 43200) -> dict[str, str]:
    """AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN of a session of `role_arn`
    assumed by the AWS service principal `service` (lambda.amazonaws.com...), as that
    service does on AWS: refused (PermissionError) unless the role's trust policy allows
    the service sts:AssumeRole. Reused until 80% of `duration` has passed."""
    from moto.iam.models import iam_backends
    from moto.sts.models import sts_backends

    parts = role_arn.split(":")
    if len(parts) < 6 or not parts[5].startswith("role/"):
        raise ValueError(f"{role_arn!r} is not a role ARN")
    partition, account = parts[1], parts[4]
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    with _credentials_lock:
        cached = _credentials.get((role_arn, session_name))
        if cached is not None and cached[0] > now:
            return cached[1]
        role = iam_backends[account][partition].get_role_by_arn(role_arn)
        caller = iam_policy.Caller(arn=service, account="", services=frozenset({service}))
        decision, _ = iam_policy.evaluate([iam_policy.load(role.assume_role_policy_document)], "sts:AssumeRole",
                                          role_arn, {}, caller)
        if decision != iam_policy.ALLOW:
            raise PermissionError(f"{service} is not authorized to perform: sts:AssumeRole on resource: {role_arn} "
                                  "because the role's trust policy does not allow it")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        session = sts_backends[account][partition].assume_role(
            region_name=region, role_session_name=session_name[:64], role_arn=role_arn, policy=None,
            duration=duration, external_id=None)
        env = {"AWS_ACCESS_KEY_ID": session.access_key_id, "AWS_SECRET_ACCESS_KEY": session.secret_access_key,
               "AWS_SESSION_TOKEN": session.session_token}
        _credentials[(role_arn, session_name)] = (now + dt.timedelta(seconds=duration * 0.8), env)
        log.info("%s assumed %s as session %s", service, role_arn, session_name)
        return env


def function_env(fn) -> dict[str, str]:
    """The credentials the execution environments of the moto Lambda function `fn` run
    with: a session of its role named after the function, assumed as Lambda. Empty when
    enforcement support is off or the function has no role."""
    role = getattr(fn, "role", None)
    if not enabled() or not role:
        return {}
    return service_credentials(role, fn.function_name, "lambda.amazonaws.com")


def _install_state_machine_credentials() -> None:
    """The interpreter's clients call other services (Lambda Invoke above all) as the
    state machine's role, as Step Functions does, instead of moto's fixed key "ak"."""
    import sys

    from moto.stepfunctions.parser.asl.utils import boto_client as module

    original = module.boto_client_for
    if getattr(original, "_skyfn", False):
        return

    def boto_client_for(region: str, service: str, state_credentials: Any = None):
        client = original(region=region, service=service, state_credentials=state_credentials)
        role_arn = getattr(state_credentials, "role_arn", None)
        if not role_arn:
            return client
        creds = service_credentials(role_arn, STATES_SESSION, "states.amazonaws.com")
        import boto3

        return boto3.client(service_name=service, region_name=region, endpoint_url=client.meta.endpoint_url,
                            aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
                            aws_session_token=creds["AWS_SESSION_TOKEN"], config=client.meta.config)

    boto_client_for._skyfn = True
    module.boto_client_for = boto_client_for
    for name, mod in list(sys.modules.items()):  # modules that imported it by name already
        if name.startswith("moto.stepfunctions") and getattr(mod, "boto_client_for", None) is original:
            mod.boto_client_for = boto_client_for


def install() -> None:
    """Install every patch above (idempotent)."""
    request_resources.install()
    _install_authentication()
    _install_state_machine_credentials()
    log.info("IAM enforcement support installed (access log: %s)", os.environ.get(ACCESS_LOG_ENV) or "off")


__all__ = ["install", "enabled", "service_credentials", "function_env", "decide", "access_log", "ACTION_NAMES",
           "ENABLE_ENV", "ACCESS_LOG_ENV", "SERVICE_STAND_IN_TAG"]
