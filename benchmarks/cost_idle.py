"""The idle fleet's monthly AWS bill (issue 39): N endpoints running no task, each agent
heartbeating and long-polling its queues, priced from benchmarks/aws_prices.yaml.

An idle endpoint's requests, each read from the code (`idle_requests` computes them from
the agent's configuration):

- heartbeat: POST /endpoints/<id>/heartbeat every `heartbeat_period` (EndpointConfig,
  10 s; endpoint_agent/service/link.py Heartbeater): one API Gateway request and one
  invocation of the `api` function. On the service side (lambdas/core/tasks/registry.py
  `heartbeat`) Redis only: the record read once, written in one round trip, and the
  answer is the heartbeat itself (HeartbeatAck), not `endpoint_info` with the queue's depth
  (until 2026-12-07 one SQS GetQueueAttributes per heartbeat). No DynamoDB: the allowlist is
  written only when it changed from the record's (lambdas/core/identity/allowlist.py
  `update`) and the record is read from DynamoDB only when Redis lost it (`_endpoint_record`).
- task-queue poll: ReceiveMessage with WaitTimeSeconds = ceil(`receive_wait`) (20 s by
  default, 1 s until 2026-12-07; endpoint_agent/service/poller.py Poller, skyfn/protocol/queues/sqs.py
  `receive`, at most 20): an empty queue answers after the wait, so one request per
  max(1, wait) seconds.
- control-queue poll: the same (ControlPoller, wait max(0.05, receive_wait) rounded up).
- credentials: POST /endpoints/<id>/connect when botocore refreshes the SQS session
  (endpoint_agent/service/credential.py `use_aws_session`): a session lasts
  MAX_SESSION_SECONDS (1 h, lambdas/core/identity/agent_credentials.py) and botocore
  refreshes it 15 min before it expires (its advisory timeout): every 45 min.
- reaper: nothing. Its liveness sweep reads the endpoints gone silent from one sorted set
  (lambdas/adapters/redis_store/liveness_store.py), and it looks for dead letters only
  at the endpoints sent a pack lately (lambdas/core/tasks/dead_letters.py, the
  dead-letter watch), so an idle endpoint costs it no request and no time.
- authorizer: with Globus Auth, the token authorizer's answer is cached 5 min per token
  (infra/aws/stacks/service.py), so one invocation per endpoint per 5 min; Cognito's
  authorizer is not billed.

Redis memory per endpoint is measured (benchmarks/hot_store.py) and priced as its share
of the hot store's nodes; the nodes themselves are a fixed cost (benchmarks/cost.py
`fixed_monthly`). Durations and log sizes are assumed (IDLE_ASSUMPTIONS, printed).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from benchmarks.aws_pricing import GB, SECONDS_PER_MONTH
from endpoint_agent.config import EndpointConfig
from infra.aws import sizing
from infra.aws.config import AUTHORIZER, FUNCTIONS, UI, DeployConfig

FLEETS = (1_000, 10_000)
MAX_WAIT_SECONDS = 20              # SQS's longest long-poll (skyfn.protocol.queues.sqs.MAX_WAIT_SECONDS)
SESSION_SECONDS = 3_600            # lambdas.core.identity.agent_credentials.MAX_SESSION_SECONDS
BOTOCORE_ADVISORY_REFRESH_S = 900  # botocore.credentials._DEFAULT_ADVISORY_REFRESH_TIMEOUT
AUTHORIZER_CACHE_S = 300           # results_cache_ttl of both authorizers (infra/aws/stacks/service.py)
# Memory of one ElastiCache node type (GiB; AWS's node specifications), of which
# ElastiCache reserves 25 % for non-data use by default (reserved-memory-percent).
NODE_MEMORY_GIB = {"cache.r7g.large": 13.07, "cache.t4g.small": 1.37}
RESERVED_MEMORY_FRACTION = 0.25
# Measured: the hot-store keys of one registered endpoint after its heartbeats (ep:<id>
# 536 B, agentcred:<id> 184, rl:endpoint:<id> 152, epname:<owner>:<name> and its share of
# eps:<owner>, ep-index and ep-beats), MEMORY USAGE summed over 200 endpoints of the embedded runtime (`python -m benchmarks.hot_store --json`,
# idle_endpoint.store_bytes_per_endpoint; docs/deploy.md "A fleet's limits"). The queues'
# streams it also holds there are SQS queues on AWS.
REDIS_BYTES_PER_IDLE_ENDPOINT = 1_306
# Measured: redis-server's main-thread CPU per no-op task through the embedded runtime,
# 58.9, 63.1 and 59.9 us in three runs (`python -m benchmarks.hot_store --json`,
# per_task.redis_cpu_us_per_task; 8.6-8.8 commands a task, 97-99 % of their time the hot
# store's rather than the queues'), without TLS. One primary runs its commands on one thread.
REDIS_CPU_US_PER_TASK = 61.0
# Measured the same way: one agent's heartbeat (POST /endpoints/<id>/heartbeat with the
# endpoint's credential) costs 222, 321 and 376 us of redis-server's main thread (three runs
# beside a CI run; 556 us before the heartbeat stopped reading the backlog, the allowlist
# and withdrawing a channel never published), 9 commands in 4 round trips: the credential,
# the rate limit's script (5 commands), the record, the write (HSET, ZADD)
# (idle_endpoint.redis_cpu_us_per_heartbeat, 200 endpoints x 5 heartbeats, the runtime's
# periodic work subtracted).
REDIS_CPU_US_PER_HEARTBEAT = 321.0
# AWS's default quotas per account and region (Service Quotas; not checked from here).
ACCOUNT_API_RPS, ACCOUNT_API_BURST = 10_000, 5_000
ACCOUNT_LAMBDA_CONCURRENCY = 1_000


@dataclass(frozen=True)
class IdleAssumptions:
    """What cannot be measured without an AWS account (durations, log sizes)."""
    heartbeat_ms: float = 10.0        # api function: 4 Redis round trips (was 25 with an SQS GetQueueAttributes)
    connect_ms: float = 150.0         # POST .../connect: STS AssumeRole, the queues' descriptors
    authorizer_ms: float = 50.0       # Globus token authorizer (JWT checked with cached keys)
    log_bytes_per_request: int = 1_000   # API access log line (~500 B) + Lambda START/END/REPORT (~500 B)


IDLE_ASSUMPTIONS = IdleAssumptions()


def idle_requests(config: EndpointConfig | None = None) -> dict[str, float]:
    """Requests per minute of one idle endpoint (see the module docstring for each)."""
    c = config or EndpointConfig()
    wait = min(MAX_WAIT_SECONDS, math.ceil(c.receive_wait))
    control_wait = min(MAX_WAIT_SECONDS, math.ceil(max(0.05, c.receive_wait)))
    return {"heartbeats": 60.0 / c.heartbeat_period,
            "task_receives": 60.0 / max(1, wait),
            "control_receives": 60.0 / max(1, control_wait),
            "connects": 60.0 / (SESSION_SECONDS - BOTOCORE_ADVISORY_REFRESH_S)}


def idle_fleet(endpoints: int, prices: dict, config: EndpointConfig | None = None,
               deploy: DeployConfig | None = None, a: IdleAssumptions = IDLE_ASSUMPTIONS,
               redis_bytes: float = REDIS_BYTES_PER_IDLE_ENDPOINT) -> dict:
    """Monthly USD of `endpoints` idle endpoints, by item, with the request rates behind it."""
    p, d = prices["prices"], deploy or DeployConfig()
    per_min = idle_requests(config)
    month_min = SECONDS_PER_MONTH / 60
    n = endpoints
    heartbeats = n * per_min["heartbeats"] * month_min
    connects = n * per_min["connects"] * month_min
    authorizations = n * month_min * 60 / AUTHORIZER_CACHE_S if d.auth == "globus" else 0.0
    api_requests = heartbeats + connects
    sqs_requests = n * month_min * (per_min["task_receives"] + per_min["control_receives"])
    api_mb, auth_mb = FUNCTIONS["api"].memory_mb, AUTHORIZER.memory_mb
    gb_s = (heartbeats * math.ceil(a.heartbeat_ms) + connects * math.ceil(a.connect_ms)) / 1000 * api_mb / 1024 \
        + authorizations * math.ceil(a.authorizer_ms) / 1000 * auth_mb / 1024
    invocations = heartbeats + connects + authorizations
    node_bytes = NODE_MEMORY_GIB[d.redis_node_type] * GB * (1 - RESERVED_MEMORY_FRACTION)
    nodes_usd = (1 + d.redis_replicas) * SECONDS_PER_MONTH / 3600 * p["elasticache_node_hour"][d.redis_node_type]
    usd = {
        "api_gateway": api_requests / 1e6 * p["api_gateway_rest_per_million"],
        "lambda_invocations": invocations / 1e6 * p["lambda_requests_per_million"],
        "lambda_gb_s": gb_s * p["lambda_arm64_per_gb_second"],
        "sqs": sqs_requests / 1e6 * p["sqs_standard_per_million_requests"],
        "dynamodb": 0.0,                                          # no write per heartbeat (above)
        "elasticache_memory": n * redis_bytes / node_bytes * nodes_usd,
        "cloudwatch_logs": (api_requests + authorizations) * a.log_bytes_per_request / GB
        * p["cloudwatch_logs_ingest_per_gb"],
    }
    usd["total"] = sum(usd.values())
    rate = {"api_requests_per_s": n * (per_min["heartbeats"] + per_min["connects"]) / 60,
            "sqs_requests_per_s": sqs_requests / SECONDS_PER_MONTH,
            "api_concurrency": n * per_min["heartbeats"] / 60 * a.heartbeat_ms / 1000,
            "redis_mb": n * redis_bytes / 2 ** 20}
    return {"endpoints": n, "usd_per_month": {k: round(v, 4) for k, v in usd.items()},
            "usd_per_endpoint_month": round(usd["total"] / n, 4) if n else 0.0,
            "requests_per_endpoint_per_min": {k: round(v, 3) for k, v in per_min.items()},
            "rates": {k: round(v, 2) for k, v in rate.items()}}


def fleet_limits(endpoints: int = 10_000, config: EndpointConfig | None = None,
                 deploy: DeployConfig | None = None, a: IdleAssumptions = IDLE_ASSUMPTIONS) -> dict:
    """Where a fleet of idle endpoints meets the CDK app's limits (docs/deploy.md "A
    fleet's limits"): API Gateway (the stage's throttle, then the account's), Lambda
    concurrency left unreserved, and the hot store's one primary."""
    d = deploy or DeployConfig()
    per_min = idle_requests(config)
    api_per_endpoint = (per_min["heartbeats"] + per_min["connects"]) / 60
    reserved = (FUNCTIONS["results"].reserved_concurrency + FUNCTIONS["reaper"].reserved_concurrency
                + UI.reserved_concurrency + sizing.reserved_concurrency(d.history_drainers))
    unreserved = ACCOUNT_LAMBDA_CONCURRENCY - reserved
    concurrency_per_endpoint = per_min["heartbeats"] / 60 * a.heartbeat_ms / 1000
    return {"api_rps_per_endpoint": round(api_per_endpoint, 5),
            "api_rps": round(endpoints * api_per_endpoint, 1),
            "stage_rate_limit": d.api_rate_limit, "stage_burst_limit": d.api_burst_limit,
            "endpoints_at_stage_rate": math.floor(d.api_rate_limit / api_per_endpoint),
            "endpoints_at_account_rate": math.floor(ACCOUNT_API_RPS / api_per_endpoint),
            "lambda_reserved": reserved, "lambda_unreserved": unreserved,
            "api_concurrency": round(endpoints * concurrency_per_endpoint, 1),
            "endpoints_at_lambda_concurrency": math.floor(unreserved / concurrency_per_endpoint),
            "redis_tasks_per_s_one_core": round(1e6 / REDIS_CPU_US_PER_TASK),
            "redis_core_share_heartbeats": round(endpoints * per_min["heartbeats"] / 60 * REDIS_CPU_US_PER_HEARTBEAT / 1e6, 3),
            "redis_tasks_per_s_beside_heartbeats": max(0, round(
                (1 - endpoints * per_min["heartbeats"] / 60 * REDIS_CPU_US_PER_HEARTBEAT / 1e6) * 1e6 / REDIS_CPU_US_PER_TASK)),
            "sqs_requests_per_s": round(endpoints * (per_min["task_receives"] + per_min["control_receives"]) / 60)}


def idle_summary(prices: dict, fleets: tuple[int, ...] = FLEETS) -> dict:
    """The idle fleet at the agent's defaults for each size, the same with receive_wait 1 s
    (the default until 2026-12-07: what a short long-poll costs), the price dates and the
    assumptions."""
    short_poll = EndpointConfig(receive_wait=1)
    return {"prices_date": prices["date"], "prices_added": prices.get("added", {}),
            "agent": {"heartbeat_period_s": EndpointConfig().heartbeat_period,
                      "receive_wait_s": EndpointConfig().receive_wait},
            "fleets": {str(n): idle_fleet(n, prices) for n in fleets},
            "receive_wait_1": {str(n): idle_fleet(n, prices, short_poll)["usd_per_month"]["total"] for n in fleets},
            "redis_bytes_per_endpoint": REDIS_BYTES_PER_IDLE_ENDPOINT,
            "limits": fleet_limits(max(fleets)),
            "assumptions": asdict(IDLE_ASSUMPTIONS)}


def print_summary(s: dict) -> None:
    fleets = s["fleets"]
    print(f"idle fleet, USD a month (prices of {s['prices_date']}; added: "
          + ", ".join(f"{k} {str(v).split(' ')[0]}" for k, v in s["prices_added"].items()) + f"), agent heartbeat "
          f"{s['agent']['heartbeat_period_s']} s, receive_wait {s['agent']['receive_wait_s']} s:")
    print(f"{'item':<20}" + "".join(f"{n + ' endpoints':>18}" for n in fleets))
    for item in next(iter(fleets.values()))["usd_per_month"]:
        print(f"{item:<20}" + "".join(f"{f['usd_per_month'][item]:>18,.2f}" for f in fleets.values()))
    print(f"{'per endpoint':<20}" + "".join(f"{f['usd_per_endpoint_month']:>18.4f}" for f in fleets.values()))
    print("requests per idle endpoint per minute: " + ", ".join(
        f"{k} {v}" for k, v in next(iter(fleets.values()))["requests_per_endpoint_per_min"].items()))
    print("with receive_wait 1 s: " + ", ".join(f"{n} endpoints {v:,.2f}" for n, v in s["receive_wait_1"].items()))
    print("idle assumptions: " + ", ".join(f"{k}={v}" for k, v in s["assumptions"].items()))

