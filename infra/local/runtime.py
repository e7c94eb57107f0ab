"""`skyfn local up | status | down | token`: the embedded runtime's life cycle.

up: redis-server (AOF) and moto server, each detached with a pid file; the service process
(gateway + results event source + schedules; `python -m infra.local.serve`) when detached,
or the same service inside this process in the foreground; a token for the local user
and the client config `$SKYFN_HOME/config.json`; then the endpoint `local`
(`skyfn-endpoint start local`), waiting until the service lists it online.
down: stops the agent, the service, moto and redis (only pids we recorded; SIGTERM, then
SIGKILL), removes the pid files and keeps redis's append-only file, so queued tasks and
results survive a restart.
"""
from __future__ import annotations

import getpass
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import requests

from infra.local import agent
from infra.local.lambda_pool import REPO_ROOT, child_env
from infra.local.processes import (AWS_STAND_IN_NICE, free_port, recorded_process, redis_maxmemory, start_moto,
                                   start_redis, terminate, write_pidfile)
from infra.local.state import PROCESS_NAMES, StateDir

ENDPOINT = "local"


class LocalError(Exception):
    """A problem the user can act on; the CLI prints it as one line."""


def local_user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "local"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _pick_port(wanted: int | None, previous: int | None, what: str) -> int:
    if wanted:
        if not _port_free(wanted):
            raise LocalError(f"port {wanted} for the {what} is taken: choose another with --port, or stop what uses it")
        return wanted
    if previous and _port_free(previous):
        return previous  # keep URLs stable across restarts
    return free_port()


LOCAL_IDENTITY_PROVIDER = "skyfn-local"


def mint_token(state: StateDir, user: str, ttl_seconds: int = 30 * 24 * 3600, *, username: str | None = None,
               email: str | None = None, identity_provider: str = LOCAL_IDENTITY_PROVIDER) -> str:
    """A token of the local issuer for `user`, signed with the runtime's private key, with the
    identity claims a multi-user endpoint maps (DESIGN.md section 12): `preferred_username`
    (default: `user`), `identity_provider` ("skyfn-local") and `email` (only when given)."""
    from infra.local.handlers import mint_token as mint

    key = state.signing_key(create=False)
    if not key:
        raise LocalError(f"no local runtime in {state.root}: run `skyfn local up` first")
    return mint(key, user, ttl_seconds, username=username or user, email=email or None,
                identity_provider=identity_provider or LOCAL_IDENTITY_PROVIDER)


# -- looking at a deployment ---------------------------------------------------------

def running_processes(state: StateDir) -> dict:
    return {name: recorded_process(state.pidfile(name)) for name in PROCESS_NAMES}


def _get_endpoints(url: str, token: str, timeout: float = 3.0) -> list[dict]:
    r = requests.get(f"{url}/endpoints", headers={"Authorization": f"Bearer {token}"}, timeout=timeout)
    if r.status_code != 200:
        raise LocalError(f"GET /endpoints answered {r.status_code}: {r.text[:200]}")
    return r.json().get("endpoints", [])


def _client_token(state: StateDir) -> str | None:
    import json

    try:
        return json.loads(state.client_config.read_text()).get("token")
    except (OSError, ValueError, AttributeError):
        return None


def status(home=None) -> dict:
    """Processes (pid, alive, port), service health and the endpoints it knows."""
    state = StateDir.at(home)
    record = state.read_runtime()
    procs = running_processes(state)
    ports = {"redis": record.get("redis_port"), "moto": record.get("moto_port"), "service": record.get("gateway_port")}
    report = {"home": str(state.home), "service_url": record.get("service_url"), "processes": {}, "endpoints": [],
              "healthy": False, "error": None}
    for name in PROCESS_NAMES:
        proc = procs[name]
        report["processes"][name] = {"pid": proc.pid if proc else None, "alive": proc is not None,
                                     "port": ports.get(name)}
    agent_proc = recorded_process(agent.pidfile(state.home, ENDPOINT))
    report["processes"]["agent"] = {"pid": agent_proc.pid if agent_proc else None, "alive": agent_proc is not None,
                                    "port": None}
    if procs["service"] is not None and record.get("service_url"):
        token = _client_token(state) or mint_token(state, local_user())
        try:
            report["endpoints"] = _get_endpoints(record["service_url"], token)
            report["healthy"] = True
        except (requests.RequestException, LocalError, ValueError) as exc:
            report["error"] = str(exc)
    if procs["redis"] is not None and record.get("redis_url"):
        report["backlog"] = backlog_report(record["redis_url"])
    return report


BACKLOG_WARNING_AT = 0.5  # of the bound: the embedded runtime's counterpart of the HistoryBacklog alarm


def backlog_report(redis_url: str) -> dict:
    """The hot store's backlog gauge (lambdas/core/tasks/backlog.py) with its bounds, the
    fraction of the nearest bound reached (`pressure`; 429 backlog from 1.0 on) and a
    `warning` from half of it on; {"error": ...} when Redis does not answer."""
    import redis

    from lambdas.config import settings
    from lambdas.core.tasks import backlog

    client = redis.Redis.from_url(redis_url, socket_timeout=3)
    try:
        b = backlog.read(client)
    except redis.RedisError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        client.close()
    s = settings()
    pressure = backlog.pressure(b)
    warning = backlog.overloaded(b)
    if warning:
        warning = f"{warning}; submissions get 429 backlog until the history drain catches up"
    elif pressure >= BACKLOG_WARNING_AT:
        warning = (f"the backlog is at {pressure:.0%} of its bound (outbox {b.outbox:,} of {s.backlog_max:,}"
                   + (f", memory {b.used_bytes / 2**20:,.0f} of {s.backlog_memory_fraction * b.max_bytes / 2**20:,.0f}"
                      " MiB" if b.max_bytes else "")
                   + "): at 100% submissions get 429 backlog")
    return {**b.as_dict(), "backlog_max": s.backlog_max, "memory_fraction": s.backlog_memory_fraction,
            "pressure": round(pressure, 4), "warning": warning}


# -- up --------------------------------------------------------------------------------

@dataclass
class _Started:
    """What this `up` started, to undo on failure."""
    state: StateDir
    servers: list = field(default_factory=list)
    service_proc: subprocess.Popen | None = None
    service: object = None

    def undo(self) -> None:
        agent.stop(ENDPOINT, self.state.home)
        if self.service is not None:
            self.service.stop()
        if self.service_proc is not None:
            import psutil

            try:
                terminate(psutil.Process(self.service_proc.pid))
            except psutil.Error:
                pass
        for server in reversed(self.servers):
            server.stop()
        for name in PROCESS_NAMES:
            self.state.pidfile(name).unlink(missing_ok=True)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def _wait_healthy(url: str, token: str, proc: subprocess.Popen | None, log: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise LocalError(f"the service process exited with code {proc.returncode} while starting: "
                             f"{_tail(log)} (full log: {log})")
        try:
            _get_endpoints(url, token, timeout=2.0)
            return
        except (requests.RequestException, LocalError) as exc:
            last = str(exc)
        time.sleep(0.1)
    raise LocalError(f"the service at {url} did not become healthy within {timeout:.0f} s ({last}); see {log}")


def _wait_endpoint_online(url: str, token: str, name: str, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        try:
            for ep in _get_endpoints(url, token):
                if ep.get("name") == name:
                    seen = ep
                    if ep.get("status") == "online":
                        return ep
        except (requests.RequestException, LocalError):
            pass
        time.sleep(0.2)
    raise LocalError(f"endpoint {name!r} is not online after {timeout:.0f} s "
                     f"({'status ' + seen['status'] if seen else 'not registered'}); "
                     f"see its log with `skyfn-endpoint status {name}`")


def up(home=None, detach: bool = False, port: int | None = None, aws_endpoint: str | None = None,
       endpoint: bool = True, api_workers: tuple[int, int] = (2, 16), from_templates: bool = False,
       cdk_out: str | None = None, echo: Callable[[str], None] = print) -> dict:
    """Start the runtime. Detached: return once everything is healthy. Foreground: serve
    until SIGINT/SIGTERM, then shut everything down. `from_templates`: the service as the
    cloud assembly `cdk_out` describes it (infra/local/template_runtime.py)."""
    state = StateDir.at(home)
    state.ensure()
    templates = None
    if from_templates:
        from infra.local import template_runtime

        if aws_endpoint:
            raise LocalError("--from-templates runs its own moto (IAM enforced): leave out --aws-endpoint")
        if not detach:
            raise LocalError("--from-templates runs detached only: add --detach (the service runs in its own process)")
        try:
            templates = template_runtime.cdk_out_dir(cdk_out)
        except template_runtime.TemplateRuntimeError as exc:
            raise LocalError(str(exc)) from None
    procs = running_processes(state)
    record = state.read_runtime()
    if procs["service"] is not None:
        raise LocalError(f"skyfn local is already running at {record.get('service_url')} "
                         f"(service pid {procs['service'].pid}); see `skyfn local status`, or `skyfn local down` first")
    for name, proc in procs.items():  # leftovers of a crashed deployment
        if proc is not None:
            echo(f"stopping leftover {name} (pid {proc.pid}) of an earlier run")
            terminate(proc)
        state.pidfile(name).unlink(missing_ok=True)
    agent.stop(ENDPOINT, state.home)

    user = local_user()
    state.signing_key()
    token = mint_token(state, user)
    started = _Started(state)
    try:
        maxmemory = redis_maxmemory()  # SKYFN_REDIS_MAXMEMORY; None: no limit
    except ValueError as exc:
        raise LocalError(str(exc)) from None
    try:
        redis = start_redis(state.workdir("redis"), _pick_port(None, record.get("redis_port"), "redis"), detach=True,
                            secure=True, maxmemory=maxmemory)
        started.servers.append(redis)
        write_pidfile(state.pidfile("redis"), redis.pid)
        if aws_endpoint:
            moto_port, aws_url = None, aws_endpoint.rstrip("/")
        else:
            moto = start_moto(state.workdir("moto"), detach=True, nice=AWS_STAND_IN_NICE,
                              env=template_runtime.moto_env(state) if templates else None)
            started.servers.append(moto)
            write_pidfile(state.pidfile("moto"), moto.pid)
            moto_port, aws_url = moto.port, moto.url
            _load_aws_state(state, aws_url, echo)
        gateway_port = _pick_port(port, record.get("gateway_port"), "service")
        url = f"http://127.0.0.1:{gateway_port}"
        state.write_runtime({
            "service_url": url, "gateway_port": gateway_port, "redis_url": redis.url, "redis_port": redis.port,
            "redis_maxmemory": maxmemory,
            "aws_endpoint": aws_url, "moto_port": moto_port, "user": user, "detached": detach,
            "api_workers": list(api_workers), "started": time.time(), "python": sys.executable,
            "from_templates": str(templates) if templates else None,
        })
        if templates:
            from infra.local import template_runtime

            deployer = template_runtime.prepare(state, templates, template_runtime.LocalSide(
                aws_url, redis.url, str(state.jwks_file), url), echo)
            state.write_runtime({**state.read_runtime(), "aws_deployer": deployer})
        if detach:
            log = open(state.service_log, "ab")
            started.service_proc = subprocess.Popen(
                [sys.executable, "-m", "infra.local.serve", "--home", str(state.home)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=str(REPO_ROOT),
                env=child_env({"SKYFN_HOME": str(state.home)}), start_new_session=True)
            log.close()
            write_pidfile(state.pidfile("service"), started.service_proc.pid)
            _wait_healthy(url, token, started.service_proc, state.service_log)
        else:
            from infra.local.handlers import ensure_resources
            from infra.local.serve import Service, apply_env, handler_env

            apply_env(handler_env(redis.url, aws_url, str(state.jwks_file)))
            ensure_resources()
            from infra.local.sfn.service_env import deploy_state_machines

            deploy_state_machines(aws_url)
            started.service = Service(redis.url, port=gateway_port, api_workers=api_workers,
                                      redis_pidfile=state.pidfile("redis")).start()
            write_pidfile(state.pidfile("service"), os.getpid())
            _wait_healthy(url, token, None, state.service_log)
        state.write_client_config(url, token)
        if endpoint:
            agent.start(ENDPOINT, state.home)
            _wait_endpoint_online(url, token, ENDPOINT)
    except BaseException as exc:
        started.undo()
        if isinstance(exc, (LocalError, KeyboardInterrupt)):
            raise
        raise LocalError(f"starting the local runtime failed: {type(exc).__name__}: {exc}") from exc
    echo(f"skyfn local runtime is up: {url} (user {user}, endpoint {ENDPOINT!r}"
         f"{' online' if endpoint else ' not started'}); client config {state.client_config}")
    if not detach:
        _serve_foreground(started, echo)
    return status(home)


def _serve_foreground(started: _Started, echo: Callable[[str], None]) -> None:
    import signal
    import threading

    done = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: done.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    echo("serving in the foreground; Ctrl-C stops everything")
    try:
        done.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        echo("stopping the local runtime")
        started.undo()


# -- moto's state across restarts (infra/local/snapshot.py) -----------------------------

def _snapshot_dir(state: StateDir) -> Path:
    return state.workdir("moto") / "snapshot"


def _load_aws_state(state: StateDir, aws_url: str, echo: Callable[[str], None]) -> None:
    from infra.local import snapshot

    counts = snapshot.load(aws_url, _snapshot_dir(state))
    if counts["tables"]:
        echo(f"restored {counts['items']} DynamoDB items and {counts['objects']} S3 objects saved by the last "
             "`skyfn local down`")


def _save_aws_state(state: StateDir, echo: Callable[[str], None]) -> None:
    """DynamoDB and S3 live in moto's memory: save them before moto stops."""
    from infra.local import snapshot

    aws_url = state.read_runtime().get("aws_endpoint")
    if not aws_url or state.read_runtime().get("moto_port") is None:
        return
    deployer = state.read_runtime().get("aws_deployer")  # IAM enforced (--from-templates): the deployer's keys
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    if deployer:
        os.environ.update(AWS_ACCESS_KEY_ID=deployer["AWS_ACCESS_KEY_ID"],
                          AWS_SECRET_ACCESS_KEY=deployer["AWS_SECRET_ACCESS_KEY"])
    try:
        snapshot.save(aws_url, _snapshot_dir(state))
    except Exception as exc:  # noqa: BLE001 - stopping goes on; the previous snapshot stays whole
        echo(f"warning: could not save moto's DynamoDB/S3 state ({type(exc).__name__}: {exc}); "
             f"the registry and task history of this run are lost when moto stops")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# -- down ------------------------------------------------------------------------------

def down(home=None, timeout: float = 10.0, echo: Callable[[str], None] = print) -> list[str]:
    """Stop everything we recorded; returns the names of what was running."""
    state = StateDir.at(home)
    stopped = []
    if agent.stop(ENDPOINT, state.home, timeout):
        stopped.append("agent")
    for name in ("service", "moto", "redis"):  # the service first: it still talks to the others
        proc = recorded_process(state.pidfile(name))
        if name == "moto" and proc is not None:
            _save_aws_state(state, echo)
        if proc is not None and proc.pid != os.getpid():
            terminate(proc, timeout)
            stopped.append(name)
        state.pidfile(name).unlink(missing_ok=True)
    echo(f"stopped {', '.join(stopped)}" if stopped else "skyfn local was not running")
    return stopped
