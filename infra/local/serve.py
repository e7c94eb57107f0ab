"""The service process of the embedded runtime: the gateway (REST API handler in its
Lambda environments), the results event-source mapping and the schedules, together.

`skyfn local up` runs it in its own process when detached:

    python -m infra.local.serve --home $SKYFN_HOME

It reads the deployment (ports, URLs) from `$SKYFN_HOME/local/runtime.json`, sets the
handlers' environment, creates the AWS resources (idempotent) and serves until SIGTERM
or SIGINT, then stops its parts in order (schedules, event source, gateway).

`skyfn local up` starts it before moto is up, with three descriptors (infra/local/startup.py):
`--go-fd` (it starts its handlers' environments, then waits for a line there before talking
to moto: moto listens), `--listen-fd` (the gateway's socket, bound by `up`, so the agent
can connect before the gateway serves) and `--ready-fd` (one JSON line once every part
serves, with the time of each start-up step; or the error). Each step is logged too.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Callable

from infra.local.standins.event_source import EventSourceMapping, redis_results_queue
from infra.local.standins.gateway import Gateway
from infra.local.rewrite_yield import RewriteYield
from infra.local.standins.scheduler import Scheduler, default_schedules
from infra.local.startup import StepLog
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
                 results_batch: int = 100, results_function: str = "skyfn-results", redis_pidfile=None,
                 sock=None):
        """`api_env` (with it, the API's environments are built from it alone, as Lambda's),
        `results_queue` (a factory of the results queue; default: the runtime's Redis
        stream) and the functions' names serve the runtime started from the templates.
        `sock`: the gateway's listening socket, bound already (instead of `port`)."""
        from infra.local.standins.push_hub import PushHub

        self.push_hub = PushHub(redis_url) if push else None  # the WebSocket API (results push)
        self.gateway = Gateway(api, port=port, workers=api_workers, websocket=self.push_hub, ui=push,
                               function_name=api_function, env=api_env, inherit=api_env is None, sock=sock)
        self.event_source = EventSourceMapping(
            results_queue or (lambda: redis_results_queue(redis_url, "results", results_visibility)), results,
            function_name=results_function, batch_size=results_batch, declare=results_queue is None)
        self.scheduler = Scheduler(schedules if schedules is not None
                                   else default_schedules(reaper_period, history_period))
        self.rewrite_yield = RewriteYield(redis_pidfile) if redis_pidfile is not None else None

    @property
    def url(self) -> str:
        return self.gateway.url

    def start(self, steps: StepLog | None = None, deploy: Callable[[], None] | None = None) -> "Service":
        """Prepare the parts that take long: the gateway's and the schedules' handler
        environments (processes, started side by side in threads) while this thread loads
        the results function and runs `deploy` (what must exist before anything is served:
        tables, queues, state machines; in-process imports stay in one thread, where no
        import can meet another's half-imported module); then start every part serving, in
        order. If anything fails, what was started is stopped and the error raised. `steps`
        records how long each took (`skyfn local up --timings`)."""
        steps = steps or StepLog()
        parts = [p for p in (self.rewrite_yield, self.push_hub, self.gateway, self.event_source, self.scheduler)
                 if p is not None]
        spawning = [p for p in (self.gateway, self.scheduler) if p is not None]
        here = [(f"start {_PART_NAMES[type(p).__name__]}", p.prepare) for p in (self.event_source,)]
        if deploy is not None:
            here.append(("deploy", deploy))
        errors: list[BaseException] = []

        def run(name: str, job: Callable) -> None:
            try:
                with steps.step(name):
                    job()
            except BaseException as exc:  # noqa: BLE001 - raised below, once every job has finished
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(f"start {_PART_NAMES[type(p).__name__]}", p.prepare),
                                    name=f"start-{type(p).__name__}", daemon=True) for p in spawning]
        for t in threads:
            t.start()
        for job in here:
            if not errors:
                run(*job)
        for t in threads:
            t.join()
        started = []
        try:
            if errors:
                raise errors[0]
            with steps.step("serve"):
                for part in parts:
                    part.start()
                    started.append(part)
        except BaseException:
            for part in reversed(parts):
                if part in started or hasattr(part, "prepare"):  # a prepared part holds processes
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


_PART_NAMES = {"Gateway": "gateway (API environments)", "EventSourceMapping": "results function",
               "Scheduler": "schedules (reaper, history environments)"}


def serve_until_signalled(service: Service) -> None:
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    log.info("stopping")
    service.stop()


def plan_resources(aws_endpoint: str, steps: StepLog, *, account: str | None = None,
                   wait_go: Callable[[], None] | None = None, snapshot_dir=None,
                   restored: dict | None = None) -> Callable[[], None]:
    """Export the settings the handlers get from the deployment (the state machines' ARNs,
    named in advance from `account`, else from STS once `wait_go` says moto is up:
    infra/local/standins/sfn/service_env.py) and return the deployment itself, to run beside the
    start of the handlers' environments: (`wait_go`, then) moto's DynamoDB and S3 restored
    from `snapshot_dir` (the last `skyfn local down` saved them; counts into `restored`),
    then the tables and the results queue (lambdas.bootstrap); the state machines with their
    step functions beside both. All idempotent; the state machines must come out
    as announced."""
    from infra.local.standins.sfn.service_env import announce_state_machines, deploy_state_machines

    if account is None and wait_go is not None:
        wait_go()
        wait_go = None
    with steps.step("name the state machines" + (" (STS)" if account is None else "")):
        planned = announce_state_machines(aws_endpoint, account)

    def deploy() -> None:
        with steps.step("import the deploy (boto3, the handlers' bootstrap)"):
            from infra.local.handlers import ensure_resources  # noqa: I001 - both before the threads below
            import lambdas.bootstrap  # noqa: F401
        if wait_go is not None:
            wait_go()
        errors: list[BaseException] = []

        def run(name: str, fn) -> None:
            try:
                with steps.step(name):
                    fn()
            except BaseException as exc:  # noqa: BLE001 - raised below, once both have finished
                errors.append(exc)

        # the state machines need nothing restored: they deploy beside the restore and the tables
        other = threading.Thread(target=run, name="deploy-state-machines", daemon=True, args=(
            "deploy state machines", lambda: deploy_state_machines(aws_endpoint, planned)))
        other.start()
        if snapshot_dir is not None and (snapshot_dir / "tables.json").exists():
            from infra.local import snapshot

            run("restore moto's DynamoDB and S3",
                lambda: (restored if restored is not None else {}).update(snapshot.load(aws_endpoint, snapshot_dir)))
        if not errors:
            run("create tables and queues", ensure_resources)
        other.join()
        if errors:
            raise errors[0]

    return deploy


def start_service(state, record: dict, steps: StepLog, sock=None, restored: dict | None = None,
                  wait_go: Callable[[], None] | None = None) -> Service:
    """The service of the deployment `record` (runtime.json), started: resources deployed
    (with `restored` a dict, moto was just started: its state is restored from the last
    snapshot first, counts into `restored`; from the templates `skyfn local up` restores it
    before it provisions), every part serving. In this process; `sock` is the gateway's
    listening socket; `wait_go` returns once moto is up (and, from the templates,
    provisioned): the handlers' environments start before it."""
    api_workers = tuple(record.get("api_workers", (2, 16)))
    if record.get("from_templates"):  # issue 25: every function's environment comes from its template
        from infra.local import template_runtime

        if wait_go is not None:
            wait_go()
            record = state.read_runtime()  # with the deployer's settings
        with steps.step("read the templates"):
            settings = template_runtime.service_settings(state)
        # the push hub checks WebSocket tokens in this process (lambdas.auth), as the WebSocket
        # API's authorizer function does: with that function's environment and role
        os.environ.update(settings.pop("push_authorizer_env"))
        service = Service(record["redis_url"], port=record["gateway_port"], api_workers=api_workers,
                          redis_pidfile=state.pidfile("redis"), sock=sock, **settings)
        return service.start(steps)
    from infra.local.rendezvous import local_rendezvous

    apply_env({**handler_env(record["redis_url"], record["aws_endpoint"], str(state.jwks_file)),
               **local_rendezvous(state)})
    deploy = plan_resources(record["aws_endpoint"], steps, account=record.get("aws_account"), wait_go=wait_go,
                            restored=restored,
                            snapshot_dir=state.workdir("moto") / "snapshot"
                            if record.get("moto_port") and restored is not None else None)
    service = Service(record["redis_url"], port=record["gateway_port"], api_workers=api_workers,
                      redis_pidfile=state.pidfile("redis"), sock=sock)
    return service.start(steps, deploy=deploy)


def _go(fd: int | None, steps: StepLog) -> Callable[[], None] | None:
    """What waits for `skyfn local up`'s go on the pipe `fd` (moto listens; from the templates,
    provisioned): raises if `up` went away first."""
    if fd is None:
        return None

    def wait() -> None:
        with steps.step("wait for moto"):
            with os.fdopen(fd, "rb") as go:
                if not go.readline():
                    raise RuntimeError("`skyfn local up` went away before moto was up")
    return wait


def main(argv: list[str] | None = None) -> int:
    from infra.local.startup import now_ms, process_start_ms, report
    from infra.local.state import StateDir

    parser = argparse.ArgumentParser(prog="python -m infra.local.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", help="SKYFN_HOME (default: $SKYFN_HOME or ~/.skyfn)")
    parser.add_argument("--listen-fd", type=int, help="serve on this listening socket (bound by `skyfn local up`)")
    parser.add_argument("--go-fd", type=int, help="start the handlers' environments, then wait for a line on this "
                                                  "pipe before talking to moto (it is up)")
    parser.add_argument("--ready-fd", type=int, help="write one JSON line on this pipe once serving (or failed)")
    parser.add_argument("--restore-moto", action="store_true", help="moto was just started: load the DynamoDB and "
                                                                     "S3 state the last `skyfn local down` saved")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("SKYFN_LOG_LEVEL", "INFO").upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # AWS SDK wire logs at DEBUG echo request parameters, which carry the handlers'
    # environment (the Redis URL with its password) when functions are deployed: never below INFO.
    for noisy in ("botocore", "boto3", "s3transfer", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.INFO, logging.getLogger().level))
    steps = StepLog(log)
    steps.record("start python, import the service", process_start_ms(), now_ms())
    record: dict = {}
    try:
        state = StateDir.at(args.home)
        record = state.read_runtime()
        if not record:
            raise RuntimeError(f"no {state.runtime_file}: start the runtime with `skyfn local up`")
        state.signing_key()  # makes sure the key set exists (a deployment from before keys: created now)
        sock = None
        if args.listen_fd is not None:
            import socket

            sock = socket.socket(fileno=args.listen_fd)
        restored = {} if args.restore_moto else None  # a restart of the service alone (recover.py): moto has it
        service = start_service(state, record, steps, sock, restored, _go(args.go_fd, steps))
        with steps.step("settle the garbage collector"):
            gc_tuning.settle()
    except BaseException as exc:
        log.exception("starting the service failed")
        report(args.ready_fd, {"error": f"{type(exc).__name__}: {exc}"})
        return 2
    log.info("serving on %s (pid %d)%s", service.url, os.getpid(),
             f" as its templates ({record['from_templates']}) describe it" if record.get("from_templates") else "")
    report(args.ready_fd, {"ready": True, "pid": os.getpid(), "url": service.url, "steps": steps.steps,
                           "restored": restored or {}})
    serve_until_signalled(service)
    return 0


if __name__ == "__main__":
    sys.exit(main())
