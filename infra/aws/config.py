"""Settings of the CDK app: the deployment (stage, region, auth provider, sizes) read from
CDK context, and the sizing of every Lambda function.

Pure Python on purpose (no aws_cdk import): benchmarks/cost.py prices exactly the memory
and architecture configured here, and the service's own settings (table and queue names,
lease) come from lambdas/config.py so the stacks create what the handlers look for.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

PYTHON_RUNTIME = "python3.11"
ARCHITECTURE = "arm64"  # Graviton: ~20% cheaper per GB-second than x86_64
# Wheels installed into the dependency layer: the handlers' imports beyond the Lambda
# runtime (boto3 is provided). Versions come from requirements.txt, one pin per package.
LAYER_PACKAGES = ("aws-lambda-powertools", "pydantic", "redis", "hiredis", "orjson", "PyJWT", "cryptography")
LAYER_PLATFORM = "manylinux2014_aarch64"


@dataclass(frozen=True)
class FunctionSpec:
    """One Lambda function of the service stack."""
    key: str                     # logical name, also the suffix of the function name
    handler: str                 # module.attribute under the repository root
    memory_mb: int
    timeout_s: int
    reserved_concurrency: int | None  # caps load on Redis/DynamoDB where it matters
    description: str


FUNCTIONS: dict[str, FunctionSpec] = {spec.key: spec for spec in (
    # API Gateway's integration timeout is 29 s; the status long-poll waits at most 20 s.
    FunctionSpec("api", "lambdas.api.handler", 1024, 29, None,
                 "REST API: functions, endpoints, task submission and status"),
    # Results are applied to Redis with scripts; 50 concurrent consumers keep the hot
    # store's connection count and CPU bounded when a large batch returns at once.
    FunctionSpec("results", "lambdas.results.handler", 512, 60, 50,
                 "Applies ResultPacks from the results queue to the hot store"),
    # Scheduled singletons: two overlapping runs would only repeat work.
    FunctionSpec("reaper", "lambdas.reaper.handler", 512, 240, 1,
                 "Offline endpoints, expired leases, dead letters"),
    # History drainers (issue 24): DeployConfig.history_drainers invocations a minute, each
    # draining for up to timeout - SKYFN_HISTORY_DRAIN_MARGIN_S; 1024 MB for the CPU that
    # zlib needs (Lambda's CPU scales with memory). Reserved concurrency: 2 x drainers, set
    # by the service stack (infra/aws/sizing.py has the arithmetic).
    FunctionSpec("history", "lambdas.history.handler", 1024, 60, None,
                 "Drains the hot store's outbox into DynamoDB history pages, in batches"),
)}
AUTHORIZER = FunctionSpec("authorizer", "lambdas.authorizer.handler", 256, 10, None,
                          "API Gateway token authorizer for Globus Auth JWTs")
# The functions that push (issue 13): every handler that can write a final task state and
# so reaches lambdas.core.tasks.push.notify. They alone get SKYFN_PUSH=apigw, the connection table
# (Query, DeleteItem) and execute-api:ManageConnections on POST @connections of the stage
# (infra/aws/stacks/push.py). Keys of FUNCTIONS:
#   api      task cancels; at submission memo hits and failures (group policy refusals,
#            queue refusals), through lambdas.core.tasks.tasks, also for the flows action provider;
#   results  results and failures from the results queue;
#   reaper   expired leases past the retry budget, dead letters.
PUSH_FUNCTIONS = ("api", "results", "reaper")
# ... and keys of stepfunctions.catalog.STEPS (workflows stack):
#   RouteChunk     submits a batch chunk through lambdas.core.tasks.tasks (same failures as the API);
#   BatchProgress  fails the tasks of a chunk that could not be routed (batches.chunk_failed);
#   RunTask        submits a flow's or SPMD rank's task through lambdas.core.tasks.tasks.
# SpmdInit, history, the authorizers, the WebSocket routes and the UI never write a final
# state. tests/aws/test_push_stack.py traces the handlers' calls and holds these lists to it.
PUSH_STEPS = ("RouteChunk", "BatchProgress", "RunTask")
# The results push's WebSocket API (infra/aws/stacks/push.py; issue 13)
WS_ROUTES = FunctionSpec("ws", "lambdas.ws.handler", 256, 10, None,
                         "WebSocket API routes: connect, disconnect, subscribe (results push)")
WS_AUTHORIZER = FunctionSpec("ws-authorizer", "lambdas.ws.authorizer", 256, 10, None,
                             "WebSocket API $connect authorizer: the REST API's tokens")
# The status page (infra/aws/stacks/status_page.py; issue 13): the one function reachable
# without a token, so its concurrency is capped: a flood of /ui requests cannot take the
# account's concurrency from the API.
UI = FunctionSpec("ui", "lambdas.ui.handler", 256, 10, 5,
                  "Status page at /ui: static files and config.json, no data")

# Interface VPC endpoints of the network stack (gateway endpoints: DynamoDB, S3).
INTERFACE_ENDPOINTS = ("sqs", "secretsmanager", "sts", "logs", "states")
AVAILABILITY_ZONES = 2

# EventBridge allows at most 5 targets per rule: the history rule has one per drainer.
EVENTBRIDGE_MAX_TARGETS = 5

# Results-queue event source: packs per invocation, and no batching window (issue 37): a
# window holds every result pack up to that long; without one Lambda's poller invokes with
# what one long-poll receive returns, so packs that arrive together still go together.
RESULTS_BATCH_SIZE = 10
RESULTS_BATCH_WINDOW_S = 0
RESULTS_MAX_CONCURRENCY = 50

AUTH_PROVIDERS = ("cognito", "globus")
GLOBUS_ISSUER = "https://auth.globus.org"
_STAGE = re.compile(r"^[a-z][a-z0-9-]{0,15}$")
_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")


class ConfigError(ValueError):
    """A context value is missing or malformed; the message names the key and the fix."""


@dataclass(frozen=True)
class DeployConfig:
    stage: str = "dev"
    region: str = "us-east-1"
    account: str | None = None
    auth: str = "cognito"
    globus_issuer: str = GLOBUS_ISSUER
    globus_audience: str | None = None
    nat_gateways: int = 1
    redis_node_type: str = "cache.r7g.large"
    redis_replicas: int = 1
    api_rate_limit: int = 1000        # requests/s, steady state, whole stage
    api_burst_limit: int = 2000
    log_retention_days: int = 30
    history_ttl_days: int = 365       # durable task history kept this long (DynamoDB TTL)
    history_drainers: int = 4         # concurrent history drains started each minute (1..5)
    # backpressure (lambdas/core/tasks/backlog.py): POST /tasks and batches answer 429 backlog past these
    backlog_max: int = 1_000_000          # SKYFN_BACKLOG_MAX: history outbox records not yet archived
    backlog_memory_fraction: float = 0.8  # SKYFN_BACKLOG_MEMORY_FRACTION: of ElastiCache's maxmemory
    payload_expiry_days: int = 30     # large payloads in S3
    rendezvous_port: int = 7300
    rendezvous_cpu: int = 512
    rendezvous_memory_mb: int = 1024
    alarm_email: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.history_drainers <= EVENTBRIDGE_MAX_TARGETS:
            raise ConfigError(
                f"history_drainers={self.history_drainers} is out of range: one EventBridge rule starts the "
                f"drainers and a rule has at most {EVENTBRIDGE_MAX_TARGETS} targets; pass "
                f"-c history_drainers=<1..{EVENTBRIDGE_MAX_TARGETS}>")

    @property
    def prefix(self) -> str:
        """Name prefix of every resource: SKYFN_TABLE_PREFIX and SKYFN_SQS_PREFIX."""
        return f"skyfn-{self.stage}"

    @property
    def backlog_alarm_threshold(self) -> int:
        """OutboxLength at which the HistoryBacklog alarm fires: half the bound, well before
        submissions are refused."""
        return max(1, self.backlog_max // 2)

    @property
    def retain_data(self) -> bool:
        """Tables, keys and secrets survive `cdk destroy` except on dev/test stages."""
        return not self.stage.startswith(("dev", "test"))

    def stack_name(self, part: str) -> str:
        return f"Skyfn-{self.stage}-{part}"

    @classmethod
    def from_context(cls, ctx: Mapping[str, Any], env: Mapping[str, str] | None = None) -> "DeployConfig":
        """Build from CDK context (`-c key=value`) with the CLI's default account/region
        (CDK_DEFAULT_ACCOUNT/REGION in `env`) as fallbacks."""
        env = env or {}

        def get(key: str, default: Any = None) -> Any:
            value = ctx.get(key)
            return default if value in (None, "") else value

        def integer(key: str, default: int, low: int, high: int) -> int:
            raw = get(key, default)
            try:
                value = int(raw)
            except (TypeError, ValueError):
                raise ConfigError(f"context {key}={raw!r} is not an integer: pass -c {key}=<{low}..{high}>") from None
            if not low <= value <= high:
                raise ConfigError(f"context {key}={value} is out of range: pass -c {key}=<{low}..{high}>")
            return value

        stage = str(get("stage", "dev"))
        if not _STAGE.match(stage):
            raise ConfigError(f"context stage={stage!r}: use 1-16 lowercase letters, digits or '-', "
                              "starting with a letter (e.g. -c stage=prod)")
        region = str(get("region", env.get("CDK_DEFAULT_REGION") or "us-east-1"))
        if not _REGION.match(region):
            raise ConfigError(f"context region={region!r} is not an AWS region name (e.g. -c region=us-east-1)")
        account = get("account", env.get("CDK_DEFAULT_ACCOUNT"))
        if account is not None and not re.fullmatch(r"\d{12}", str(account)):
            raise ConfigError(f"context account={account!r} is not a 12-digit AWS account id")
        auth = str(get("auth", "cognito"))
        if auth not in AUTH_PROVIDERS:
            raise ConfigError(f"context auth={auth!r}: allowed values are {', '.join(AUTH_PROVIDERS)}")
        issuer = str(get("globus_issuer", GLOBUS_ISSUER)).rstrip("/")
        audience = get("globus_audience")
        if auth == "globus":
            if not issuer.startswith("https://"):
                raise ConfigError(f"context globus_issuer={issuer!r} must be an https:// OIDC issuer URL")
            if not audience:
                raise ConfigError("context auth=globus needs the client id of your Globus app: "
                                  "-c globus_audience=<client id>")
        email = get("alarm_email")
        if email is not None and "@" not in str(email):
            raise ConfigError(f"context alarm_email={email!r} is not an email address")
        raw_drainers = get("history_drainers", cls.history_drainers)
        try:
            drainers = int(raw_drainers)
        except (TypeError, ValueError):
            raise ConfigError(f"context history_drainers={raw_drainers!r} is not an integer: "
                              f"pass -c history_drainers=<1..{EVENTBRIDGE_MAX_TARGETS}>") from None
        if not 1 <= drainers <= EVENTBRIDGE_MAX_TARGETS:
            raise ConfigError(f"context history_drainers={drainers} is out of range: the drainers are the targets "
                              f"of one EventBridge rule, which allows at most {EVENTBRIDGE_MAX_TARGETS}; "
                              f"pass -c history_drainers=<1..{EVENTBRIDGE_MAX_TARGETS}>")
        raw_fraction = get("backlog_memory_fraction", cls.backlog_memory_fraction)
        try:
            fraction = float(raw_fraction)
        except (TypeError, ValueError):
            fraction = float("nan")
        if not 0 < fraction <= 1:
            raise ConfigError(f"context backlog_memory_fraction={raw_fraction!r} is not a fraction: "
                              "pass -c backlog_memory_fraction=<0..1>, e.g. 0.8")
        node = str(get("redis_node_type", cls.redis_node_type))
        if not node.startswith("cache."):
            raise ConfigError(f"context redis_node_type={node!r}: expected an ElastiCache node type like cache.r7g.large")
        return cls(
            stage=stage, region=region, account=str(account) if account else None, auth=auth,
            globus_issuer=issuer, globus_audience=str(audience) if audience else None,
            nat_gateways=integer("nat_gateways", cls.nat_gateways, 1, 2),
            redis_node_type=node,
            redis_replicas=integer("redis_replicas", cls.redis_replicas, 1, 5),
            api_rate_limit=integer("api_rate_limit", cls.api_rate_limit, 1, 100_000),
            api_burst_limit=integer("api_burst_limit", cls.api_burst_limit, 1, 100_000),
            log_retention_days=integer("log_retention_days", cls.log_retention_days, 1, 3653),
            history_ttl_days=integer("history_ttl_days", cls.history_ttl_days, 1, 3653),
            history_drainers=drainers,
            backlog_max=integer("backlog_max", cls.backlog_max, 1000, 1_000_000_000),
            backlog_memory_fraction=fraction,
            payload_expiry_days=integer("payload_expiry_days", cls.payload_expiry_days, 1, 3653),
            rendezvous_port=integer("rendezvous_port", cls.rendezvous_port, 1024, 65535),
            alarm_email=str(email) if email else None,
        )
