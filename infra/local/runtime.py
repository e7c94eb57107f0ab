"""`skyfn local up | status | down | token`: the embedded runtime's life cycle.

up (infra/local/up.py): redis-server (AOF), moto server and the service process (gateway +
results event source + schedules; `python -m infra.local.serve`) when detached, or the same
service inside this process in the foreground, started side by side; a token for the local
user and the client config `$SKYFN_HOME/config.json`; the endpoint `local`
(`skyfn-endpoint start local`), waiting until the service lists it online. Each step is
timed (`skyfn local up --timings`).
down: stops the agent, the service, moto and redis (only pids we recorded; SIGTERM, then
SIGKILL), removes the pid files and keeps redis's append-only file, so queued tasks and
results survive a restart.
"""
from __future__ import annotations

import os
from typing import Callable

import requests

from infra.local import agent
from infra.local.access import (ENDPOINT, LOCAL_IDENTITY_PROVIDER, LocalError, client_token, get_endpoints,
                                local_user, mint_token)
from infra.local.processes import recorded_process, terminate
from infra.local.state import PROCESS_NAMES, StateDir
from infra.local.up import up

__all__ = ["ENDPOINT", "LOCAL_IDENTITY_PROVIDER", "LocalError", "backlog_report", "down", "local_user", "mint_token",
           "running_processes", "status", "up"]


# -- looking at a deployment ---------------------------------------------------------

def running_processes(state: StateDir) -> dict:
    return {name: recorded_process(state.pidfile(name)) for name in PROCESS_NAMES}


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
        token = client_token(state) or mint_token(state, local_user())
        try:
            report["endpoints"] = get_endpoints(record["service_url"], token)
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

    from lambdas.adapters.redis_store.backlog_store import BacklogFigures
    from lambdas.config import settings
    from lambdas.core.tasks import backlog

    client = redis.Redis.from_url(redis_url, socket_timeout=3)
    try:
        b = backlog.read(BacklogFigures(client))
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


# -- moto's state across restarts (infra/local/snapshot.py) -----------------------------

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
        snapshot.save(aws_url, state.workdir("moto") / "snapshot")
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
