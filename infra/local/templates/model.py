"""The deployment a cloud assembly describes, resolved for the local runtime: every Lambda
function (handler, environment, role), table, queue, bucket, secret, state machine,
scheduled rule, event-source mapping and IAM role, with each CloudFormation reference
replaced by the local resource's name, ARN or URL (naming.py). `Deployment.from_assembly`
reads; nothing here talks to moto (provision.py creates the data resources).

Environments are localized after resolution: a rediss:// URL of the local redis becomes
redis:// (unless it speaks TLS) and the execute-api URLs of the template's APIs become the
local gateway / WebSocket URLs when the settings give them."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from infra.local.templates.assembly import CloudAssembly, Resource
from infra.local.templates.intrinsics import Resolver, UnresolvedReference
from infra.local.templates.naming import local_resolver, secret_arn_suffix
from infra.local.templates.settings import LocalSettings

# The types the model turns into something local; every other type is listed in not_local.
MODELED_TYPES = (
    "AWS::Lambda::Function", "AWS::DynamoDB::Table", "AWS::SQS::Queue", "AWS::S3::Bucket",
    "AWS::SecretsManager::Secret", "AWS::StepFunctions::StateMachine", "AWS::Events::Rule",
    "AWS::Lambda::EventSourceMapping", "AWS::IAM::Role", "AWS::IAM::Policy",
)

_RATE = re.compile(r"^rate\(\s*(\d+)\s+(minute|minutes|hour|hours|day|days)\s*\)$")
_UNIT_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}


def schedule_seconds(expression: str | None) -> int | None:
    """Seconds between runs of `rate(N unit)`; None for cron() or no schedule."""
    match = _RATE.match((expression or "").strip())
    if not match:
        return None
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2).rstrip("s")]


@dataclass(frozen=True)
class Function:
    stack: str
    logical_id: str
    name: str
    arn: str
    handler: str                      # module.attr, e.g. lambdas.api.handler
    runtime: str
    environment: dict[str, str]
    role_logical_id: str | None
    role_arn: str
    timeout: int                      # seconds
    memory: int                       # MB
    reserved_concurrency: int | None
    description: str = ""

    @property
    def module(self) -> str:
        return self.handler.rsplit(".", 1)[0]

    @property
    def attr(self) -> str:
        return self.handler.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Table:
    stack: str
    logical_id: str
    name: str
    arn: str
    key_schema: list[dict]
    attribute_definitions: list[dict]
    global_secondary_indexes: list[dict]
    local_secondary_indexes: list[dict]
    billing_mode: str                 # PAY_PER_REQUEST | PROVISIONED
    provisioned_throughput: dict | None
    ttl_attribute: str | None         # set when TimeToLiveSpecification is enabled
    stream_view_type: str | None


@dataclass(frozen=True)
class Queue:
    stack: str
    logical_id: str
    name: str
    url: str
    arn: str
    visibility_timeout: int | None
    message_retention_period: int | None
    delay_seconds: int | None
    receive_wait_seconds: int | None
    maximum_message_size: int | None
    redrive_target_arn: str | None
    max_receive_count: int | None
    fifo: bool
    content_based_deduplication: bool

    def attributes(self) -> dict[str, str]:
        """The CreateQueue/SetQueueAttributes attributes the template sets."""
        attrs = {"VisibilityTimeout": self.visibility_timeout, "MessageRetentionPeriod": self.message_retention_period,
                 "DelaySeconds": self.delay_seconds, "ReceiveMessageWaitTimeSeconds": self.receive_wait_seconds,
                 "MaximumMessageSize": self.maximum_message_size}
        out = {k: str(v) for k, v in attrs.items() if v is not None}
        if self.redrive_target_arn:
            out["RedrivePolicy"] = json.dumps({"deadLetterTargetArn": self.redrive_target_arn,
                                               "maxReceiveCount": self.max_receive_count or 10})
        if self.fifo:
            out["FifoQueue"] = "true"
            if self.content_based_deduplication:
                out["ContentBasedDeduplication"] = "true"
        return out


@dataclass(frozen=True)
class Bucket:
    stack: str
    logical_id: str
    name: str
    arn: str


@dataclass(frozen=True)
class Secret:
    stack: str
    logical_id: str
    name: str
    arn: str
    arn_suffix: str                   # the 6 letters ending the ARN (moto takes them from a tag)
    description: str | None
    generate: dict | None             # GenerateSecretString, when the value is generated
    secret_string: str | None         # SecretString, when the template gives the value

    @property
    def generated(self) -> bool:
        return self.secret_string is None


@dataclass(frozen=True)
class StateMachine:
    stack: str
    logical_id: str
    name: str
    arn: str
    definition: str                   # JSON text, substitutions applied
    role_arn: str
    type: str                         # STANDARD | EXPRESS


@dataclass(frozen=True)
class RuleTarget:
    id: str
    arn: str
    function: str | None              # logical id of the target Lambda function, if it is one
    function_name: str | None
    input: str | None                 # the constant JSON input, if any


@dataclass(frozen=True)
class Rule:
    stack: str
    logical_id: str
    name: str
    arn: str
    schedule_expression: str | None
    schedule_seconds: int | None      # for rate(); None for cron() and event patterns
    event_pattern: dict | None
    enabled: bool
    targets: list[RuleTarget]


@dataclass(frozen=True)
class EventSourceMapping:
    stack: str
    logical_id: str
    function: str | None              # logical id of the function
    function_name: str
    event_source_arn: str
    queue: str | None                 # name of the source queue, when it is one of ours
    batch_size: int
    max_batching_window: int          # seconds
    report_batch_item_failures: bool
    max_concurrency: int | None
    enabled: bool


@dataclass(frozen=True)
class Role:
    stack: str
    logical_id: str
    name: str
    arn: str
    path: str
    assume_role_policy: dict
    inline_policies: dict[str, dict]  # policy name -> document (the role's Policies + AWS::IAM::Policy)
    managed_policy_arns: list[str]
    max_session_duration: int | None
    description: str | None = None


@dataclass
class Deployment:
    settings: LocalSettings
    assembly: CloudAssembly
    resolver: Resolver
    prefix: str | None                # e.g. skyfn-dev, from the stack tags
    functions: dict[str, Function] = field(default_factory=dict)        # by function name
    tables: dict[str, Table] = field(default_factory=dict)              # by table name
    queues: dict[str, Queue] = field(default_factory=dict)              # by queue name
    buckets: dict[str, Bucket] = field(default_factory=dict)            # by bucket name
    secrets: dict[str, Secret] = field(default_factory=dict)            # by secret name
    state_machines: dict[str, StateMachine] = field(default_factory=dict)  # by name
    rules: dict[str, Rule] = field(default_factory=dict)                # by rule name
    event_source_mappings: list[EventSourceMapping] = field(default_factory=list)
    roles: dict[str, Role] = field(default_factory=dict)                # by role name
    not_local: dict[str, int] = field(default_factory=dict)             # type -> count, not created locally
    _rewrites: list[tuple[re.Pattern, str]] | None = field(default=None, repr=False)

    @classmethod
    def from_assembly(cls, assembly: CloudAssembly, local: LocalSettings | None = None) -> "Deployment":
        settings = (local or LocalSettings()).with_environment(*assembly.environment())
        dep = cls(settings, assembly, local_resolver(assembly, settings), assembly.stage_prefix())
        _Reader(dep).read()
        return dep

    # -- lookups -----------------------------------------------------------------------

    def find(self, stack: str, logical_id: str) -> Any:
        """The model object made from one template resource, or None."""
        for kind in (self.functions, self.tables, self.queues, self.buckets, self.secrets, self.state_machines,
                     self.rules, self.roles):
            for obj in kind.values():
                if obj.stack == stack and obj.logical_id == logical_id:
                    return obj
        return next((m for m in self.event_source_mappings if m.stack == stack and m.logical_id == logical_id), None)

    def function_by_arn(self, arn: str) -> Function | None:
        # a qualified ARN (…:function:name:alias) names the same function
        return next((f for f in self.functions.values() if arn == f.arn or arn.startswith(f.arn + ":")), None)

    def queue_by_arn(self, arn: str) -> Queue | None:
        return next((q for q in self.queues.values() if q.arn == arn), None)

    def role_by_arn(self, arn: str) -> Role | None:
        return next((r for r in self.roles.values() if r.arn == arn), None)

    def output(self, stack: str, name: str) -> Any:
        """A stack Output's value, resolved and localized (e.g. WebSocketUrl)."""
        out = self.assembly.stacks[stack].outputs[name]
        return self.localize(self.resolver.resolve(stack, out.get("Value"), f"{stack}.Outputs.{name}"))

    def localize(self, value: Any) -> Any:
        """`value` with cloud URLs swapped for the local ones (see the module docstring)."""
        if isinstance(value, str):
            if self._rewrites is None:
                self._rewrites = _url_rewrites(self)
            for pattern, replacement in self._rewrites:
                value = pattern.sub(replacement, value)
            return value
        if isinstance(value, list):
            return [self.localize(v) for v in value]
        if isinstance(value, dict):
            return {k: self.localize(v) for k, v in value.items()}
        return value


def _url_rewrites(dep: Deployment) -> list[tuple[re.Pattern, str]]:
    s = dep.settings
    rewrites = []
    if not s.redis_tls:
        host = re.escape(f"{s.redis_host}:{s.redis_port}")
        rewrites.append((re.compile(rf"\brediss://(?=([^/@\s]*@)?{host}\b)"), "redis://"))
    # the API's host and its stage (the first path segment, which the local servers do not have)
    api_host = r"{id}\.execute-api\.{region}\.{suffix}(?:/[^/?#\s\"']*)?"
    for r in dep.assembly.resources():
        if r.type not in ("AWS::ApiGateway::RestApi", "AWS::ApiGatewayV2::Api"):
            continue
        host = api_host.format(id=re.escape(str(dep.resolver.ref(r.stack, r.logical_id))),
                               region=re.escape(s.region), suffix=re.escape(s.url_suffix))
        websocket = r.properties.get("ProtocolType") == "WEBSOCKET"
        targets = {"wss": s.websocket_url, "https": s.websocket_management_url} if websocket else {
            "https": s.gateway_url}
        for scheme, local in targets.items():
            if local:
                rewrites.append((re.compile(rf"\b{scheme}://{host}(?=$|[/?#\s\"'])"), local.rstrip("/")))
    return rewrites


def _int(value: Any) -> int | None:
    return None if value is None or value == "" else int(value)


def _truthy(value: Any) -> bool:
    return str(value).lower() == "true"


class _Reader:
    """Fills a Deployment from its assembly, one resource type at a time."""

    def __init__(self, dep: Deployment):
        self.dep = dep
        self.a = dep.assembly
        self.resolver = dep.resolver

    def resolve(self, r: Resource, prop: str, default: Any = None) -> Any:
        value = r.properties.get(prop)
        if value is None:
            return default
        return self.resolver.resolve(r.stack, value, f"{r.logical_id}.Properties.{prop}")

    def ref(self, r: Resource) -> Any:
        return self.resolver.ref(r.stack, r.logical_id)

    def att(self, r: Resource, name: str) -> Any:
        return self.resolver.get_att(r.stack, r.logical_id, name)

    def read(self) -> None:
        for r in self.a.resources("AWS::IAM::Role"):
            self.role(r)
        for r in self.a.resources("AWS::IAM::Policy"):
            self.policy(r)
        for reader, rtype in ((self.table, "AWS::DynamoDB::Table"), (self.queue, "AWS::SQS::Queue"),
                              (self.bucket, "AWS::S3::Bucket"), (self.secret, "AWS::SecretsManager::Secret"),
                              (self.function, "AWS::Lambda::Function"),
                              (self.state_machine, "AWS::StepFunctions::StateMachine"),
                              (self.rule, "AWS::Events::Rule"),
                              (self.event_source_mapping, "AWS::Lambda::EventSourceMapping")):
            for r in self.a.resources(rtype):
                reader(r)
        self.dep.not_local = {t: n for t, n in sorted(self.a.types().items()) if t not in MODELED_TYPES}

    # -- IAM -------------------------------------------------------------------------

    def role(self, r: Resource) -> None:
        name = self.ref(r)
        inline = {p["PolicyName"]: p["PolicyDocument"] for p in self.resolve(r, "Policies", [])}
        self.dep.roles[name] = Role(
            r.stack, r.logical_id, name, self.att(r, "Arn"), self.resolve(r, "Path", "/"),
            self.resolve(r, "AssumeRolePolicyDocument", {}), inline, list(self.resolve(r, "ManagedPolicyArns", [])),
            _int(self.resolve(r, "MaxSessionDuration")), self.resolve(r, "Description"))

    def policy(self, r: Resource) -> None:
        name = self.resolve(r, "PolicyName")
        document = self.resolve(r, "PolicyDocument", {})
        for role_name in self.resolve(r, "Roles", []):
            role = self.dep.roles.get(role_name)
            if role is None:
                raise UnresolvedReference(r.stack, role_name, f"{r.logical_id}.Properties.Roles",
                                          "no role of the assembly has this name")
            role.inline_policies[name] = document

    # -- data ------------------------------------------------------------------------

    def table(self, r: Resource) -> None:
        name = self.ref(r)
        ttl = self.resolve(r, "TimeToLiveSpecification") or {}
        billing = self.resolve(r, "BillingMode") or ("PROVISIONED" if r.properties.get("ProvisionedThroughput")
                                                     else "PAY_PER_REQUEST")
        self.dep.tables[name] = Table(
            r.stack, r.logical_id, name, self.att(r, "Arn"), self.resolve(r, "KeySchema", []),
            self.resolve(r, "AttributeDefinitions", []), self.resolve(r, "GlobalSecondaryIndexes", []),
            self.resolve(r, "LocalSecondaryIndexes", []), billing, self.resolve(r, "ProvisionedThroughput"),
            ttl.get("AttributeName") if _truthy(ttl.get("Enabled")) else None,
            (self.resolve(r, "StreamSpecification") or {}).get("StreamViewType"))

    def queue(self, r: Resource) -> None:
        name = self.att(r, "QueueName")
        redrive = self.resolve(r, "RedrivePolicy") or {}
        if isinstance(redrive, str):
            redrive = json.loads(redrive)
        self.dep.queues[name] = Queue(
            r.stack, r.logical_id, name, self.ref(r), self.att(r, "Arn"),
            _int(self.resolve(r, "VisibilityTimeout")), _int(self.resolve(r, "MessageRetentionPeriod")),
            _int(self.resolve(r, "DelaySeconds")), _int(self.resolve(r, "ReceiveMessageWaitTimeSeconds")),
            _int(self.resolve(r, "MaximumMessageSize")), redrive.get("deadLetterTargetArn"),
            _int(redrive.get("maxReceiveCount")), _truthy(self.resolve(r, "FifoQueue")),
            _truthy(self.resolve(r, "ContentBasedDeduplication")))

    def bucket(self, r: Resource) -> None:
        name = self.ref(r)
        self.dep.buckets[name] = Bucket(r.stack, r.logical_id, name, self.att(r, "Arn"))

    def secret(self, r: Resource) -> None:
        arn = self.ref(r)
        name = arn.split(":secret:", 1)[1].rsplit("-", 1)[0]
        self.dep.secrets[name] = Secret(
            r.stack, r.logical_id, name, arn, secret_arn_suffix(r), self.resolve(r, "Description"),
            self.resolve(r, "GenerateSecretString", {}) if "SecretString" not in r.properties else None,
            self.resolve(r, "SecretString"))

    # -- compute ---------------------------------------------------------------------

    def function(self, r: Resource) -> None:
        name = self.ref(r)
        variables = (self.resolve(r, "Environment") or {}).get("Variables") or {}
        environment = {k: self.dep.localize(v if isinstance(v, str) else json.dumps(v) if isinstance(v, (dict, list))
                                            else str(v)) for k, v in variables.items()}
        role_arn = self.resolve(r, "Role")
        role = self.dep.role_by_arn(role_arn)
        self.dep.functions[name] = Function(
            r.stack, r.logical_id, name, self.att(r, "Arn"), self.resolve(r, "Handler", ""),
            self.resolve(r, "Runtime", ""), environment, role.logical_id if role else None, role_arn,
            _int(self.resolve(r, "Timeout")) or 3, _int(self.resolve(r, "MemorySize")) or 128,
            _int(self.resolve(r, "ReservedConcurrentExecutions")), self.resolve(r, "Description", ""))

    def state_machine(self, r: Resource) -> None:
        arn = self.ref(r)
        name = self.att(r, "Name")
        where = f"{r.logical_id}.Properties"
        if "DefinitionString" in r.properties:
            definition = self.resolve(r, "DefinitionString")
        elif "Definition" in r.properties:
            definition = json.dumps(self.resolve(r, "Definition"))
        elif "DefinitionS3Location" in r.properties:
            key = self.resolve(r, "DefinitionS3Location")["Key"]
            path = self.a.asset_file(key)
            if path is None or not path.is_file():
                raise UnresolvedReference(r.stack, key, f"{where}.DefinitionS3Location",
                                          "no file asset of the assembly has this object key")
            definition = path.read_text()
        else:
            raise UnresolvedReference(r.stack, r.logical_id, where, "the state machine has no definition")
        substitutions = self.resolve(r, "DefinitionSubstitutions") or {}
        if substitutions:
            definition = re.sub(r"\$\{([^}]+)\}",
                                lambda m: str(substitutions[m.group(1)]) if m.group(1) in substitutions else m.group(0),
                                definition)
        self.dep.state_machines[name] = StateMachine(r.stack, r.logical_id, name, arn, definition,
                                                     self.resolve(r, "RoleArn"),
                                                     self.resolve(r, "StateMachineType", "STANDARD"))

    def rule(self, r: Resource) -> None:
        name = self.ref(r)
        targets = []
        for i, t in enumerate(self.resolve(r, "Targets", [])):
            fn = self.dep.function_by_arn(t["Arn"])
            targets.append(RuleTarget(t.get("Id", f"Target{i}"), t["Arn"], fn.logical_id if fn else None,
                                      fn.name if fn else None, t.get("Input")))
        expression = self.resolve(r, "ScheduleExpression")
        self.dep.rules[name] = Rule(r.stack, r.logical_id, name, self.att(r, "Arn"), expression,
                                    schedule_seconds(expression), self.resolve(r, "EventPattern"),
                                    self.resolve(r, "State", "ENABLED") == "ENABLED", targets)

    def event_source_mapping(self, r: Resource) -> None:
        target = self.resolve(r, "FunctionName")
        fn = self.dep.functions.get(target) or self.dep.function_by_arn(target)
        source = self.resolve(r, "EventSourceArn", "")
        queue = self.dep.queue_by_arn(source)
        self.dep.event_source_mappings.append(EventSourceMapping(
            r.stack, r.logical_id, fn.logical_id if fn else None, fn.name if fn else target, source,
            queue.name if queue else None, _int(self.resolve(r, "BatchSize")) or 10,
            _int(self.resolve(r, "MaximumBatchingWindowInSeconds")) or 0,
            "ReportBatchItemFailures" in (self.resolve(r, "FunctionResponseTypes") or []),
            _int((self.resolve(r, "ScalingConfig") or {}).get("MaximumConcurrency")),
            _truthy(self.resolve(r, "Enabled", True))))
