"""The service process of the embedded runtime: the gateway (REST API handler in its
Lambda environments), the results event-source mapping and the schedules, together.

`skyfn local up` runs it in its own process when detached:

    python -m infra.local.serve --home $SKYFN_HOME

It reads the deployment (ports, URLs) from `$SKYFN_HOME/local/runtime.json`, sets the
handlers' environment, creates the AWS resources (idempotent) and serves until SIGTERM
or SIGINT, then stops its parts in order (schedules, event source, gateway).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from infra.local.event_source import EventSourceMapping, redis_results_queue
from infra.local.gateway import Gateway
from infra.local.rewrite_yield import RewriteYield
from infra.local.scheduler import Scheduler, default_schedules
from skyfn import gc_tuning

log = logging.getLogger("skyfn.local.serve")


def handler_env(redis_url: str, aws_endpoint: str, jwks_file: str, table_prefix: str = "skyfn",
                bucket: str = "skyfn-payloads") -> dict[str, str]:
    """The environment the handlers read (docs/contracts.md). AWS credentials are dummies:
    every AWS call goes to `aws_endpoint` (moto, or LocalStack). Tokens are verified with
    the public key set `jwks_file` of the local issuer (the private key stays with
    `skyfn local token`: the service cannot mint user tokens)."""
    return {
        "SKYFN_REDIS_URL": redis_url,
        "SKYFN_QUEUE_KIND": "redis",
        "SKYFN_TABLE_PREFIX": table_prefix,
        "SKYFN_BUCKET": bucket,
        "SKYFN_AUTH_JWKS_FILE": str(jwks_file),
        "SKYFN_AUTH_ISSUER": "skyfn-local",
        "SKYFN_AUTH_AUDIENCE": "skyfn",
        "AWS_ENDPOINT_URL": aws_endpoint,
        "AWS_ACCESS_KEY_ID": "skyfn-local",
        "AWS_SECRET_ACCESS_KEY": "skyfn-local",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
    }


# Quiet, cheap defaults for Powertools on the hot path; a user's environment overrides them.
POWERTOOLS_DEFAULTS = {
    "POWERTOOLS_LOG_LEVEL": "WARNING",
    "POWERTOOLS_METRICS_DISABLED": "true",
    "POWERTOOLS_TRACE_DISABLED": "true",
}


def apply_env(env: dict[str, str]) -> None:
    import warnings

    os.environ.update(env)
    # Powertools warns on every flush without metrics; the schedules flush every few seconds.
    # Here and, through PYTHONWARNINGS, in the handlers' environments.
    quiet = "ignore:No application metrics to publish"
    warnings.filterwarnings("ignore", message="No application metrics to publish")
    if quiet not in os.environ.get("PYTHONWARNINGS", ""):
        os.environ["PYTHONWARNINGS"] = ",".join(w for w in (os.environ.get("PYTHONWARNINGS"), quiet) if w)
    for key, value in POWERTOOLS_DEFAULTS.items():
        os.environ.setdefault(key, value)


class Service:
    """Gateway (+ its WebSocket API) + results event-source mapping + schedules, started and
    stopped together; with `redis_pidfile`, the redis-server it names has its append-only
    file's rewrites yield the cores (infra/local/rewrite_yield.py)."""

    def __init__(self, redis_url: str, *, port: int = 0, api="lambdas.api:handler", results=None,
                 schedules=None, api_workers: tuple[int, int] = (2, 16), results_visibility: float = 30.0,
                 reaper_period: float = 5.0, history_period: float = 0.5, push: bool = True,
                 api_env: dict | None = None, api_function: str = "skyfn-api", results_queue=None,
                 results_batch: int = 100, results_function: str = "skyfn-results", redis_pidfile=None):
        """`api_env` (with it, the API's environments are built from it alone, as Lambda's),
        `results_queue` (a factory of the results queue; default: the runtime's Redis
        stream) and the functions' names serve the runtime started from the templates."""
        from infra.local.push_hub import PushHub

        self.push_hub = PushHub(redis_url) if push else None  # the WebSocket API (results push)
        self.gateway = Gateway(api, port=port, workers=api_workers, websocket=self.push_hub, ui=push,
                               function_name=api_function, env=api_env, inherit=api_env is None)
        self.event_source = EventSourceMapping(
            results_queue or (lambda: redis_results_queue(redis_url, "results", results_visibility)), results,
            function_name=results_function, batch_size=results_batch, declare=results_queue is None)
        self.scheduler = Scheduler(schedules if schedules is not None
                                   else default_schedules(reaper_period, history_period))
        self.rewrite_yield = RewriteYield(redis_pidfile) if redis_pidfile is not None else None

    @property
    def url(self) -> str:
        return self.gateway.url

    def start(self) -> "Service":
        started = []
        try:
            for part in (self.rewrite_yield, self.push_hub, self.gateway, self.event_source, self.scheduler):
                if part is None:
                    continue
                part.start()
                started.append(part)
        except BaseException:
            for part in reversed(started):
                part.stop()
            raise
        return self

    def stop(self) -> None:
        for part in (self.scheduler, self.event_source, self.gateway, self.push_hub, self.rewrite_yield):
            if part is None:
                continue
            try:
                part.stop()
            except Exception:
                log.exception("stopping %s failed", type(part).__name__)


def serve_until_signalled(service: Service) -> None:
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    log.info("stopping")
    service.stop()


def main(argv: list[str] | None = None) -> int:
    from infra.local.handlers import ensure_resources
    from infra.local.state import StateDir

    parser = argparse.ArgumentParser(prog="python -m infra.local.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", help="SKYFN_HOME (default: $SKYFN_HOME or ~/.skyfn)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("SKYFN_LOG_LEVEL", "INFO").upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # AWS SDK wire logs at DEBUG echo request parameters, which carry the handlers'
    # environment (the Redis URL with its password) when functions are deployed: never below INFO.
    for noisy in ("botocore", "boto3", "s3transfer", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.INFO, logging.getLogger().level))
    state = StateDir.at(args.home)
    record = state.read_runtime()
    if not record:
        log.error("no %s: start the runtime with `skyfn local up`", state.runtime_file)
        return 2
    state.signing_key()  # makes sure the key set exists (a deployment from before keys: created now)
    if record.get("from_templates"):  # issue 25: every function's environment comes from its template
        from infra.local import template_runtime

        settings = template_runtime.service_settings(state)
        # the push hub checks WebSocket tokens in this process (lambdas.auth), as the WebSocket
        # API's authorizer function does: with that function's environment and role
        os.environ.update(settings.pop("push_authorizer_env"))
        service = Service(record["redis_url"], port=record["gateway_port"],
                          api_workers=tuple(record.get("api_workers", (2, 16))),
                          redis_pidfile=state.pidfile("redis"), **settings)
        service.start()
        gc_tuning.settle()
        log.info("serving %s as its templates describe it on %s (pid %d)", record["from_templates"], service.url,
                 os.getpid())
        serve_until_signalled(service)
        return 0
    apply_env(handler_env(record["redis_url"], record["aws_endpoint"], str(state.jwks_file)))
    ensure_resources()
    from infra.local.sfn.service_env import deploy_state_machines

    deploy_state_machines(record["aws_endpoint"])
    service = Service(record["redis_url"], port=record["gateway_port"],
                      api_workers=tuple(record.get("api_workers", (2, 16))), redis_pidfile=state.pidfile("redis"))
    service.start()
    gc_tuning.settle()
    log.info("serving on %s (pid %d)", service.url, os.getpid())
    serve_until_signalled(service)
    return 0


if __name__ == "__main__":
    sys.exit(main())
