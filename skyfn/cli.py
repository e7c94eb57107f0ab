"""The `skyfn` console script.

    skyfn local up [--detach] [--port N]   start the embedded service and the endpoint `local`
    skyfn local status                     processes, service health, endpoints
    skyfn local down                       stop everything (task data in Redis is kept)
    skyfn local token --user NAME          mint a token for another local user
    skyfn flow run FILE_OR_MODULE [--input JSON]   run a flow (skyfn.flows) and print its output
    skyfn flow show FILE_OR_MODULE         print the flow's Amazon States Language
    skyfn rendezvous --host H --port P --secret S   run the communicator's rendezvous server
    skyfn policy check FILE [--tag T] [--state S]  validate an aAPP placement policy, explain decisions
    skyfn login [--local | --issuer URL --client-id ID --service URL [--device]]   keep a token (0600)
    skyfn report [--since 1h] [--endpoint E] [--html FILE] [--png DIR]   plots from task events
    skyfn task watch [ID ...] [--file F|-] [--since 10m] [--endpoint E] [--once [--json]]
                                           live view of a batch: counts per state and endpoint,
                                           progress, throughput, ETA, last failures; exit 0 when
                                           all succeeded, 1 when any failed (3: --once, not done)

Imports go one way: the SDK (skyfn/) never imports infra/ or lambdas/, not even inside a
command. `skyfn local ...` and `skyfn login --local` belong to the embedded runtime
(infra/local/cli.py), a plugin found through entry points (groups `skyfn.cli` and
`skyfn.login`, skyfn/extras.py) when the command runs, never on `import skyfn.cli`. Without the
runtime they say which extra to install (`pip install 'skyfn[local]'`). Plugins use
`run_action` and `HOME_OPTION` from here. Other implementations are imported inside their
commands, so `import skyfn` stays light. Errors are printed as one line; exit code 1.
Set SKYFN_DEBUG=1 to see the full traceback.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Optional

import typer
from typer.core import TyperGroup

from skyfn import extras

HOME_OPTION = typer.Option(None, "--home", envvar="SKYFN_HOME", help="state directory (default ~/.skyfn)")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def run_action(action: Callable[[], object]):
    """Run `action`; any failure becomes one clear line on stderr and exit code 1."""
    try:
        return action()
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130)
    except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence
        if os.environ.get("SKYFN_DEBUG"):
            raise
        known = type(exc).__name__ in ("LocalError", "MissingExtra")
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _fail(text if known else f"{type(exc).__name__}: {text} (run with SKYFN_DEBUG=1 for the traceback)")


# --- plugins (entry point group skyfn.cli; skyfn/extras.py) -----------------------------
class _WithPlugins(TyperGroup):
    """skyfn's own commands and those of the installed CLI plugins: names from the metadata,
    each plugin imported when its command runs or `--help` lists it."""

    def list_commands(self, ctx) -> list[str]:
        own = super().list_commands(ctx)
        found = set(extras.plugin_names(extras.CLI_PLUGINS)) | set(extras.PLUGIN_EXTRAS)
        return sorted(found - set(own)) + own

    def get_command(self, ctx, cmd_name: str):
        if cmd_name not in self.commands and (cmd_name in extras.PLUGIN_EXTRAS or
                                              cmd_name in extras.plugin_names(extras.CLI_PLUGINS)):
            self.commands[cmd_name] = _plugin_command(cmd_name)
        return super().get_command(ctx, cmd_name)


def _plugin_command(name: str):
    try:
        sub = extras.plugin(extras.CLI_PLUGINS, name)
    except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the other commands
        reason = f"{type(exc).__name__}: {exc}"
        return _unavailable(name, lambda what: RuntimeError(f"{what}: its plugin does not load ({reason})"))
    if sub is None:
        return _unavailable(name, lambda what: extras.missing_plugin(extras.CLI_PLUGINS, name, what))
    if not isinstance(sub, typer.Typer):
        return sub
    command = typer.main.get_command(sub)
    command.name = name  # what --help lists it as
    return command


def _unavailable(name: str, error: Callable[[str], Exception]):
    """`skyfn NAME ...` whose plugin is missing or broken: any arguments, one line saying why."""
    stand_in = typer.Typer(add_completion=False)

    @stand_in.command(name, add_help_option=False, help="(not available in this installation)",
                      context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def unavailable(ctx: typer.Context) -> None:
        first = ctx.args[0] if ctx.args and not ctx.args[0].startswith("-") else None
        what = f"skyfn {name} {first}" if first else f"skyfn {name}"

        def action():
            raise error(what)
        run_action(action)
    return typer.main.get_command(stand_in)


app = typer.Typer(name="skyfn", help="skyfn: federated function-as-a-service for science.", cls=_WithPlugins,
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


# --- rendezvous (comm, issue 4) ---
@app.command("rendezvous")
def rendezvous_serve(
    host: str = typer.Option("0.0.0.0", "--host", help="address to listen on"),
    port: int = typer.Option(7300, "--port", min=0, max=65535, help="TCP port (0 = any free port)"),
    secret: Optional[str] = typer.Option(None, "--secret", envvar="SKYFN_RENDEZVOUS_SECRET",
                                         show_envvar=True, help="token signing secret"),
    join_timeout: float = typer.Option(60.0, "--join-timeout", min=0.001,
                                       help="seconds a group may wait for its peers"),
    max_connections: int = typer.Option(16000, "--max-connections", min=1, help="open connections at most"),
    max_groups: int = typer.Option(8000, "--max-groups", min=1, help="groups still filling at most"),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error"),
    port_file: Optional[str] = typer.Option(None, "--port-file", help="write the bound port here once listening"),
) -> None:
    """Run the rendezvous server of the communicator (ranks, peer addresses, barriers, relays)."""
    def action():
        from rendezvous.cli import run_server

        if log_level not in ("debug", "info", "warning", "error"):
            raise ValueError(f"--log-level {log_level!r}: use debug, info, warning or error")
        run_server(host, port, secret, join_timeout=join_timeout, max_connections=max_connections,
                   max_groups=max_groups, log_level=log_level, port_file=port_file)
    run_action(action)


# --- policy (placement, issue 6) ---
policy_app = typer.Typer(help="aAPP placement policies: validate a policy file, explain decisions.",
                         no_args_is_help=True)
app.add_typer(policy_app, name="policy")


@policy_app.command("check")
def policy_check(
    file: str = typer.Argument(..., help="policy YAML file"),
    tag: Optional[list[str]] = typer.Option(None, "--tag", "-t", help="explain the decision for this function tag "
                                                                     "(repeatable)"),
    state: Optional[str] = typer.Option(None, "--state", "-s", help="worker state (YAML/JSON): "
                                                                   "workers: {w1: {capacity, running, tags, ...}}"),
    container: Optional[str] = typer.Option(None, "--container", help="container type (for warm_first)"),
    untagged: bool = typer.Option(False, "--untagged", help="also explain an untagged function"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Validate FILE (errors name the line, key and reason) and explain, for a tag and a worker
    state, which block and worker would be chosen and why the others were rejected.
    Exit 0: valid; 1: invalid policy or state; 2: valid, but an explained decision found no worker."""
    def action():
        from skyfn.placement.check import check

        return check(file, tag, state, container=container, untagged=untagged)
    report = run_action(action)
    if as_json:
        typer.echo(json.dumps(report.data, indent=2))
    else:
        for line in report.lines:
            typer.echo(line)
    for line in report.errors:
        typer.echo(line, err=True)
    raise typer.Exit(report.exit_code)


# --- flow (Step Functions state machines; H6)--------------------------------------------
flow_app = typer.Typer(help="Flows of registered functions across endpoints (skyfn.flows), run as "
                            "Step Functions state machines.", no_args_is_help=True)
app.add_typer(flow_app, name="flow")


@flow_app.command("run")
def flow_run(target: str = typer.Argument(..., help="a .py file or a module defining a skyfn.flows.Flow"),
             input_json: Optional[str] = typer.Option(None, "--input", help="the flow's input as JSON "
                                                                            "(default: the module's INPUT)"),
             flow_name: Optional[str] = typer.Option(None, "--flow", help="attribute holding the Flow"),
             no_wait: bool = typer.Option(False, "--no-wait", help="print the run id and return"),
             timeout: float = typer.Option(3600.0, "--timeout", help="seconds to wait for the result")) -> None:
    """Run a flow and print its output as JSON (exit code 1 if the run fails)."""
    _flow_command(lambda flow_cli: flow_cli.run(target, input_json, flow_name, not no_wait, timeout))


@flow_app.command("show")
def flow_show(target: str = typer.Argument(..., help="a .py file or a module defining a skyfn.flows.Flow"),
              flow_name: Optional[str] = typer.Option(None, "--flow", help="attribute holding the Flow")) -> None:
    """Print the Amazon States Language the flow compiles to."""
    _flow_command(lambda flow_cli: (0, flow_cli.show(target, flow_name)))


def _flow_command(call: Callable[[Any], tuple[int, str]]) -> None:
    """Run `call(skyfn.flow_cli)` -> (exit code, text); print the text (on stderr when the code is
    not 0; a FlowCliError is code 1) and exit with the code."""
    def action():
        from skyfn import flow_cli

        try:
            return call(flow_cli)
        except flow_cli.FlowCliError as exc:
            return 1, f"error: {exc}"
    code, text = run_action(action)
    typer.echo(text, err=code != 0)
    raise typer.Exit(code)


# --- login (security; H9) ---------------------------------------------------------------
@app.command("login")
def login(
    local: bool = typer.Option(False, "--local", help="a token of the embedded runtime (`skyfn local up`)"),
    user: Optional[str] = typer.Option(None, "--user", help="with --local: the local user (default: you)"),
    issuer: Optional[str] = typer.Option(None, "--issuer", envvar="SKYFN_AUTH_ISSUER",
                                         help="OpenID Connect issuer URL (Cognito user pool, Globus Auth)"),
    client_id: Optional[str] = typer.Option(None, "--client-id", envvar="SKYFN_CLIENT_ID",
                                            help="the skyfn app's public client id at the issuer"),
    service: Optional[str] = typer.Option(None, "--service", envvar="SKYFN_SERVICE_URL", help="the skyfn API URL"),
    device: bool = typer.Option(False, "--device", help="device code flow (no browser on this machine)"),
    refresh_only: bool = typer.Option(False, "--refresh", help="trade the kept refresh token for a new token"),
    scopes: str = typer.Option("openid", "--scopes", help="scopes to ask for"),
    home: Optional[str] = HOME_OPTION,
) -> None:
    """Sign in and keep the token in $SKYFN_HOME/config.json (mode 0600)."""
    def action():
        from pathlib import Path

        from skyfn import login as flows

        where = Path(home) if home else None
        if refresh_only:
            return flows.refresh(where)
        if local:
            return flows.login_local(user, home=where)
        if not (issuer and client_id and service):
            raise ValueError("give --local, or --issuer, --client-id and --service (or their environment variables)")
        return flows.login_oidc(issuer, client_id, service, device=device, scopes=scopes,
                                echo=lambda m: typer.echo(m, err=True), home=where)
    path = run_action(action)
    typer.echo(f"logged in; token kept in {path}")


@app.command("report")
def report(
    since: str = typer.Option("1h", "--since", help="epoch seconds, ISO 8601 time, or an age: 30m, 2h, 1d"),
    endpoint: Optional[str] = typer.Option(None, "--endpoint", help="only this endpoint (name or id)"),
    html: Optional[str] = typer.Option(None, "--html", help="write one self-contained HTML file here"),
    png: Optional[str] = typer.Option(None, "--png", help="write the PNG figures into this directory"),
    limit: int = typer.Option(20_000, "--limit", help="at most this many tasks, newest first (20,000 at most)"),
) -> None:
    """A report of your tasks from their events (skyfn.report): throughput, tasks in flight and
    utilization with a Little's-law check, latency per stage, backlog per endpoint."""
    def action():
        from skyfn import Client

        with Client() as client:
            return client.report(since=since, endpoint=endpoint, html=html, png_dir=png, limit=limit)
    result = run_action(action)
    typer.echo(result.text())
    for name, path in result.pngs.items():
        typer.echo(f"figure {name}: {path}")
    if result.html is not None:
        typer.echo(f"report written to {result.html}")


# --- task (seeing a batch; issue 13) ---------------------------------------------------------
task_app = typer.Typer(help="Your tasks: watch a batch live, read a result.", no_args_is_help=True)
app.add_typer(task_app, name="task")


@task_app.command("watch")
def task_watch(
    task_ids: Optional[list[str]] = typer.Argument(None, help="task ids to watch", show_default=False),
    ids_file: Optional[str] = typer.Option(None, "--file", "-f", help="also the task ids in this file, one a line "
                                                                      "('-': stdin)"),
    since: Optional[str] = typer.Option(None, "--since", help="also your tasks created since then: an age (10m, 2h, "
                                                              "1d), epoch seconds or an ISO 8601 time"),
    endpoint: Optional[str] = typer.Option(None, "--endpoint", help="only the tasks of this endpoint (name or id)"),
    once: bool = typer.Option(False, "--once", help="print one snapshot and exit"),
    as_json: bool = typer.Option(False, "--json", help="with --once: the snapshot as JSON"),
    interval: float = typer.Option(1.0, "--interval", min=0.2, help="seconds between status calls at least"),
    no_push: bool = typer.Option(False, "--no-push", help="poll only; do not subscribe to the results push"),
) -> None:
    """Watch tasks until all are final: counts per state and per endpoint, a progress bar,
    throughput, ETA and the last failures with their reason (plain lines when stdout is not
    a terminal). Exit 0: all succeeded; 1: some failed, timed out or were cancelled;
    3: --once and some not final yet; 130: interrupted."""
    def action():
        from skyfn import Client
        from skyfn.watch import WatchError, check, read_ids, watch

        try:
            ids = read_ids(task_ids or [], ids_file)
            check(ids, since, once, as_json)
            with Client() as client:
                return watch(client, ids, since, endpoint, once=once, as_json=as_json, interval=interval,
                             push=not no_push)
        except WatchError as exc:
            _fail(str(exc))
    raise typer.Exit(run_action(action))


@task_app.command("result")
def task_result(
    task_id: str = typer.Argument(..., help="the task's id"),
    timeout: float = typer.Option(0.0, "--timeout", min=0.0, help="wait up to this many seconds for it to finish "
                                                                  "(0: answer now)"),
) -> None:
    """Print a task's result (repr of the value, or JSON when it is plain data). Exit 0 when
    it SUCCEEDED, 1 when it failed (the error is printed), 3 when it has not finished yet."""
    def action():
        import json

        from skyfn import Client

        with Client() as client:
            try:
                value = client.get_result(task_id, timeout=timeout)
            except TimeoutError:
                typer.echo(f"task {task_id} has not finished yet: try again later, or wait with --timeout SECONDS",
                           err=True)
                return 3
            except Exception as exc:  # noqa: BLE001 - the task's own failure, shown as such
                typer.echo(f"{type(exc).__name__}: {exc}", err=True)
                return 1
        try:
            typer.echo(json.dumps(value, indent=2))
        except (TypeError, ValueError):
            typer.echo(repr(value))
        return 0
    raise typer.Exit(run_action(action))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
