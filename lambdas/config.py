"""Service settings, read once from the environment (see docs/contracts.md)."""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from skyfn.protocol.direct import DEFAULT_SESSION_TTL_S

# Providers whose tokens API Gateway's authorizer verifies before the handler runs
# (lambdas/auth.py trusts the gateway's identity; agents then use SQS sessions).
GATEWAY_PROVIDERS = ("cognito", "globus")


@dataclass(frozen=True)
class Settings:
    redis_url: str
    agent_redis_url: str
    queue_kind: str
    table_prefix: str
    auth_secret: str
    auth_issuer: str
    lease_seconds: float
    max_deliveries: int
    heartbeat_timeout: float
    result_ttl: float
    unretrieved_ttl: float
    history_batch: int
    sqs_queue_prefix: str
    history_ttl_days: float = 0.0  # 0: the durable history never expires
    history_drain_margin_s: float = 5.0  # a history drain stops taking batches this long before its timeout
    history_max_batches: int = 0  # batches one drain invocation takes at most (0: while there is work)
    memo_ttl: float = 7 * 24 * 3600.0  # how long a memoized result answers repeat calls
    # authentication and limits (lambdas/auth.py, lambdas/core/identity/limits.py)
    auth_provider: str = "jwt"       # jwt: verify tokens here; cognito|globus: API Gateway's authorizer did
    auth_audience: str = "skyfn"
    auth_jwks: str = ""              # inline JWKS document
    auth_jwks_file: str = ""         # path of a JWKS document (the embedded runtime's public key)
    rate_per_second: float = 1000.0  # requests per user, sustained (token bucket in Redis)
    rate_burst: float = 2000.0
    inline_bytes: int = 256 << 10    # arguments/results above this travel through S3
    bucket: str = ""
    direct_session_ttl: float = DEFAULT_SESSION_TTL_S  # seconds a direct session's token is good for
    # backpressure (lambdas/core/tasks/backlog.py): submissions answer 429 backlog past these
    backlog_max: int = 1_000_000              # history outbox entries not yet archived
    backlog_memory_fraction: float = 0.8      # of the hot store's maxmemory (no bound without maxmemory)

    def task_queue_name(self, endpoint_id: str) -> str:
        if self.queue_kind == "sqs":
            return f"{self.sqs_queue_prefix}-tasks-{endpoint_id}"
        return f"tasks:{endpoint_id}"

    def control_queue_name(self, endpoint_id: str) -> str:
        if self.queue_kind == "sqs":
            return f"{self.sqs_queue_prefix}-control-{endpoint_id}"
        return f"control:{endpoint_id}"

    def lane_queue_name(self, endpoint_id: str, lane: str) -> str:
        """A lane's task queue (lambdas/core/identity/lanes.py); lanes exist on Redis Streams only.
        `lane` "*" gives the key pattern of all the endpoint's lanes."""
        return f"tasks:{endpoint_id}:l:{lane}"

    @property
    def results_queue_name(self) -> str:
        return f"{self.sqs_queue_prefix}-results" if self.queue_kind == "sqs" else "results"


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return float(raw)
    except ValueError:
        raise RuntimeError(f"environment variable {name}={raw!r} is not a number") from None


def _positive(name: str, default: float) -> float:
    value = _float(name, default)
    if value <= 0:
        raise RuntimeError(f"environment variable {name}={value!r} must be a positive number of seconds")
    return value


def _count(name: str, default: int) -> int:
    """A positive whole number (1_000_000 and 1e6 are accepted)."""
    value = _float(name, default)
    if not (1 <= value < float("inf")) or value != int(value):
        raise RuntimeError(f"environment variable {name}={os.environ.get(name)!r} must be a whole number >= 1")
    return int(value)


def _fraction(name: str, default: float) -> float:
    value = _float(name, default)
    if not 0 < value <= 1:  # also refuses nan
        raise RuntimeError(f"environment variable {name}={value!r} must be a fraction in (0, 1], e.g. 0.8")
    return value


@functools.lru_cache(maxsize=1)
def settings() -> Settings:
    kind = os.environ.get("SKYFN_QUEUE_KIND", "redis")
    if kind not in ("redis", "sqs"):
        raise RuntimeError(f"SKYFN_QUEUE_KIND={kind!r}: allowed values are 'redis' and 'sqs'")
    redis_url = with_password(os.environ.get("SKYFN_REDIS_URL", "redis://127.0.0.1:6379/0"),
                              os.environ.get("SKYFN_REDIS_PASSWORD", ""))
    prefix = os.environ.get("SKYFN_TABLE_PREFIX", "skyfn")
    return Settings(
        redis_url=redis_url,
        agent_redis_url=os.environ.get("SKYFN_AGENT_REDIS_URL", redis_url),
        queue_kind=kind,
        table_prefix=prefix,
        auth_secret=os.environ.get("SKYFN_AUTH_SECRET", ""),
        auth_issuer=os.environ.get("SKYFN_AUTH_ISSUER", "skyfn-local"),
        lease_seconds=_float("SKYFN_LEASE_SECONDS", 60.0),
        max_deliveries=int(_float("SKYFN_MAX_DELIVERIES", 5)),
        heartbeat_timeout=_float("SKYFN_HEARTBEAT_TIMEOUT", 30.0),
        result_ttl=_float("SKYFN_RESULT_TTL", 600.0),
        unretrieved_ttl=_float("SKYFN_UNRETRIEVED_TTL", 7 * 24 * 3600.0),
        history_batch=int(_float("SKYFN_HISTORY_BATCH", 2000)),
        history_drain_margin_s=_float("SKYFN_HISTORY_DRAIN_MARGIN_S", 5.0),
        history_max_batches=int(_float("SKYFN_HISTORY_MAX_BATCHES", 0)),
        sqs_queue_prefix=os.environ.get("SKYFN_SQS_PREFIX", prefix),
        history_ttl_days=_float("SKYFN_HISTORY_TTL_DAYS", 0.0),
        memo_ttl=_float("SKYFN_MEMO_TTL", 7 * 24 * 3600.0),
        auth_provider=os.environ.get("SKYFN_AUTH_PROVIDER", "jwt"),
        auth_audience=os.environ.get("SKYFN_AUTH_AUDIENCE", "skyfn"),
        auth_jwks=os.environ.get("SKYFN_AUTH_JWKS", ""),
        auth_jwks_file=os.environ.get("SKYFN_AUTH_JWKS_FILE", ""),
        rate_per_second=_float("SKYFN_RATE_PER_SECOND", 1000.0),
        rate_burst=_float("SKYFN_RATE_BURST", 2000.0),
        inline_bytes=int(_float("SKYFN_INLINE_BYTES", 256 << 10)),
        bucket=os.environ.get("SKYFN_BUCKET", ""),
        direct_session_ttl=_positive("SKYFN_DIRECT_SESSION_TTL", DEFAULT_SESSION_TTL_S),
        backlog_max=_count("SKYFN_BACKLOG_MAX", 1_000_000),
        backlog_memory_fraction=_fraction("SKYFN_BACKLOG_MEMORY_FRACTION", 0.8),
    )


def with_password(url: str, password: str) -> str:
    """`url` with its password set (SKYFN_REDIS_PASSWORD: in AWS the AUTH token of
    ElastiCache, loaded from Secrets Manager, kept out of SKYFN_REDIS_URL)."""
    if not password:
        return url
    from urllib.parse import quote, urlsplit, urlunsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{quote(parts.username or '', safe='')}:{quote(password, safe='')}@{host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
