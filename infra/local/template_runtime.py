"""The embedded runtime as the synthesized templates describe it (`skyfn local up
--from-templates`; issue 25).

`prepare` runs in `skyfn local up`, once moto and redis-server are up: it reads the cloud
assembly (`cdk.out/`, or $SKYFN_CDK_OUT), creates each IAM role with its template's policy
documents, the tables, queues, bucket, secrets and state machines of the templates, and
the step functions in moto's Lambda API (the state machines invoke them there), then turns
moto's IAM enforcement on. Each function gets credentials of its own role (STS AssumeRole,
session named after the function) and its template's environment, resolved to the local
resources. The result is written to `<home>/local/templates/functions.json` (0600: it
holds the sessions' keys).

`service` runs in the service process: the API function behind the gateway, the results
function behind the event-source mapping of its template (the SQS results queue, polled
with that function's role), and one schedule per target of each EventBridge rule, with
the rule target's Input as the event. Every environment is built from the function's
configuration alone, as Lambda builds it.

What cannot come from the templates here is substituted, and only that (SUBSTITUTED, and
docs/deploy.md "The runtime from the templates"): the local issuer for Cognito or Globus
Auth, the local redis-server (no TLS) for ElastiCache, the gateway's push hub for the
WebSocket API, the runtime's periods for EventBridge rates.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from infra.local.standins.lambda_pool import REPO_ROOT
from infra.local.state import StateDir
from skyfn.private_file import write_private

CDK_OUT_ENV = "SKYFN_CDK_OUT"
REGION = "us-east-1"
ACCOUNT = "123456789012"

# Schedules: the template's targets and inputs at the embedded runtime's periods (a rate of
# minutes would make every test wait for the reaper); keyed by the handler of the target.
LOCAL_PERIODS = {"lambdas.reaper.handler": 5.0, "lambdas.history.handler": 0.5}
DEFAULT_PERIOD = 60.0

# What the embedded runtime puts in place of a managed service it cannot run, variable by
# variable. Anything not listed here comes from the template, resolved.
SUBSTITUTED = {
    "SKYFN_AUTH_PROVIDER": "Cognito/Globus Auth -> the local issuer (skyfn local token): tokens are checked "
                           "by the handlers against its key set",
    "SKYFN_AUTH_ISSUER": "the local issuer",
    "SKYFN_AUTH_AUDIENCE": "the local issuer's audience",
    "SKYFN_AUTH_JWKS_FILE": "the local issuer's public key set",
    "SKYFN_REDIS_URL": "ElastiCache (rediss://, TLS) -> the local redis-server (redis://, its password from the "
                       "template's AUTH-token secret)",
    "SKYFN_PUSH": "the WebSocket API (apigw) -> the local gateway's push hub (redis PUBLISH)",
    "SKYFN_RENDEZVOUS_ADDRESS": "the rendezvous ECS service behind its load balancer -> a local `python -m "
                                "rendezvous` (its address and secret from our SKYFN_RENDEZVOUS_ADDRESS/_SECRET)",
}


class TemplateRuntimeError(Exception):
    """The templates cannot be run here; the message names what and the fix."""


def cdk_out_dir(path: str | os.PathLike | None = None) -> Path:
    raw = path or os.environ.get(CDK_OUT_ENV) or REPO_ROOT / "cdk.out"
    folder = Path(raw).expanduser().resolve()
    if not (folder / "manifest.json").is_file():
        raise TemplateRuntimeError(
            f"no cloud assembly in {folder} (manifest.json is missing): run `make synth` (or `make synth-local` for "
            f"the account and region the runtime uses), or point --cdk-out / ${CDK_OUT_ENV} at a cdk.out folder")
    return folder


def functions_file(state: StateDir) -> Path:
    return state.workdir("templates") / "functions.json"


@dataclass
class LocalSide:
    """What the templates' references to services that are not run here resolve to."""
    aws_url: str
    redis_url: str          # redis://default:<password>@127.0.0.1:<port>/0
    jwks_file: str
    gateway_url: str

    @property
    def redis_password(self) -> str:
        from urllib.parse import urlparse

        return urlparse(self.redis_url).password or ""

    def settings(self):
        from urllib.parse import urlparse

        from infra.local.templates import LocalSettings

        u = urlparse(self.redis_url)
        return LocalSettings(aws_endpoint_url=self.aws_url, redis_host=u.hostname, redis_port=u.port,
                             redis_url=self.redis_url, gateway_url=self.gateway_url,
                             websocket_url=self.gateway_url.replace("http", "ws", 1) + "/ws")

    def secret_values(self, dep) -> dict[str, str]:
        """The values of the templates' secrets that must match a local process: the Redis AUTH
        token (the local redis-server's password) and, when a local rendezvous server runs
        (SKYFN_RENDEZVOUS_SECRET in our environment), its signing secret."""
        values = {}
        for fn in dep.functions.values():
            named = json.loads(fn.environment.get("SKYFN_SECRET_ENV") or "{}")
            if "SKYFN_REDIS_PASSWORD" in named:
                values[named["SKYFN_REDIS_PASSWORD"]] = self.redis_password
            if "SKYFN_RENDEZVOUS_SECRET" in named and os.environ.get("SKYFN_RENDEZVOUS_SECRET"):
                values[named["SKYFN_RENDEZVOUS_SECRET"]] = os.environ["SKYFN_RENDEZVOUS_SECRET"]
        return values

    def substitutions(self, handler_env: dict[str, str]) -> dict[str, str]:
        out = {}
        if "SKYFN_AUTH_PROVIDER" in handler_env or "SKYFN_AUTH_ISSUER" in handler_env:
            out.update(SKYFN_AUTH_PROVIDER="jwt", SKYFN_AUTH_ISSUER="skyfn-local", SKYFN_AUTH_AUDIENCE="skyfn",
                       SKYFN_AUTH_JWKS_FILE=self.jwks_file)
        if handler_env.get("SKYFN_PUSH") == "apigw":
            out["SKYFN_PUSH"] = "redis"
        if "SKYFN_RENDEZVOUS_ADDRESS" in handler_env and os.environ.get("SKYFN_RENDEZVOUS_ADDRESS"):
            out["SKYFN_RENDEZVOUS_ADDRESS"] = os.environ["SKYFN_RENDEZVOUS_ADDRESS"]
        return out


def lambda_env(name: str, handler: str, memory: int, region: str, aws_url: str) -> dict[str, str]:
    """The variables Lambda itself sets in a function's environment (its credentials are
    added once IAM is enforced), and the AWS endpoint."""
    return {"_HANDLER": handler, "AWS_REGION": region, "AWS_DEFAULT_REGION": region, "AWS_LAMBDA_FUNCTION_NAME": name,
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(memory), "AWS_ENDPOINT_URL": aws_url}


def access_log(state: StateDir) -> Path:
    """moto's record of every request IAM checked (infra.local.standins.iam.report reads it)."""
    return state.workdir("templates") / "iam-access.jsonl"


def moto_env(state: StateDir) -> dict[str, str]:
    """moto's settings for the templates: IAM enforceable with each request's resource,
    its checks logged, and the step functions' environments built like Lambda's."""
    access_log(state).parent.mkdir(parents=True, exist_ok=True)
    return {"SKYFN_MOTO_IAM_RESOURCES": "1", "SKYFN_IAM_ACCESS_LOG": str(access_log(state)),
            "SKYFN_BRIDGE_CLEAN_ENV": "1"}


def target(handler: str) -> str:
    """Lambda's "module.attr" as the pools' "module:attr"."""
    module, _, attr = handler.rpartition(".")
    return f"{module}:{attr}"


def ours(handler: str) -> bool:
    """Handlers of this repository (the CDK's own custom-resource functions are not run here)."""
    return handler.startswith(("lambdas.", "stepfunctions."))


# -- skyfn local up: everything the templates create, then IAM enforced ---------------------

def prepare(state: StateDir, cdk_out: Path, local: LocalSide, echo: Callable[[str], None] = print) -> dict:
    """Create what the templates describe in moto (roles first), switch IAM enforcement on,
    and write every function's configuration and credentials to functions.json. Returns the
    deployer's keys (the runtime's own calls once IAM is enforced: snapshots at `down`)."""
    import boto3

    from infra.local.standins.iam import roles as iam_roles
    from infra.local.templates import CloudAssembly, Deployment
    from infra.local.templates.provision import provision

    try:
        dep = Deployment.from_assembly(CloudAssembly.load(cdk_out), local.settings())
    except Exception as exc:  # noqa: BLE001 - an assembly we cannot read is the user's to fix: one line
        raise TemplateRuntimeError(f"cannot run the templates in {cdk_out}: {type(exc).__name__}: {exc}") from None
    region = dep.settings.region
    deployer = iam_roles.deployer_credentials(local.aws_url, region=region)
    session = boto3.Session(aws_access_key_id=deployer["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=deployer["AWS_SECRET_ACCESS_KEY"], region_name=region)

    def client(service: str):
        return session.client(service, endpoint_url=local.aws_url)

    iam_roles.create_roles([iam_roles.role_spec(r) for r in dep.roles.values()], local.aws_url, deployer, region=region)
    provision(dep, client, secret_values=local.secret_values(dep))
    functions = {name: fn for name, fn in dep.functions.items() if ours(fn.handler)}
    configs = {name: {"name": name, "handler": fn.handler, "timeout": fn.timeout, "memory": fn.memory,
                      "reserved_concurrency": fn.reserved_concurrency, "role": fn.role_arn,
                      "env": {**fn.environment, **local.substitutions(fn.environment),
                              **lambda_env(name, fn.handler, fn.memory, region, local.aws_url)}}
               for name, fn in functions.items()}
    _step_functions(client("lambda"), dep, configs)  # the bridge gives them their role's session itself
    iam_roles.enforce(local.aws_url)
    for name, c in configs.items():  # a session of its own role, named after the function, as Lambda's
        c["env"].update(iam_roles.function_credentials(c["role"], name, endpoint_url=local.aws_url,
                                                       deployer=deployer, region=region))
    wiring = {"functions": configs, "results": _results_mapping(dep, configs), "schedules": _schedules(dep, configs),
              "not_local": dep.not_local, "substituted": sorted(SUBSTITUTED)}
    write_private(functions_file(state), json.dumps(wiring, indent=1) + "\n")
    echo(f"from the templates in {cdk_out}: {len(configs)} functions, {len(dep.tables)} tables, "
         f"{len(dep.queues)} queues, {len(dep.state_machines)} state machines, {len(dep.roles)} roles; IAM enforced")
    return {**deployer, "AWS_REGION": region}


def _step_functions(lam, dep, configs: dict) -> None:
    """The functions the state machines invoke, in moto's Lambda API (infra.local.standins.sfn.moto_bridge
    runs their handlers with this configuration, credentials included)."""
    from botocore.exceptions import ClientError

    from infra.local.standins.sfn.deploy import placeholder_zip

    named = set()
    for machine in dep.state_machines.values():
        named |= {name for name in configs if dep.functions[name].arn in machine.definition}
    for name in sorted(named):
        c = configs[name]
        config = {"Role": c["role"], "Handler": c["handler"], "Runtime": "python3.11", "Timeout": c["timeout"],
                  "MemorySize": c["memory"], "Environment": {"Variables": c["env"]}}
        try:
            lam.create_function(FunctionName=name, Code={"ZipFile": placeholder_zip()}, **config)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ResourceConflictException":
                raise
            lam.update_function_configuration(FunctionName=name, **config)


def _results_mapping(dep, configs: dict) -> dict:
    mappings = [m for m in dep.event_source_mappings if m.enabled and m.function_name in configs]
    if len(mappings) != 1:
        raise TemplateRuntimeError(f"the templates have {len(mappings)} event-source mappings for our functions; "
                                   "the embedded runtime runs exactly one (the results queue)")
    m = mappings[0]
    queue = dep.queue_by_arn(m.event_source_arn)
    if queue is None:
        raise TemplateRuntimeError(f"the event-source mapping of {m.function_name} reads {m.event_source_arn}, "
                                   "which is not a queue of the templates")
    return {"function": m.function_name, "queue_name": queue.name, "queue_url": queue.url,
            "visibility_timeout": queue.visibility_timeout or 30, "max_deliveries": queue.max_receive_count or 5,
            "batch_size": m.batch_size}


def _schedules(dep, configs: dict) -> list[dict]:
    out = []
    for rule in dep.rules.values():
        if not rule.enabled or rule.schedule_seconds is None:
            continue
        for t in rule.targets:
            if t.function_name not in configs:
                continue
            handler = configs[t.function_name]["handler"]
            out.append({"name": f"{rule.name}/{t.id}", "function": t.function_name,
                        "period": LOCAL_PERIODS.get(handler, float(rule.schedule_seconds)),
                        "event": json.loads(t.input) if t.input else None})
    return out


# -- the service process ---------------------------------------------------------------

def load(state: StateDir) -> dict:
    try:
        return json.loads(functions_file(state).read_text())
    except (OSError, ValueError) as exc:
        raise TemplateRuntimeError(f"{functions_file(state)} is missing or unreadable ({exc}): "
                                   "start the runtime with `skyfn local up --from-templates`") from None


def service_settings(state: StateDir) -> dict:
    """The keyword arguments of infra.local.serve.Service that wire it as the templates say."""
    import boto3

    from infra.local.standins.scheduler import Schedule
    from skyfn.protocol.queues.sqs import SqsQueue

    wiring = load(state)
    functions = wiring["functions"]
    api = _one(functions, "lambdas.api.handler")
    mapping = wiring["results"]
    results_fn = functions[mapping["function"]]

    def results_queue():  # polled as Lambda polls it: with the results function's role
        c = results_fn["env"]
        client = boto3.client("sqs", region_name=c["AWS_REGION"], endpoint_url=c["AWS_ENDPOINT_URL"],
                              aws_access_key_id=c["AWS_ACCESS_KEY_ID"], aws_secret_access_key=c["AWS_SECRET_ACCESS_KEY"],
                              aws_session_token=c["AWS_SESSION_TOKEN"])
        return SqsQueue(mapping["queue_name"], url=mapping["queue_url"], client=client,
                        visibility_timeout=mapping["visibility_timeout"], max_deliveries=mapping["max_deliveries"])

    schedules = [Schedule(s["name"], s["period"], target=target(functions[s["function"]]["handler"]),
                          env=functions[s["function"]]["env"], inherit=False, event=s["event"],
                          timeout_seconds=functions[s["function"]]["timeout"],
                          nice=10 if functions[s["function"]]["handler"] == "lambdas.history.handler" else 0)
                 for s in wiring["schedules"]]
    return {"api": target(api["handler"]), "api_env": api["env"], "api_function": api["name"],
            "push_authorizer_env": _one(functions, "lambdas.ws.authorizer")["env"],
            "results": _invoker(results_fn), "results_queue": results_queue, "results_batch": mapping["batch_size"],
            "results_function": results_fn["name"], "schedules": schedules}


def _one(functions: dict, handler: str) -> dict:
    found = [f for f in functions.values() if f["handler"] == handler]
    if len(found) != 1:
        raise TemplateRuntimeError(f"the templates have {len(found)} functions with handler {handler}, not one")
    return found[0]


def _invoker(fn: dict) -> Callable:
    """A handler callable (event, context) that runs `fn` in its own environments."""
    import uuid

    from infra.local.standins.lambda_pool import LambdaPool

    pool = LambdaPool(target(fn["handler"]), min_workers=1, max_workers=4, env=fn["env"], inherit=False).start()

    def invoke(event, context):
        return pool.invoke(event, fn["name"], float(fn["timeout"]), str(uuid.uuid4()))

    invoke.close = pool.close
    return invoke
