"""The environment each Lambda handler reads, in one list, and the start-time check of it.

For every handler the AWS deployment runs (infra/aws/config.py FUNCTIONS, AUTHORIZER,
WS_ROUTES, WS_AUTHORIZER, UI and the steps of stepfunctions/catalog.py), HANDLERS names:

- ``required``: variables its function's template must set. A variable is required when
  its code default is the embedded runtime's and wrong in AWS (the hot store's URL, the
  queue kind, the auth provider...), or when its value must agree with something the CDK
  app builds (the queues' visibility timeout and receive count, the backlog alarm, the
  history drainers' sizing) -- for a handler whose code uses it;
- ``optional``: variables its code reads with a default that is right when unset (each
  one's default is in VARIABLES).

Variables from Secrets Manager count as set when SKYFN_SECRET_ENV names them
(lambdas/core/identity/secret_env.py loads them first). Of the variables Lambda itself
sets, skyfn's code reads only AWS_PROVIDED; boto3 and Powertools read others (AWS_REGION,
the credentials, AWS_LAMBDA_FUNCTION_NAME) themselves.

The check: with SKYFN_SETTINGS_CHECK=strict (the CDK app sets it on every function),
lambdas/__init__.py calls `check_started()` on the cold start, after the secrets are
loaded: the handler Lambda is starting (`_HANDLER`) must be listed here and its function's
environment must hold every required variable, or the start fails naming the variable, the
handler and the stack that builds the function. Unset (the embedded runtime, tests), nothing
is checked: they set only the part of the environment they use.

tests/unit/test_settings_catalog.py scans the code each handler imports and holds these
lists to what it reads, both ways; tests/aws/test_function_settings.py holds the
synthesized templates to the required lists.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Mapping

from stepfunctions import catalog

CHECK_VARIABLE = "SKYFN_SETTINGS_CHECK"
STRICT = "strict"
HANDLER_VARIABLE = "_HANDLER"  # set by the Lambda runtime: the function's handler string

# Read by skyfn's code and set by Lambda on every function.
AWS_PROVIDED = frozenset({HANDLER_VARIABLE})

# Every variable of the lists below: what it is and, unset, what happens.
VARIABLES: dict[str, str] = {
    # every handler (lambdas/__init__.py, this module)
    "SKYFN_SECRET_ENV": "JSON map of variable names to Secrets Manager ARNs, loaded at cold start (unset: none)",
    CHECK_VARIABLE: "'strict': check this list at cold start (unset or 'off': no check)",
    # lambdas/config.py settings()
    "SKYFN_REDIS_URL": "the hot store (default redis://127.0.0.1:6379/0, the embedded runtime's)",
    "SKYFN_REDIS_PASSWORD": "the hot store's AUTH token, from Secrets Manager in AWS (default: none)",
    "SKYFN_AGENT_REDIS_URL": "the hot store as agents reach it (default SKYFN_REDIS_URL)",
    "SKYFN_QUEUE_KIND": "'sqs' in AWS (default 'redis', the embedded runtime's Streams)",
    "SKYFN_TABLE_PREFIX": "name prefix of the tables, queues and state machines (default 'skyfn')",
    "SKYFN_SQS_PREFIX": "name prefix of the queues (default SKYFN_TABLE_PREFIX)",
    "SKYFN_BUCKET": "the payload bucket (default none: large payloads cannot travel through S3)",
    "SKYFN_AUTH_PROVIDER": "'cognito' or 'globus' in AWS (default 'jwt': the handler verifies tokens)",
    "SKYFN_AUTH_ISSUER": "the token issuer (default 'skyfn-local', the embedded runtime's)",
    "SKYFN_AUTH_AUDIENCE": "the token audience (default 'skyfn'; the authorizers refuse every token unset)",
    "SKYFN_AUTH_SECRET": "HMAC key of locally signed tokens (default none)",
    "SKYFN_AUTH_JWKS": "inline JWKS document (default none)",
    "SKYFN_AUTH_JWKS_FILE": "path of a JWKS document (default none)",
    "SKYFN_LEASE_SECONDS": "task messages' visibility timeout, as the queues are created (default 60)",
    "SKYFN_MAX_DELIVERIES": "deliveries before a dead letter, as the queues are created (default 5)",
    "SKYFN_HEARTBEAT_TIMEOUT": "seconds without a heartbeat before an endpoint is offline (default 30)",
    "SKYFN_RESULT_TTL": "seconds a read result stays in the hot store (default 600)",
    "SKYFN_UNRETRIEVED_TTL": "seconds an unread result stays in the hot store (default 7 days)",
    "SKYFN_MEMO_TTL": "seconds a memoized result answers repeat calls (default 7 days)",
    "SKYFN_HISTORY_BATCH": "outbox entries per history batch (default 2000; infra/aws/sizing.py sizes the drainers)",
    "SKYFN_HISTORY_DRAIN_MARGIN_S": "a drain stops this long before its timeout (default 5)",
    "SKYFN_HISTORY_MAX_BATCHES": "batches per drain invocation (default 0: while there is work)",
    "SKYFN_HISTORY_TTL_DAYS": "days the durable history is kept (default 0: forever)",
    "SKYFN_RATE_PER_SECOND": "requests per user per second, sustained (default 1000)",
    "SKYFN_RATE_BURST": "requests per user in a burst (default 2000)",
    "SKYFN_INLINE_BYTES": "arguments and results above this travel through S3 (default 256 KiB)",
    "SKYFN_DIRECT_SESSION_TTL": "seconds a direct session's token is good for (default 900)",
    "SKYFN_BACKLOG_MAX": "outbox records past which submissions get 429 backlog (default 1000000)",
    "SKYFN_BACKLOG_MEMORY_FRACTION": "of Redis's maxmemory past which submissions get 429 backlog (default 0.8)",
    # lambdas/core/tasks/push.py
    "SKYFN_PUSH": "'apigw' in AWS (default: 'redis' with Redis queues, else 'off': nothing is pushed)",
    "SKYFN_CONNECTION_TABLE": "the WebSocket connection table (no default: read when pushing over apigw)",
    "SKYFN_WS_ENDPOINT": "the WebSocket stage's https URL (no default: read when pushing over apigw)",
    # lambdas/core/identity/agent_keys.py
    "SKYFN_AGENT_ROLE_ARN": "the role agent sessions assume (default none: no AWS sessions for agents)",
    "SKYFN_AGENT_QUEUE_ARN_PREFIX": "ARN prefix of the stage's queues (default none: no AWS sessions for agents)",
    # lambdas/core/runs/settings.py
    "SKYFN_BATCH_FANOUT_ARN": "the batch-fanout state machine (default none: batches unavailable)",
    "SKYFN_SPMD_GROUP_ARN": "the spmd-group state machine (default none: SPMD groups unavailable)",
    "SKYFN_RUN_TASK_FUNCTION_ARN": "the RunTask function flows invoke (default none: flows unavailable)",
    "SKYFN_FLOW_ROLE_ARN": "the role flow state machines run as (default none: flows unavailable)",
    "SKYFN_STATE_MACHINE_PREFIX": "name prefix of flow state machines (default SKYFN_TABLE_PREFIX)",
    "SKYFN_RENDEZVOUS_ADDRESS": "host:port of the rendezvous server (default none: no rendezvous)",
    "SKYFN_RENDEZVOUS_SECRET": "key of rendezvous tokens, from Secrets Manager in AWS (default none)",
    # lambdas/action_provider.py
    "SKYFN_AP_SCOPE": "the Globus Flows action provider's scope (default 'skyfn:flows-ap:all')",
    "SKYFN_AP_ADMIN_CONTACT": "who runs this action provider (default a generic sentence)",
    # lambdas/core/tasks/stage_metrics.py
    "POWERTOOLS_METRICS_DISABLED": "'true' turns the stage metrics off (default: on)",
    # skyfn/data/connectors/s3.py
    "AWS_ENDPOINT_URL_S3": "an S3 endpoint other than AWS's (default: the region's)",
    "AWS_ENDPOINT_URL": "an endpoint other than AWS's for every service (default: the region's)",
    # lambdas/ui.py
    "SKYFN_API_URL": "the REST API the status page calls (default: the API it was served from)",
    "SKYFN_WS_URL": "the WebSocket API the status page connects to (default none: no push)",
}

# What each part of the code reads, by the module that reads it.
BOOT = frozenset({"SKYFN_SECRET_ENV", CHECK_VARIABLE})  # lambdas/__init__.py and this module
SETTINGS = frozenset({  # lambdas/config.py
    "SKYFN_REDIS_URL", "SKYFN_REDIS_PASSWORD", "SKYFN_AGENT_REDIS_URL", "SKYFN_QUEUE_KIND", "SKYFN_TABLE_PREFIX",
    "SKYFN_SQS_PREFIX", "SKYFN_BUCKET", "SKYFN_AUTH_PROVIDER", "SKYFN_AUTH_ISSUER", "SKYFN_AUTH_AUDIENCE",
    "SKYFN_AUTH_SECRET", "SKYFN_AUTH_JWKS", "SKYFN_AUTH_JWKS_FILE", "SKYFN_LEASE_SECONDS", "SKYFN_MAX_DELIVERIES",
    "SKYFN_HEARTBEAT_TIMEOUT", "SKYFN_RESULT_TTL", "SKYFN_UNRETRIEVED_TTL", "SKYFN_MEMO_TTL", "SKYFN_HISTORY_BATCH",
    "SKYFN_HISTORY_DRAIN_MARGIN_S", "SKYFN_HISTORY_MAX_BATCHES", "SKYFN_HISTORY_TTL_DAYS", "SKYFN_RATE_PER_SECOND",
    "SKYFN_RATE_BURST", "SKYFN_INLINE_BYTES", "SKYFN_DIRECT_SESSION_TTL", "SKYFN_BACKLOG_MAX",
    "SKYFN_BACKLOG_MEMORY_FRACTION"})
PUSH = frozenset({"SKYFN_PUSH", "SKYFN_CONNECTION_TABLE", "SKYFN_WS_ENDPOINT"})  # lambdas/core/tasks/push.py
AGENT_KEYS = frozenset({"SKYFN_AGENT_ROLE_ARN", "SKYFN_AGENT_QUEUE_ARN_PREFIX"})  # lambdas/core/identity/agent_keys.py
WORKFLOWS = frozenset(set(catalog.API_ENV) - {"SKYFN_BUCKET"})  # lambdas/core/runs/settings.py ...
RENDEZVOUS = frozenset({"SKYFN_RENDEZVOUS_ADDRESS", "SKYFN_RENDEZVOUS_SECRET"})
RUNS = WORKFLOWS | RENDEZVOUS | {"SKYFN_STATE_MACHINE_PREFIX"}  # ... all of it
ACTION_PROVIDER = frozenset({"SKYFN_AP_SCOPE", "SKYFN_AP_ADMIN_CONTACT"})  # lambdas/action_provider.py
STAGE_METRICS = frozenset({"POWERTOOLS_METRICS_DISABLED"})  # lambdas/core/tasks/stage_metrics.py
S3 = frozenset({"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"})  # skyfn/data/connectors/s3.py
UI = frozenset({"SKYFN_API_URL", "SKYFN_WS_URL"})  # lambdas/ui.py

# Requirements shared by several handlers.
STORE = frozenset({  # the hot store and the queues, through settings(): every handler that opens them
    "SKYFN_REDIS_URL", "SKYFN_REDIS_PASSWORD", "SKYFN_QUEUE_KIND", "SKYFN_TABLE_PREFIX", "SKYFN_LEASE_SECONDS",
    "SKYFN_MAX_DELIVERIES"})
GATEWAY_AUTH = frozenset({"SKYFN_AUTH_PROVIDER", "SKYFN_AUTH_ISSUER"})
BACKLOG = frozenset({"SKYFN_BACKLOG_MAX", "SKYFN_BACKLOG_MEMORY_FRACTION"})  # submitters and the drain's gauge
HISTORY = frozenset({"SKYFN_HISTORY_TTL_DAYS", "SKYFN_HISTORY_BATCH", "SKYFN_HISTORY_DRAIN_MARGIN_S"})
BUCKET = frozenset({"SKYFN_BUCKET"})

SERVICE_STACK = "infra/aws/stacks/service.py"
PUSH_STACK = "infra/aws/stacks/push.py"
STATUS_PAGE = "infra/aws/stacks/status_page.py"
WORKFLOWS_STACK = "infra/aws/stacks/workflows.py"


@dataclass(frozen=True)
class HandlerSettings:
    handler: str              # "module.function", as the function's Handler
    template: str             # the stack that builds its function (where a missing variable goes)
    required: frozenset[str]
    optional: frozenset[str]

    @property
    def reads(self) -> frozenset[str]:
        return self.required | self.optional


def _entry(handler: str, template: str, reads: frozenset[str], required: frozenset[str]) -> HandlerSettings:
    return HandlerSettings(handler, template, frozenset(required), frozenset(reads - required))


# The service core: what every handler importing lambdas.core (settings, push) reads.
_CORE = BOOT | SETTINGS | PUSH
_STEP_READS = _CORE | RUNS | S3

HANDLERS: dict[str, HandlerSettings] = {e.handler: e for e in (
    _entry("lambdas.api.handler", SERVICE_STACK, _CORE | RUNS | AGENT_KEYS | ACTION_PROVIDER | S3,
           required=STORE | BUCKET | GATEWAY_AUTH | BACKLOG | PUSH | AGENT_KEYS | WORKFLOWS | RENDEZVOUS
           | {"SKYFN_AP_SCOPE"}),
    _entry("lambdas.results.handler", SERVICE_STACK, _CORE | STAGE_METRICS | S3, required=STORE | BUCKET | PUSH),
    # the reaper's dataflow sweep sends released dependents like the results function
    # (lambdas/core/tasks/dataflow.py: envelopes and inputs' results through the bucket)
    _entry("lambdas.reaper.handler", SERVICE_STACK, _CORE | S3, required=STORE | BUCKET | PUSH),
    _entry("lambdas.history.handler", SERVICE_STACK, BOOT | SETTINGS, required=STORE | BACKLOG | HISTORY),
    _entry("lambdas.authorizer.handler", SERVICE_STACK, BOOT | SETTINGS | AGENT_KEYS,
           required=frozenset({"SKYFN_AUTH_ISSUER", "SKYFN_AUTH_AUDIENCE"})),
    _entry("lambdas.ws.handler", PUSH_STACK, _CORE | AGENT_KEYS,
           required=frozenset({"SKYFN_REDIS_URL", "SKYFN_REDIS_PASSWORD", "SKYFN_CONNECTION_TABLE"})),
    _entry("lambdas.ws.authorizer", PUSH_STACK, _CORE | AGENT_KEYS,
           required=GATEWAY_AUTH | {"SKYFN_AUTH_AUDIENCE"}),
    _entry("lambdas.ui.handler", STATUS_PAGE, BOOT | UI, required=frozenset({"SKYFN_WS_URL"})),
    # the Step Functions steps (stepfunctions/catalog.py)
    _entry(catalog.ROUTE_CHUNK.handler, WORKFLOWS_STACK, _STEP_READS, required=STORE | BUCKET | BACKLOG | PUSH),
    _entry(catalog.BATCH_PROGRESS.handler, WORKFLOWS_STACK, _STEP_READS, required=STORE | BUCKET | PUSH),
    _entry(catalog.RUN_TASK.handler, WORKFLOWS_STACK, _STEP_READS, required=STORE | BACKLOG | PUSH),
    _entry(catalog.SPMD_INIT.handler, WORKFLOWS_STACK, _STEP_READS, required=STORE | set(catalog.SPMD_INIT.env)),
)}


class SettingsError(RuntimeError):
    """A handler's function lacks a variable it needs; the message names it, the handler and the fix."""


def secret_names(environ: Mapping[str, str]) -> set[str]:
    """The variables SKYFN_SECRET_ENV names (loaded from Secrets Manager before the check)."""
    try:
        mapping = json.loads(environ.get("SKYFN_SECRET_ENV") or "{}")
    except json.JSONDecodeError:
        return set()  # secret_env.load() has refused it already, naming the problem
    return set(mapping) if isinstance(mapping, dict) else set()


def missing(handler: str, environ: Mapping[str, str]) -> list[str]:
    """The required variables of `handler` that `environ` neither holds nor loads from a secret."""
    entry = HANDLERS.get(handler)
    if entry is None:
        raise SettingsError(f"{handler} is not listed in lambdas/settings_catalog.py HANDLERS: add it with the "
                            "variables it requires and reads")
    have = set(environ) | secret_names(environ)
    return sorted(entry.required - have)


def check(handler: str, environ: Mapping[str, str]) -> None:
    """Raise SettingsError unless `environ` sets every variable `handler` requires."""
    absent = missing(handler, environ)
    if absent:
        entry = HANDLERS[handler]
        what = "; ".join(f"{name}: {VARIABLES[name]}" for name in absent)
        raise SettingsError(
            f"{handler} needs {', '.join(absent)}, which its function's environment does not set: add "
            f"{'it' if len(absent) == 1 else 'them'} to the function in {entry.template} ({what})")


def check_started(environ: Mapping[str, str] | None = None) -> None:
    """The cold-start check, as SKYFN_SETTINGS_CHECK asks: 'strict' checks the handler Lambda
    is starting; unset or 'off' checks nothing."""
    environ = os.environ if environ is None else environ
    mode = environ.get(CHECK_VARIABLE, "")
    if mode in ("", "off"):
        return
    if mode != STRICT:
        raise SettingsError(f"{CHECK_VARIABLE}={mode!r}: allowed values are '{STRICT}' and 'off'")
    handler = environ.get(HANDLER_VARIABLE, "")
    if not handler:
        raise SettingsError(f"{CHECK_VARIABLE}={STRICT} checks the handler Lambda starts, but {HANDLER_VARIABLE} "
                            "(set by the Lambda runtime) is unset")
    check(handler, environ)
