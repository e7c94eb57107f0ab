"""moto in server mode, with its Lambda invocations of skyfn's step handlers running the
real handler code. moto's Step Functions interpreter invokes a Task state's Lambda
through moto's own Lambda API, and moto runs no Lambda code without Docker (an invoke
echoes its input); this entry point makes the invoke of a function whose Handler is one
of ours run that handler, so state machines under moto execute real code.

    python -m infra.local.standins.sfn.moto_bridge -H 127.0.0.1 -p PORT

Each such function gets its own pool of Lambda-like execution environments
(infra.local.standins.lambda_pool: one process per environment, warm, one event at a time) with
the function's Environment variables, as on AWS. Only handlers listed in
stepfunctions.catalog (plus SKYFN_BRIDGE_EXTRA_HANDLERS, comma-separated) are run; any
other function keeps moto's behaviour. The interpreter reaches the Lambda API at
localhost:$MOTO_PORT, so MOTO_PORT is set to the served port here. With
SKYFN_MOTO_IAM_RESOURCES=1, IAM can be enforced as on AWS (infra.local.standins.iam.moto_resources)
and each function's environments run with a session of its role.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
import uuid

log = logging.getLogger("skyfn.moto_bridge")

_pools: dict[tuple, object] = {}
_pools_lock = threading.Lock()


def allowed_handlers() -> set[str]:
    from stepfunctions.catalog import STEPS

    extra = {h.strip() for h in os.environ.get("SKYFN_BRIDGE_EXTRA_HANDLERS", "").split(",") if h.strip()}
    return {s.handler for s in STEPS.values()} | extra


def _pool(fn) -> object:
    from infra.local.standins.iam.moto_resources import function_env
    from infra.local.standins.lambda_pool import LambdaPool

    env = dict(fn.environment_vars or {})
    env.update(function_env(fn))  # its role's session when IAM is enforced (infra.local.standins.iam)
    key = (fn.function_arn, fn.handler, tuple(sorted(env.items())))
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            module, _, attr = fn.handler.rpartition(".")
            max_workers = int(os.environ.get("SKYFN_BRIDGE_MAX_WORKERS", "8"))
            # SKYFN_BRIDGE_CLEAN_ENV=1 (--from-templates): the function's configuration alone, as Lambda's
            pool = LambdaPool(f"{module}:{attr}", min_workers=1, max_workers=max_workers, env=env, start_timeout=60.0,
                              inherit=os.environ.get("SKYFN_BRIDGE_CLEAN_ENV") != "1").start()
            _pools[key] = pool
            log.info("execution environments for %s (%s) started", fn.function_name, fn.handler)
        return pool


def _error_payload(error_type: str, message: str, trace: str = "") -> bytes:
    return json.dumps({"errorType": error_type, "errorMessage": message,
                       "stackTrace": trace.splitlines()[-20:]}).encode()


def invoke_handler(fn, body, request_headers, response_headers) -> bytes:
    """Run `fn`'s handler on the event in `body`; a Lambda invoke's response payload."""
    from infra.local.standins.lambda_pool import HandlerFailed, HandlerTimedOut

    try:
        event = json.loads(body) if body else {}
    except ValueError:
        event = body
    timeout = float(fn.timeout or 3)
    try:
        answer = _pool(fn).invoke(event, fn.function_name, timeout, str(uuid.uuid4()))
        payload = json.dumps(answer).encode()
    except HandlerFailed as exc:
        name, _, message = str(exc).partition(": ")
        response_headers["x-amz-function-error"] = "Unhandled"
        payload = _error_payload(name or "Exception", message or str(exc), exc.remote_traceback)
    except HandlerTimedOut:
        response_headers["x-amz-function-error"] = "Unhandled"
        payload = _error_payload("Sandbox.Timedout", f"Task timed out after {timeout:.2f} seconds")
    except (TypeError, ValueError) as exc:  # an answer that is not JSON
        response_headers["x-amz-function-error"] = "Unhandled"
        payload = _error_payload("Runtime.MarshalError", f"Unable to marshal response: {exc}")
    response_headers["Content-Length"] = str(len(payload))
    return payload


def install() -> None:
    """Patch the invoke of moto's Lambda backends (idempotent). With use_docker false moto
    serves Lambda from LambdaSimpleBackend, whose invoke echoes; with Docker from
    LambdaBackend. Both are patched: our handlers run either way."""
    from moto.awslambda.models import LambdaBackend
    from moto.awslambda_simple.models import LambdaSimpleBackend

    from infra.local.standins.iam import moto_resources

    if moto_resources.enabled():  # SKYFN_MOTO_IAM_RESOURCES=1: IAM enforceable as on AWS
        moto_resources.install()
    allowed = allowed_handlers()
    for backend in (LambdaBackend, LambdaSimpleBackend):
        original = backend.__dict__.get("invoke")
        if original is None or getattr(original, "_skyfn_bridge", False):
            continue

        def invoke(self, function_name, qualifier, body, headers, response_headers, _original=original):
            fn = self.get_function(function_name, qualifier)
            if fn.handler in allowed:
                return invoke_handler(fn, body, headers, response_headers)
            return _original(self, function_name, qualifier, body, headers, response_headers)

        invoke._skyfn_bridge = True
        backend.invoke = invoke


def _port(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg in ("-p", "--port") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--port="):
            return arg.split("=", 1)[1]
    return None


# moto's Step Functions interpreter (the backend that executes state machines, MOTO_CONFIG)
# is imported by the first Step Functions call, and it imports moto.batch and with it all of
# moto.ec2, whose region data alone is ~0.5 s of JSON: ~0.8 s of CPU in all. Imported here
# while the server starts, it is ready by the time the service deploys its state machines
# instead of holding up that first call (`skyfn local up --timings`: service deploy).
PRELOAD = ("moto.stepfunctions.parser.models",)


def preload(modules=PRELOAD) -> threading.Thread:
    """Import `modules` in a daemon thread (a request that needs one meanwhile waits on
    Python's import lock for it, then finds it imported)."""
    def run() -> None:
        import importlib

        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the request that needs it will raise it where it is seen
                log.exception("preloading %s failed", name)

    thread = threading.Thread(target=run, name="skyfn-moto-preload", daemon=True)
    thread.start()
    return thread


def share_botocore_data() -> None:
    """One botocore data loader for every botocore session in this process. moto makes
    sessions of its own as it imports and builds services (ec2's region table alone makes
    three: it comes in with the Step Functions interpreter), and each new session's loader
    reads and parses botocore's endpoint and model JSON again: ~0.5 s of the start's CPU.
    The data is read-only, and botocore shares it between the clients of one session
    already; here the sessions share it too."""
    import functools

    import botocore.loaders
    import botocore.session

    if not getattr(botocore.session.create_loader, "_skyfn_shared", False):
        shared = functools.lru_cache(maxsize=None)(botocore.loaders.create_loader)
        shared._skyfn_shared = True
        botocore.session.create_loader = shared


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    port = _port(argv)
    if port:
        os.environ["MOTO_PORT"] = port
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    share_botocore_data()
    install()
    from moto.server import main as moto_main

    preload()
    moto_main(argv)


if __name__ == "__main__":
    main()
