"""The physical id and attributes of each template resource, as CloudFormation would give
them, for the local runtime: the explicit name when the template sets one (TableName,
QueueName, FunctionName, ...), else a deterministic generated name `<stack>-<logicalId>`
(shortened with a hash to the service's limit); Ref and Fn::GetAtt values per type, with
URLs in the form moto answers at the local endpoint. Ids AWS generates (KMS key, API,
user pool ids; a secret's ARN suffix) are derived from the stack and logical id, so they
are the same on every run."""
from __future__ import annotations

import hashlib
import re
import string
import uuid
from collections.abc import Mapping
from typing import Any, Callable, Iterator

from infra.local.templates.assembly import CloudAssembly, Resource
from infra.local.templates.intrinsics import Physical, Resolver, UnresolvedReference
from infra.local.templates.settings import LocalSettings


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("/".join(parts).encode()).digest()


def derived_id(resource: Resource, length: int, alphabet: str = string.ascii_lowercase + string.digits) -> str:
    """A stable id of `length` characters from `alphabet` for one resource."""
    number = int.from_bytes(_digest(resource.stack, resource.logical_id), "big")
    chars = []
    for _ in range(length):
        number, i = divmod(number, len(alphabet))
        chars.append(alphabet[i])
    return "".join(chars)


def generated_name(stack: str, logical_id: str, limit: int, *, lower: bool = False,
                   allowed: str = r"A-Za-z0-9_\-", suffix: str = "") -> str:
    """`<stack>-<logicalId><suffix>` in the characters the service allows, at most `limit`
    long (a longer one keeps its start and ends with 8 hex digits of a hash of the whole)."""
    base = f"{stack}-{logical_id}"
    base = re.sub(f"[^{allowed}]", "-", base.lower() if lower else base)
    room = limit - len(suffix)
    if len(base) > room:
        base = base[:room - 9].rstrip("-.") + "-" + _digest(stack, logical_id).hex()[:8]
    return base + suffix


class _Context:
    """What a naming rule may use: the settings and the resolver (for names that are
    themselves expressions)."""

    def __init__(self, settings: LocalSettings, resolver: Resolver):
        self.s = settings
        self.resolver = resolver

    def prop(self, r: Resource, name: str) -> Any:
        value = r.properties.get(name)
        if value is None:
            return None
        return self.resolver.resolve(r.stack, value, f"{r.logical_id}.Properties.{name}")

    def name(self, r: Resource, prop: str, limit: int, **kw: Any) -> str:
        explicit = self.prop(r, prop)
        return str(explicit) if explicit else generated_name(r.stack, r.logical_id, limit, **kw)

    def arn(self, service: str, resource: str, *, region: bool = True, account: bool = True) -> str:
        return (f"arn:{self.s.partition}:{service}:{self.s.region if region else ''}:"
                f"{self.s.account if account else ''}:{resource}")


# -- one rule per resource type --------------------------------------------------------

def _dynamodb_table(c: _Context, r: Resource) -> Physical:
    name = c.name(r, "TableName", 255, allowed=r"A-Za-z0-9_.\-")
    arn = c.arn("dynamodb", f"table/{name}")
    attrs = {"Arn": arn}
    if r.properties.get("StreamSpecification"):
        attrs["StreamArn"] = f"{arn}/stream/1970-01-01T00:00:00.000"  # moto's differs: look it up if needed
    return Physical(name, attrs)


def _sqs_queue(c: _Context, r: Resource) -> Physical:
    fifo = str(c.prop(r, "FifoQueue")).lower() == "true"
    name = c.name(r, "QueueName", 80, suffix=".fifo" if fifo else "")
    url = queue_url(c.s, name)
    return Physical(url, {"Arn": c.arn("sqs", name), "QueueName": name, "QueueUrl": url})


def queue_url(settings: LocalSettings, name: str) -> str:
    """The URL SQS gives the queue: moto in server mode answers
    `<scheme>://<host:port it was reached at>/<account>/<name>` (CreateQueue and
    GetQueueUrl alike), so handlers reaching moto at the same endpoint hit this queue."""
    if settings.aws_endpoint_url:
        return f"{settings.aws_endpoint_url.rstrip('/')}/{settings.account}/{name}"
    return f"https://sqs.{settings.region}.{settings.url_suffix}/{settings.account}/{name}"


def _s3_bucket(c: _Context, r: Resource) -> Physical:
    name = c.name(r, "BucketName", 63, lower=True, allowed=r"a-z0-9.\-")
    return Physical(name, {
        "Arn": f"arn:{c.s.partition}:s3:::{name}",
        "DomainName": f"{name}.s3.{c.s.url_suffix}",
        "RegionalDomainName": f"{name}.s3.{c.s.region}.{c.s.url_suffix}",
        "DualStackDomainName": f"{name}.s3.dualstack.{c.s.region}.{c.s.url_suffix}",
        "WebsiteURL": f"http://{name}.s3-website-{c.s.region}.{c.s.url_suffix}",
    })


def secret_arn_suffix(r: Resource) -> str:
    """The 6 letters after the secret's name in its ARN (AWS picks them at random; the
    provisioner hands these to moto, which takes them from the `_custom_id_` tag)."""
    return derived_id(r, 6, string.ascii_letters)


def _secret(c: _Context, r: Resource) -> Physical:
    name = c.name(r, "Name", 512, allowed=r"A-Za-z0-9/_+=.@\-")
    arn = c.arn("secretsmanager", f"secret:{name}-{secret_arn_suffix(r)}")
    return Physical(arn, {"Id": arn})


def _iam_role(c: _Context, r: Resource) -> Physical:
    name = c.name(r, "RoleName", 64, allowed=r"A-Za-z0-9_+=,.@\-")
    path = c.prop(r, "Path") or "/"
    return Physical(name, {"Arn": c.arn("iam", f"role{path}{name}", region=False),
                           "RoleId": "AROA" + derived_id(r, 17, string.ascii_uppercase + string.digits)})


def _iam_policy(c: _Context, r: Resource) -> Physical:
    name = c.name(r, "PolicyName", 128)
    return Physical(name, {"Id": name})


def _iam_managed_policy(c: _Context, r: Resource) -> Physical:
    name = c.name(r, "ManagedPolicyName", 128)
    arn = c.arn("iam", f"policy{c.prop(r, 'Path') or '/'}{name}", region=False)
    return Physical(arn, {"PolicyArn": arn, "PolicyId": "ANPA" + derived_id(r, 17, string.ascii_uppercase)})


def _lambda_function(c: _Context, r: Resource) -> Physical:
    name = c.name(r, "FunctionName", 64)
    return Physical(name, {"Arn": c.arn("lambda", f"function:{name}")})


def _lambda_layer(c: _Context, r: Resource) -> Physical:
    arn = c.arn("lambda", f"layer:{c.name(r, 'LayerName', 64)}:1")
    return Physical(arn, {"LayerVersionArn": arn})


def _state_machine(c: _Context, r: Resource) -> Physical:
    name = c.name(r, "StateMachineName", 80)
    arn = c.arn("states", f"stateMachine:{name}")
    return Physical(arn, {"Arn": arn, "Name": name, "StateMachineRevisionId": arn})


def _events_rule(c: _Context, r: Resource) -> Physical:
    name = c.name(r, "Name", 64, allowed=r"A-Za-z0-9_.\-")
    bus = c.prop(r, "EventBusName")
    bus_part = f"{bus}/" if bus and bus != "default" and not str(bus).startswith("arn:") else ""
    return Physical(name, {"Arn": c.arn("events", f"rule/{bus_part}{name}")})


def _kms_key(c: _Context, r: Resource) -> Physical:
    key_id = str(uuid.UUID(bytes=_digest(r.stack, r.logical_id)[:16], version=4))
    return Physical(key_id, {"Arn": c.arn("kms", f"key/{key_id}"), "KeyId": key_id})


def _sns_topic(c: _Context, r: Resource) -> Physical:
    fifo = str(c.prop(r, "FifoTopic")).lower() == "true"
    name = c.name(r, "TopicName", 256, suffix=".fifo" if fifo else "")
    arn = c.arn("sns", name)
    return Physical(arn, {"TopicArn": arn, "TopicName": name})


def _log_group(c: _Context, r: Resource) -> Physical:
    name = c.name(r, "LogGroupName", 512, allowed=r"A-Za-z0-9_/.#\-")
    return Physical(name, {"Arn": c.arn("logs", f"log-group:{name}:*")})


def _replication_group(c: _Context, r: Resource) -> Physical:
    # The local redis-server stands in for the cluster: every endpoint is it.
    host, port = c.s.redis_host, str(c.s.redis_port)
    attrs = {}
    for endpoint in ("PrimaryEndPoint", "ReaderEndPoint", "ConfigurationEndPoint"):
        attrs[f"{endpoint}.Address"], attrs[f"{endpoint}.Port"] = host, port
    attrs["ReadEndPoint.Addresses"] = host
    attrs["ReadEndPoint.Ports"] = port
    return Physical(c.name(r, "ReplicationGroupId", 40, lower=True), attrs)


def _load_balancer(c: _Context, r: Resource) -> Physical:
    # Only the rendezvous server sits behind one; locally it listens on rendezvous_host.
    name = c.name(r, "Name", 32)
    arn = c.arn("elasticloadbalancing", f"loadbalancer/net/{name}/{derived_id(r, 16, string.hexdigits[:16])}")
    return Physical(arn, {"DNSName": c.s.rendezvous_host, "LoadBalancerArn": arn, "LoadBalancerName": name,
                          "LoadBalancerFullName": arn.split(":loadbalancer/", 1)[1]})


def _rest_api(c: _Context, r: Resource) -> Physical:
    api_id = derived_id(r, 10)
    return Physical(api_id, {"RestApiId": api_id, "RootResourceId": derived_id(r, 10, string.ascii_lowercase)})


def _api_v2(c: _Context, r: Resource) -> Physical:
    api_id = derived_id(r, 10)
    websocket = c.prop(r, "ProtocolType") == "WEBSOCKET"
    local = c.s.websocket_url if websocket else c.s.gateway_url
    scheme = "wss" if websocket else "https"
    return Physical(api_id, {"ApiId": api_id,
                             "ApiEndpoint": local or f"{scheme}://{api_id}.execute-api.{c.s.region}.{c.s.url_suffix}"})


def _stage(c: _Context, r: Resource) -> Physical:
    return Physical(c.prop(r, "StageName") or "$default")


def _user_pool(c: _Context, r: Resource) -> Physical:
    pool_id = f"{c.s.region}_{derived_id(r, 9, string.ascii_letters + string.digits)}"
    provider = f"cognito-idp.{c.s.region}.{c.s.url_suffix}/{pool_id}"
    return Physical(pool_id, {"Arn": c.arn("cognito-idp", f"userpool/{pool_id}"), "UserPoolId": pool_id,
                              "ProviderName": provider, "ProviderURL": f"https://{provider}"})


def _user_pool_client(c: _Context, r: Resource) -> Physical:
    client_id = derived_id(r, 26)
    return Physical(client_id, {"ClientId": client_id})


def _ec2(prefix: str, id_attr: str | None) -> Callable[[_Context, Resource], Physical]:
    # EC2 ids (vpc-..., sg-..., subnet-...): only network settings and policies name them
    def rule(c: _Context, r: Resource) -> Physical:
        ident = f"{prefix}-{derived_id(r, 17, string.hexdigits[:16])}"
        attrs = {id_attr: ident} if id_attr else {}
        if prefix == "vpc":
            attrs.update(CidrBlock=c.prop(r, "CidrBlock") or "10.0.0.0/16",
                         DefaultSecurityGroup="sg-" + derived_id(r, 17, string.hexdigits[8:16] + "0123"))
        if prefix == "eipalloc":   # an Elastic IP's Ref is its address
            return Physical("127.0.0.1", {"AllocationId": ident, "PublicIp": "127.0.0.1"})
        return Physical(ident, attrs)
    return rule


def _alarm(c: _Context, r: Resource) -> Physical:
    name = c.name(r, "AlarmName", 255)
    return Physical(name, {"Arn": c.arn("cloudwatch", f"alarm:{name}")})


RULES: dict[str, Callable[[_Context, Resource], Physical]] = {
    "AWS::EC2::VPC": _ec2("vpc", "VpcId"),
    "AWS::EC2::SecurityGroup": _ec2("sg", "GroupId"),
    "AWS::EC2::Subnet": _ec2("subnet", "SubnetId"),
    "AWS::EC2::EIP": _ec2("eipalloc", None),
    "AWS::CloudWatch::Alarm": _alarm,
    "AWS::DynamoDB::Table": _dynamodb_table,
    "AWS::SQS::Queue": _sqs_queue,
    "AWS::S3::Bucket": _s3_bucket,
    "AWS::SecretsManager::Secret": _secret,
    "AWS::IAM::Role": _iam_role,
    "AWS::IAM::Policy": _iam_policy,
    "AWS::IAM::ManagedPolicy": _iam_managed_policy,
    "AWS::Lambda::Function": _lambda_function,
    "AWS::Lambda::LayerVersion": _lambda_layer,
    "AWS::StepFunctions::StateMachine": _state_machine,
    "AWS::Events::Rule": _events_rule,
    "AWS::KMS::Key": _kms_key,
    "AWS::SNS::Topic": _sns_topic,
    "AWS::Logs::LogGroup": _log_group,
    "AWS::ElastiCache::ReplicationGroup": _replication_group,
    "AWS::ElasticLoadBalancingV2::LoadBalancer": _load_balancer,
    "AWS::ApiGateway::RestApi": _rest_api,
    "AWS::ApiGateway::Stage": _stage,
    "AWS::ApiGatewayV2::Api": _api_v2,
    "AWS::ApiGatewayV2::Stage": _stage,
    "AWS::Cognito::UserPool": _user_pool,
    "AWS::Cognito::UserPoolClient": _user_pool_client,
}


class LocalPhysicalIds(Mapping):
    """(stack, logical id) -> Physical for every resource of the assembly, computed on
    first use (a name may be an expression naming other resources). A type without a
    rule has Ref = its logical id and no attributes."""

    def __init__(self, assembly: CloudAssembly, settings: LocalSettings):
        self.assembly = assembly
        self.settings = settings
        self.resolver = Resolver(assembly, self, region=settings.region, account=settings.account,
                                 partition=settings.partition, url_suffix=settings.url_suffix,
                                 parameters=settings.parameters)
        self._context = _Context(settings, self.resolver)
        self._done: dict[tuple[str, str], Physical] = {}
        self._busy: set[tuple[str, str]] = set()

    def __getitem__(self, key: tuple[str, str]) -> Physical:
        if key in self._done:
            return self._done[key]
        resource = self.assembly.resource(*key)
        if resource is None:
            raise KeyError(key)
        if key in self._busy:
            raise UnresolvedReference(key[0], key[1], "", "its name depends on itself")
        self._busy.add(key)
        try:
            rule = RULES.get(resource.type)
            physical = rule(self._context, resource) if rule else Physical(resource.logical_id)
        finally:
            self._busy.discard(key)
        self._done[key] = physical
        return physical

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return ((r.stack, r.logical_id) for r in self.assembly.resources())

    def __len__(self) -> int:
        return sum(1 for _ in self)


def local_resolver(assembly: CloudAssembly, settings: LocalSettings) -> Resolver:
    """A resolver whose physical ids are the local ones; `settings` must have account and
    region set (LocalSettings.with_environment)."""
    return LocalPhysicalIds(assembly, settings).resolver
