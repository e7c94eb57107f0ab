"""`skyfn local up | status | down | token` and `skyfn login --local`: the embedded runtime's
commands, a plugin of the SDK's CLI (entry points in pyproject.toml, found by skyfn/extras.py):

    [project.entry-points."skyfn.cli"]    local = "infra.local.cli:app"          skyfn local ...
    [project.entry-points."skyfn.login"]  local = "infra.local.cli:local_login"  skyfn login --local

The SDK never imports infra/; this module imports the SDK. It ships in the pure `skyfn` wheel,
so it is found even where only the SDK's dependencies are installed: it imports nothing else
at the top, and every command first checks the `local` extra (skyfn/extras.py: one line naming
`pip install 'skyfn[local]'`, exit code 1) before it imports the runtime.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from skyfn.cli import HOME_OPTION, run_action
from skyfn.extras import require

app = typer.Typer(help="The embedded single-machine service (redis-server, moto, local gateway, "
                       "endpoint 'local').", no_args_is_help=True, add_completion=False)


@app.command("up")
def local_up(
    detach: bool = typer.Option(False, "--detach", "-d", help="run in the background and return once healthy"),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535, help="gateway port (default: a free one, "
                                                                                 "the previous one if still free)"),
    aws_endpoint: Optional[str] = typer.Option(None, "--aws-endpoint", help="use this AWS endpoint (e.g. LocalStack) "
                                                                            "instead of starting moto"),
    no_endpoint: bool = typer.Option(False, "--no-endpoint", help="do not start the endpoint 'local'"),
    from_templates: bool = typer.Option(False, "--from-templates", help="run the service as the synthesized "
                                        "templates describe it (handlers, environments, resources, IAM enforced)"),
    cdk_out: Optional[str] = typer.Option(None, "--cdk-out", help="the cloud assembly for --from-templates "
                                          "(default: $SKYFN_CDK_OUT, else ./cdk.out of the checkout)"),
    timings: bool = typer.Option(False, "--timings", help="print how long each start-up step took (ms; also in "
                                 "the runtime's log and runtime.json)"),
    home: Optional[str] = HOME_OPTION,
) -> None:
    """Start redis-server, moto, the service and the endpoint 'local'; write the client config."""
    def action():
        require("local", "skyfn local up")
        from infra.local import runtime
        from infra.local.startup import process_start_ms

        runtime.up(home, detach=detach, port=port, aws_endpoint=aws_endpoint, endpoint=not no_endpoint,
                   from_templates=from_templates or cdk_out is not None, cdk_out=cdk_out, echo=typer.echo,
                   timings=timings, started_ms=process_start_ms())
    run_action(action)


@app.command("status")
def local_status(as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
                 home: Optional[str] = HOME_OPTION) -> None:
    """Show each process (pid, alive, port), the service health and the endpoints."""
    def action():
        require("local", "skyfn local status")
        from infra.local import runtime

        return runtime.status(home)
    report = run_action(action)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        running = any(p["alive"] for p in report["processes"].values())
        health = ("healthy" if report["healthy"] else
                  "NOT healthy" + (f": {report['error']}" if report["error"] else "") if running else
                  "not running (start it with `skyfn local up --detach`)")
        typer.echo(f"service: {report['service_url'] or '-'}  {health}")
        for name, p in report["processes"].items():
            state = f"running  pid {p['pid']}" if p["alive"] else "stopped"
            typer.echo(f"  {name:<8} {state}{'  port ' + str(p['port']) if p['alive'] and p['port'] else ''}")
        for ep in report["endpoints"]:
            typer.echo(f"  endpoint {ep.get('name')} ({ep.get('endpoint_id')}): {ep.get('status')}")
        b = report.get("backlog")
        if b and "error" in b:
            typer.echo(f"  backlog  not read: {b['error']}")
        elif b:
            limit = f"{b['max_bytes'] / 2**20:,.0f} MiB maxmemory" if b["max_bytes"] else "no maxmemory"
            typer.echo(f"  backlog  outbox {b['outbox']:,} of {b['backlog_max']:,}, redis "
                       f"{b['used_bytes'] / 2**20:,.0f} MiB ({limit}), {b['task_records']:,} keys, "
                       f"{b['bytes_per_task']:,.0f} B per task record")
            if b.get("warning"):
                typer.echo(f"  WARNING: {b['warning']}")
    if not report["healthy"]:
        raise typer.Exit(1 if any(p["alive"] for p in report["processes"].values()) else 3)


@app.command("down")
def local_down(home: Optional[str] = HOME_OPTION) -> None:
    """Stop the endpoint agent, the service, moto and redis-server (Redis data is kept)."""
    def action():
        require("local", "skyfn local down")
        from infra.local import runtime

        runtime.down(home, echo=typer.echo)
    run_action(action)


@app.command("token")
def local_token(user: str = typer.Option(..., "--user", help="user name the token is for"),
                days: float = typer.Option(30, "--days", min=0.001, help="validity in days"),
                email: Optional[str] = typer.Option(None, "--email", help="the token's email claim (left out if not "
                                                                         "given)"),
                username: Optional[str] = typer.Option(None, "--username", help="the token's username claim "
                                                                               "(default: the user)"),
                home: Optional[str] = HOME_OPTION) -> None:
    """Mint a token of the local service for USER (print it). It carries the identity claims a
    multi-user endpoint maps to a local account: username, email, identity provider ("skyfn-local")."""
    def action():
        require("local", "skyfn local token")
        from infra.local import runtime
        from infra.local.state import StateDir

        return runtime.mint_token(StateDir.at(home), user, int(days * 86400), username=username, email=email)
    typer.echo(run_action(action))


def local_login(user: Optional[str] = None, days: float = 30, home: Optional[Path] = None) -> dict:
    """What `skyfn login --local` keeps in the client config: the running runtime's URL and a
    token of its issuer for `user` (default: the login name), valid `days`."""
    require("local", "skyfn login --local")
    from infra.local import runtime
    from infra.local.state import StateDir
    from skyfn.login import LoginError

    state = StateDir.at(home)
    url = state.read_runtime().get("service_url")
    if not url:
        raise LoginError(f"no local runtime in {state.root}: start it with `skyfn local up`")
    user = user or runtime.local_user()
    token = runtime.mint_token(state, user, int(days * 86400))
    return {"service_url": url, "token": token, "issuer": "skyfn-local", "user": user}
