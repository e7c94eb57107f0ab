"""`skyfn-endpoint`: configure, start, stop, status and list endpoints on this machine.

  skyfn-endpoint configure NAME [--force]     write a commented config.yaml template
  skyfn-endpoint configure --multi-user NAME  the files of a multi-user endpoint (endpoint_agent.multiuser)
  skyfn-endpoint start NAME [--foreground]    run the agent (daemonized by default)
  skyfn-endpoint stop NAME [--timeout S]      SIGTERM the agent and wait for it
  skyfn-endpoint status NAME [--json]         state, pid, endpoint id, task counts
  skyfn-endpoint list [--json]                every configured endpoint, running or stopped

State lives in $SKYFN_HOME/endpoints/NAME/ (config.yaml, agent.pid, agent.log,
status.json). `start` daemonizes by re-running itself with --foreground as a detached
process (new session, output to agent.log) and waits until the agent holds its pid file.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Optional

import typer

from endpoint_agent.config import ConfigError, load_config, resolve_service, write_template
from endpoint_agent.paths import EndpointPaths, endpoints_dir
from endpoint_agent.pidfile import AlreadyRunning, PidFile, running_pid
from endpoint_agent.procutil import child_env, pid_alive
from endpoint_agent.status import read_status

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Run skyfn tasks on this machine: manage endpoint agents.")

START_WAIT_S = 15.0


def _paths(name: str) -> EndpointPaths:
    try:
        return EndpointPaths(name)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)


def _config(paths: EndpointPaths):
    try:
        return load_config(paths.config)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)


@app.command()
def configure(name: str,
              force: bool = typer.Option(False, "--force",
                                         help="overwrite an existing config.yaml (with --multi-user: its files)"),
              multi_user: bool = typer.Option(False, "--multi-user",
                                              help="a multi-user endpoint (run by root for many users): "
                                                   "its config, identity mapping, user config template and "
                                                   "schema, and user environment")):
    """Write a commented config.yaml template for endpoint NAME."""
    paths = _paths(name)
    if multi_user:
        _configure_multi_user(name, paths, force)
        return
    try:
        path = write_template(paths, force=force)
    except FileExistsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1)
    typer.echo(f"wrote {path}\nedit it, then: skyfn-endpoint start {name}")


def _configure_multi_user(name: str, paths: EndpointPaths, force: bool) -> None:
    from endpoint_agent.multiuser.configure import write_multi_user_files

    try:
        written = write_multi_user_files(paths, force=force)
    except FileExistsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1)
    typer.echo("wrote " + "\n      ".join(str(p) for p in written))
    typer.echo(f"edit them (the identity mapping first), then start it as root: skyfn-endpoint start {name} "
               "(docs/multi-user.md)")
    if os.geteuid() != 0:
        typer.echo("note: a multi-user endpoint runs as root, to start user agents as other accounts", err=True)


@app.command()
def start(name: str,
          foreground: bool = typer.Option(False, "--foreground", "-f", help="run in this process, log to stderr")):
    """Start the agent of endpoint NAME (creating a default config first if there is none)."""
    paths = _paths(name).ensure()
    if not paths.config.exists():
        write_template(paths)
        typer.echo(f"no configuration yet: wrote the default {paths.config}", err=True)
    from endpoint_agent.multiuser.configure import is_multi_user

    if is_multi_user(paths.config):
        raise typer.Exit(_start_multi_user(name, paths, foreground))
    config = _config(paths)
    if not config.static_queues:
        try:
            resolve_service(config)  # fail here, in the user's terminal, rather than in the log
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2)
    pid = running_pid(paths.pid)
    if pid is not None:
        typer.echo(f"error: endpoint {name} is already running (pid {pid}); stop it first: skyfn-endpoint stop {name}",
                   err=True)
        raise typer.Exit(1)
    if foreground:
        raise typer.Exit(_run_foreground(name, paths, config))
    raise typer.Exit(_daemonize(name, paths))


def _run_foreground(name: str, paths: EndpointPaths, config) -> int:
    if config.engine.inline:  # the light agent: tasks run in this process (endpoint_agent/light/)
        from endpoint_agent.light import LightAgent as make
    else:
        from endpoint_agent.agent import Agent as make

    return _run_under_pidfile(paths, config.log_level, "skyfn.agent", lambda: make(name, config, paths=paths))


def _run_under_pidfile(paths: EndpointPaths, log_level: str, logger: str, make_agent) -> int:
    """Run the agent `make_agent()` builds in this process, logging to stderr, holding the pid file."""
    from endpoint_agent.service.link import ServiceError

    logging.basicConfig(level=log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    pidfile = PidFile(paths.pid)
    try:
        pidfile.acquire()
    except AlreadyRunning as exc:
        typer.echo(f"error: {exc}", err=True)
        return 1
    try:
        return make_agent().run()
    except (ConfigError, ServiceError) as exc:
        logging.getLogger(logger).error("%s", exc)
        typer.echo(f"error: {exc}", err=True)
        return 2
    finally:
        pidfile.release()


def _start_multi_user(name: str, paths: EndpointPaths, foreground: bool) -> int:
    """A multi-user endpoint (config.yaml says `multi_user: true`): checked here, run as root."""
    from endpoint_agent.multiuser.configure import load_multi_user_config

    try:
        mu = load_multi_user_config(paths.config)
        resolve_service(mu)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 2
    if os.geteuid() != 0:
        typer.echo(f"error: endpoint {name} is a multi-user endpoint: it starts user agents as other accounts, "
                   "which needs root; start it with sudo (or as root)", err=True)
        return 2
    pid = running_pid(paths.pid)
    if pid is not None:
        typer.echo(f"error: endpoint {name} is already running (pid {pid}); stop it first: skyfn-endpoint stop {name}",
                   err=True)
        return 1
    if not foreground:
        return _daemonize(name, paths)
    from endpoint_agent.multiuser.endpoint import MultiUserEndpoint

    return _run_under_pidfile(paths, mu.log_level, "skyfn.multiuser", lambda: MultiUserEndpoint(name, mu, paths=paths))


def _daemonize(name: str, paths: EndpointPaths) -> int:
    cmd = [sys.executable, "-m", "endpoint_agent", "start", name, "--foreground"]
    with open(paths.log, "ab") as log, open(os.devnull, "rb") as devnull:
        log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting endpoint {name}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdin=devnull, stdout=log, stderr=log, start_new_session=True,
                                env=child_env(), close_fds=True)
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        rc = proc.poll()
        if rc is not None:
            typer.echo(f"error: the agent exited with code {rc} while starting; last lines of {paths.log}:", err=True)
            typer.echo(_tail(paths.log, 15), err=True)
            return 1
        if running_pid(paths.pid) == proc.pid:
            typer.echo(f"started endpoint {name} (pid {proc.pid}); log: {paths.log}")
            return 0
        time.sleep(0.05)
    typer.echo(f"error: the agent (pid {proc.pid}) did not take its pid file within {START_WAIT_S:g} s; see {paths.log}",
               err=True)
    return 1


def _tail(path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


@app.command()
def stop(name: str, timeout: Optional[float] = typer.Option(None, help="seconds to wait (default: grace period + 15)"),
         kill: bool = typer.Option(False, "--kill", help="SIGKILL the agent if it has not stopped by then")):
    """Stop the agent of endpoint NAME gracefully (SIGTERM, then wait)."""
    from endpoint_agent.multiuser.configure import is_multi_user

    paths = _paths(name)
    pid = running_pid(paths.pid)
    if pid is None:
        from endpoint_agent.data.plane import end_leftover_redis

        left = end_leftover_redis(paths.dir)  # an agent killed hard leaves its data Redis up
        typer.echo(f"endpoint {name} is not running" + (f" (ended its data redis-server, pid {left})" if left else ""))
        if is_multi_user(paths.config):  # a privileged process killed hard leaves its user agents and router up
            from endpoint_agent.multiuser.router_redis import end_leftover
            from endpoint_agent.multiuser.user_agents import end_leftover_agents

            agents = end_leftover_agents(paths.dir / "router")
            router = end_leftover(paths.dir / "router")
            if agents or router:
                typer.echo(f"ended what it left running: {len(agents)} user agent(s)"
                           + (f", the router's redis-server (pid {router})" if router else ""))
        return
    if timeout is None:
        try:
            # a multi-user endpoint first stops its user agents, each with its grace period
            timeout = 120.0 if is_multi_user(paths.config) else load_config(paths.config).grace_period + 15.0
        except ConfigError:
            timeout = 45.0
    os.kill(pid, signal.SIGTERM)
    typer.echo(f"stopping endpoint {name} (pid {pid})...")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid) or running_pid(paths.pid) != pid:
            typer.echo(f"endpoint {name} stopped")
            return
        time.sleep(0.05)
    if kill:
        os.kill(pid, signal.SIGKILL)
        typer.echo(f"endpoint {name} did not stop within {timeout:g} s: killed (pid {pid}); "
                   "its tasks are redelivered when their leases expire")
        return
    typer.echo(f"error: endpoint {name} (pid {pid}) did not stop within {timeout:g} s; retry, or use --kill", err=True)
    raise typer.Exit(1)


def _describe(paths: EndpointPaths) -> dict:
    pid = running_pid(paths.pid)
    st = read_status(paths.status) or {}
    out = {"name": paths.name, "state": "running" if pid is not None else "stopped", "pid": pid,
           "endpoint_id": st.get("endpoint_id"), "config": str(paths.config), "log": str(paths.log)}
    if pid is not None and st.get("pid") == pid:
        for key in ("workers", "in_flight", "completed", "failed", "retried", "started", "updated", "manager_pid",
                    "worker_pids", "pending", "managers", "blocks", "containers", "cold_starts", "cancelled",
                    "managers_lost", "interchange", "encrypted", "server_key", "scaling", "direct"):
            out[key] = st.get(key)
        out["agent_state"] = st.get("state")
    return out


@app.command()
def status(name: str, as_json: bool = typer.Option(False, "--json", help="print JSON")):
    """Show the state of endpoint NAME."""
    paths = _paths(name)
    if not paths.config.exists() and not paths.dir.exists():
        typer.echo(f"error: no endpoint named {name} (configure it: skyfn-endpoint configure {name})", err=True)
        raise typer.Exit(1)
    info = _describe(paths)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    if info["state"] == "running":
        typer.echo(f"endpoint {name}: running (pid {info['pid']})")
    else:
        typer.echo(f"endpoint {name}: stopped")
    rows = [("endpoint_id", info.get("endpoint_id")), ("workers", info.get("workers")),
            ("in flight", info.get("in_flight")), ("completed", info.get("completed")),
            ("failed", info.get("failed"))]
    if info.get("started"):
        up = time.time() - info["started"]
        rows.append(("started", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["started"]))
                     + f" (up {up:.0f} s)"))
    if info.get("interchange"):
        rows.append(("interchange", info["interchange"] + (" (CurveZMQ)" if info.get("encrypted") else "")))
    direct = info.get("direct")
    if direct:
        rows.append(("direct", f"{direct['address']} (CurveZMQ): {direct['packs']} packs, {direct['tasks']} tasks, "
                               f"{direct['refused']} refused, {direct['dropped_results']} results undeliverable"))
    if info.get("pending") is not None:
        rows.append(("queue depth", f"{info['pending']} waiting for a worker"))
    if info.get("containers"):
        rows.append(("containers", ", ".join(f"{k}: {v}" for k, v in sorted(info["containers"].items()))
                     + f" (cold starts: {info.get('cold_starts', 0)})"))
    rows += [("config", info["config"]), ("log", info["log"])]
    for key, value in rows:
        if value is not None:
            typer.echo(f"  {key:<12} {value}")
    blocks = info.get("blocks") or {}
    if blocks:
        typer.echo(f"  {'BLOCK':<14} {'MANAGERS':>8} {'WORKERS':>8} {'FREE':>6} {'TASKS':>6}")
        for bid, b in sorted(blocks.items()):
            typer.echo(f"  {bid:<14} {b['managers']:>8} {b['workers']:>8} {b['free_workers']:>6} {b['assigned']:>6}")
    managers = info.get("managers") or []
    if managers:
        typer.echo(f"  {'MANAGER':<28} {'BLOCK':<10} {'HOST':<16} {'WORKERS':>7} {'FREE':>5} {'RUN':>4}  WARM")
        for m in managers:
            warm = ",".join(f"{k}:{v}" for k, v in sorted(m.get("containers", {}).items())) or "-"
            typer.echo(f"  {m['id'][:28]:<28} {m['block'][:10]:<10} {m['hostname'][:16]:<16} {m['workers']:>7} "
                       f"{m['free_workers']:>5} {m['running']:>4}  {warm}{' (draining)' if m.get('draining') else ''}")


@app.command("list")
def list_endpoints(as_json: bool = typer.Option(False, "--json", help="print JSON")):
    """List the endpoints configured on this machine, running or stopped."""
    root = endpoints_dir()
    names = sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "config.yaml").exists()) \
        if root.is_dir() else []
    infos = [_describe(EndpointPaths(n, root)) for n in names]
    if as_json:
        typer.echo(json.dumps(infos, indent=2))
        return
    if not infos:
        typer.echo(f"no endpoints configured in {root} (create one: skyfn-endpoint configure NAME)")
        return
    typer.echo(f"{'NAME':<24} {'STATE':<8} {'PID':<8} ENDPOINT_ID")
    for i in infos:
        typer.echo(f"{i['name']:<24} {i['state']:<8} {str(i['pid'] or '-'):<8} {i['endpoint_id'] or '-'}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
