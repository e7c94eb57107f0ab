"""Bringing back the parts of a running local deployment that died, on the ports and
files the deployment already uses, so clients and agents reconnect to the same URLs:

- redis-server: restarted on its port with its directory, so it replays its
  append-only file (accepted tasks, queues, leases and results survive);
- the service process (`python -m infra.local.serve`): restarted on its port; its
  state is in Redis and moto, so it resumes the results queue and the schedules;
- the endpoint agent: started again with `skyfn-endpoint start local`; its task
  messages still leased to the dead agent are redelivered when their leases expire.

What `skyfn local up` starts from nothing, this restarts piece by piece: what an operator
(or a supervisor) does after a crash. Only processes recorded in the deployment's pid
files are looked at; nothing else is touched.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from infra.local import agent
from infra.local.standins.lambda_pool import REPO_ROOT, child_env
from infra.local.processes import recorded_process, start_redis, wait_for_port, write_pidfile
from infra.local.state import StateDir

ENDPOINT = "local"


def _record(state: StateDir) -> dict:
    record = state.read_runtime()
    if not record:
        raise RuntimeError(f"no local deployment recorded in {state.runtime_file}: start one with `skyfn local up`")
    return record


def redis(home=None) -> int | None:
    """Restart redis-server if it is dead; returns the new pid (None if it was alive)."""
    state = StateDir.at(home)
    if recorded_process(state.pidfile("redis")) is not None:
        return None
    record = _record(state)
    server = start_redis(state.workdir("redis"), record["redis_port"], detach=True,
                         maxmemory=record.get("redis_maxmemory"))  # the bound `skyfn local up` started it with
    write_pidfile(state.pidfile("redis"), server.pid)
    return server.pid


def service(home=None, timeout: float = 60.0) -> int | None:
    """Restart the service process if it is dead and wait until it listens; returns its pid."""
    state = StateDir.at(home)
    if recorded_process(state.pidfile("service")) is not None:
        return None
    record = _record(state)
    with open(state.service_log, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "infra.local.serve", "--home", str(state.home)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=str(REPO_ROOT),
                                env=child_env({"SKYFN_HOME": str(state.home)}), start_new_session=True)
    write_pidfile(state.pidfile("service"), proc.pid)
    wait_for_port(record["gateway_port"], timeout=timeout, proc=proc)
    return proc.pid


def endpoint_agent(home=None, name: str = ENDPOINT) -> bool:
    """Start the endpoint's agent if it is not running; True if it was started."""
    state = StateDir.at(home)
    if recorded_process(agent.pidfile(state.home, name)) is not None:
        return False
    agent.start(name, Path(state.home))
    return True


def revive(home=None) -> list[str]:
    """Restart whatever of redis, the service and the agent is dead (in that order: each
    needs the one before). Returns the names of what was restarted."""
    restarted = []
    if redis(home) is not None:
        restarted.append("redis")
    if service(home) is not None:
        restarted.append("service")
    if endpoint_agent(home):
        restarted.append("agent")
    return restarted
