"""`skyfn local up`: starting the embedded runtime, independent steps side by side, each timed.

What waits for what:

    prepare ─┬─ redis-server ─────────────────────────────┐
             ├─ moto (Step Functions' interpreter preloaded) ─┐
             ├─ service process: imports ───────────────── go ─┬─ restore moto's state, deploy ─┬─ ready
             │                                                 └─ handler environments ─────────┘
             └─ endpoint agent: imports, registers (waiting in the gateway socket's backlog
                until the gateway serves) ── online

The service process (infra/local/serve.py) starts at once and imports while moto starts;
`up` tells it to go (a pipe) once moto listens; it restores moto's DynamoDB/S3 state and
deploys beside the start of its handlers' environments, and answers on another pipe when
every part serves. The gateway's socket is bound here and handed to the service, so the
agent starts beside the service and its registration simply waits until the gateway
serves. `up` returns once the service answers GET /endpoints and the endpoint is online,
as before. Nothing waits by sleeping but the endpoint-online check, which polls the
service (there is no push for it) every 50 ms. moto runs at full priority until then (it
is on the critical path) and is lowered afterwards (AWS_STAND_IN_NICE).

Each phase is timed (infra/local/startup.py): `skyfn local up --timings` prints them with
the service's own steps; runtime.json (`startup`) and the service's log keep them.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import requests

from infra.local import agent
from infra.local.access import ENDPOINT, LocalError, get_endpoints, local_user, mint_token
from infra.local.standins.lambda_pool import REPO_ROOT, child_env
from infra.local.processes import (AWS_STAND_IN_NICE, free_port, lower_priority, moto_account, recorded_process,
                                   redis_maxmemory, start_moto, start_redis, terminate, write_pidfile)
from infra.local.startup import StartFailed, StepLog, StepTimer, format_table, summary_line, wait_report
from infra.local.state import PROCESS_NAMES, StateDir

SERVICE_START_TIMEOUT_S = 90.0
ONLINE_TIMEOUT_S = 60.0  # a bound for a failing start only; an agent that exits fails it at once
ONLINE_POLL_S = 0.05


@dataclass
class _Started:
    """What this `up` started, to undo on failure."""
    state: StateDir
    servers: list = field(default_factory=list)
    service_proc: subprocess.Popen | None = None
    service: object = None
    listener: socket.socket | None = None
    go_fd: int | None = None  # the write end of the service's go pipe, until it is told
    ready_fd: int | None = None  # the read end of the service's ready pipe, until read
    agent_proc: subprocess.Popen | None = None

    def undo(self) -> None:
        agent.stop(ENDPOINT, self.state.home)
        if self.agent_proc is not None and self.agent_proc.poll() is None:  # started, no pid file yet
            import psutil

            try:
                terminate(psutil.Process(self.agent_proc.pid))
            except psutil.Error:
                pass
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
        if self.listener is not None:
            self.listener.close()
        for fd in (self.go_fd, self.ready_fd):
            if fd is not None:
                os.close(fd)
        for name in PROCESS_NAMES:
            self.state.pidfile(name).unlink(missing_ok=True)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _pick_port(previous: int | None) -> int:
    if previous and _port_free(previous):
        return previous  # keep URLs stable across restarts
    return free_port()


def _listen(wanted: int | None, previous: int | None) -> socket.socket:
    """The gateway's socket, bound and listening: `wanted`, else the previous run's port if
    free (URLs stay stable across restarts), else a free one."""
    for port in ([wanted] if wanted else [previous, 0] if previous else [0]):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server's: a TIME_WAIT port is free
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen(256)
            return sock
        except OSError:
            sock.close()
            if wanted:
                raise LocalError(f"port {wanted} for the service is taken: choose another with --port, "
                                 "or stop what uses it") from None
    raise LocalError("no free port for the service")


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def _spawn_service(state: StateDir, listener: socket.socket, restore: bool) -> tuple[subprocess.Popen, int, int]:
    """`python -m infra.local.serve` with the gateway's socket and its two pipes (and, when
    `restore`, told to load moto's saved state); returns the process, the write end of its
    go pipe and the read end of its ready pipe."""
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    fds = (listener.fileno(), go_r, ready_w)
    try:
        with open(state.service_log, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "infra.local.serve", "--home", str(state.home), "--listen-fd", str(fds[0]),
                 "--go-fd", str(go_r), "--ready-fd", str(ready_w)] + (["--restore-moto"] if restore else []),
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=str(REPO_ROOT), pass_fds=fds,
                env=child_env({"SKYFN_HOME": str(state.home)}), start_new_session=True)
    except BaseException:
        for fd in (go_w, ready_r):
            os.close(fd)
        raise
    finally:
        os.close(go_r)
        os.close(ready_w)
    return proc, go_w, ready_r


def _wait_service(proc: subprocess.Popen, ready_r: int, log: Path, timer: StepTimer) -> dict:
    """Wait for the service's word on its ready pipe; returns what it restored of moto's state."""
    try:
        word = wait_report(ready_r, SERVICE_START_TIMEOUT_S)
    except StartFailed as exc:
        code = proc.poll()
        raise LocalError(f"the service process did not start ({exc}"
                         f"{f'; exit code {code}' if code is not None else ''}): {_tail(log)} (full log: {log})")
    if "error" in word:
        raise LocalError(f"the service failed to start: {word['error']} (full log: {log})")
    timer.add_remote("service: ", word.get("steps", []))
    return word.get("restored") or {}


def _verify(url: str, token: str, log: Path) -> None:
    """The service answers a real request (token checked, API handler, Redis, DynamoDB)."""
    try:
        get_endpoints(url, token, timeout=10.0)
    except (requests.RequestException, LocalError) as exc:
        raise LocalError(f"the service at {url} does not answer ({exc}); see {log}") from None


def _wait_endpoint_online(url: str, token: str, name: str, proc: subprocess.Popen, home: Path,
                          timeout: float = ONLINE_TIMEOUT_S) -> dict:
    """The endpoint as the service lists it, once online; an agent `proc` that exits first
    fails the start with its log's last lines."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LocalError(f"the endpoint agent exited with code {proc.returncode} while starting: "
                             f"{agent.log_tail(name, home)} (log: {Path(home) / 'endpoints' / name / 'agent.log'})")
        try:
            for ep in get_endpoints(url, token):
                if ep.get("name") == name:
                    seen = ep
                    if ep.get("status") == "online":
                        return ep
        except (requests.RequestException, LocalError):
            pass
        time.sleep(ONLINE_POLL_S)
    raise LocalError(f"endpoint {name!r} is not online after {timeout:.0f} s "
                     f"({'status ' + seen['status'] if seen else 'not registered'}); "
                     f"see its log with `skyfn-endpoint status {name}`")


def up(home=None, detach: bool = False, port: int | None = None, aws_endpoint: str | None = None,
       endpoint: bool = True, api_workers: tuple[int, int] = (2, 16), from_templates: bool = False,
       cdk_out: str | None = None, echo: Callable[[str], None] = print, timings: bool = False,
       started_ms: float | None = None) -> dict:
    """Start the runtime. Detached: return once everything is healthy. Foreground: serve
    until SIGINT/SIGTERM, then shut everything down. `from_templates`: the service as the
    cloud assembly `cdk_out` describes it (infra/local/template_runtime.py). `timings`:
    echo the table of start-up steps; `started_ms`: when the command started (monotonic ms;
    its start before this call is then the first step). Returns the service URL and the
    start-up's timings."""
    timer = StepTimer(origin_ms=started_ms) if started_ms is not None else StepTimer()
    if started_ms is not None:
        with timer.step("start the command (python, imports)"):
            pass
    with timer.step("check the home (leftovers of an earlier run)"):
        state = StateDir.at(home)
        state.ensure()
        templates = None
        if from_templates:
            from infra.local import template_runtime

            if aws_endpoint:
                raise LocalError("--from-templates runs its own moto (IAM enforced): leave out --aws-endpoint")
            if not detach:
                raise LocalError("--from-templates runs detached only: add --detach (the service runs in its own "
                                 "process)")
            try:
                templates = template_runtime.cdk_out_dir(cdk_out)
            except template_runtime.TemplateRuntimeError as exc:
                raise LocalError(str(exc)) from None
        procs = {name: recorded_process(state.pidfile(name)) for name in PROCESS_NAMES}
        record = state.read_runtime()
        if procs["service"] is not None:
            raise LocalError(f"skyfn local is already running at {record.get('service_url')} "
                             f"(service pid {procs['service'].pid}); see `skyfn local status`, "
                             "or `skyfn local down` first")
        for name, proc in procs.items():  # leftovers of a crashed deployment
            if proc is not None:
                echo(f"stopping leftover {name} (pid {proc.pid}) of an earlier run")
                terminate(proc)
            state.pidfile(name).unlink(missing_ok=True)
        agent.stop(ENDPOINT, state.home)
        try:
            maxmemory = redis_maxmemory()  # SKYFN_REDIS_MAXMEMORY; None: no limit
        except ValueError as exc:
            raise LocalError(str(exc)) from None
    started = _Started(state)
    try:
        url, user = _start(state, started, timer, record, port, maxmemory, templates, aws_endpoint, detach,
                           endpoint, api_workers, echo)
    except BaseException as exc:
        started.undo()
        if isinstance(exc, (LocalError, KeyboardInterrupt)):
            raise
        raise LocalError(f"starting the local runtime failed: {type(exc).__name__}: {exc}") from exc
    result = {"home": str(state.home), "service_url": url, "timings": timer.as_dict()}
    _record_timings(state, result["timings"])
    echo(f"skyfn local runtime is up: {url} (user {user}, endpoint {ENDPOINT!r}"
         f"{' online' if endpoint else ' not started'}); client config {state.client_config}")
    if timings:
        echo(format_table(result["timings"]))
    if not detach:
        _serve_foreground(started, echo)
    return result


def _start(state: StateDir, started: _Started, timer: StepTimer, record: dict, port: int | None, maxmemory,
           templates, aws_endpoint: str | None, detach: bool, endpoint: bool, api_workers,
           echo: Callable[[str], None]) -> tuple[str, str]:
    """The phases of `up` after checking the home; what it starts is added to `started`.
    Returns the service's URL and the user."""
    moto = None
    if not aws_endpoint:
        with timer.step("spawn moto"):  # first: its start is the longest chain (imports, then state machines)
            env = None
            if templates:
                from infra.local import template_runtime

                env = template_runtime.moto_env(state)
            moto = start_moto(state.workdir("moto"), detach=True, wait=False, env=env)  # lowered once up
            started.servers.append(moto)
            write_pidfile(state.pidfile("moto"), moto.pid)
    with timer.step("keys, token, ports"):
        user = local_user()
        state.signing_key()
        token = mint_token(state, user)
        listener = started.listener = _listen(port, record.get("gateway_port"))
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    with timer.step("spawn redis, service, agent"):
        redis = start_redis(state.workdir("redis"), _pick_port(record.get("redis_port")), detach=True, secure=True,
                            maxmemory=maxmemory, wait=False)
        started.servers.append(redis)
        write_pidfile(state.pidfile("redis"), redis.pid)
        moto_port, aws_url = (moto.port, moto.url) if moto is not None else (None, aws_endpoint.rstrip("/"))
        state.write_runtime({
            "service_url": url, "gateway_port": listener.getsockname()[1], "redis_url": redis.url,
            "redis_port": redis.port, "redis_maxmemory": maxmemory, "aws_endpoint": aws_url, "moto_port": moto_port,
            "user": user, "detached": detach, "api_workers": list(api_workers), "started": time.time(),
            "python": sys.executable, "from_templates": str(templates) if templates else None,
            "aws_account": moto_account() if moto is not None and not templates else None,
        })
        state.write_client_config(url, token)  # the agent reads it
        if detach:
            started.service_proc, started.go_fd, started.ready_fd = _spawn_service(
                state, listener, restore=moto is not None and not templates)
            write_pidfile(state.pidfile("service"), started.service_proc.pid)
        if endpoint and not templates:  # from the templates, it waits for the deployer's settings below
            started.agent_proc = agent.spawn(ENDPOINT, state.home)
    try:
        with timer.step("redis-server listens"):
            redis.wait_ready()
        with timer.step("moto listens"):
            if moto is not None:
                moto.wait_ready()
        if templates:  # otherwise the service restores moto's state, beside its other steps
            with timer.step("restore moto's state"):
                _echo_restored(_load_aws_state(state, aws_url), echo)
            with timer.step("provision from the templates"):
                from infra.local import template_runtime

                deployer = template_runtime.prepare(state, templates, template_runtime.LocalSide(
                    aws_url, redis.url, str(state.jwks_file), url), echo)
                state.write_runtime({**state.read_runtime(), "aws_deployer": deployer})
            if endpoint:
                started.agent_proc = agent.spawn(ENDPOINT, state.home)
        if started.go_fd is not None:
            os.write(started.go_fd, b"go\n")
    finally:
        if started.go_fd is not None:
            os.close(started.go_fd)  # end of file: a service still waiting for its go gives up
            started.go_fd = None
    with timer.step("service serves"):
        if detach:
            ready_fd, started.ready_fd = started.ready_fd, None  # wait_report closes it
            _echo_restored(_wait_service(started.service_proc, ready_fd, state.service_log, timer), echo)
            listener.close()  # the service process holds its own descriptor
        else:
            from infra.local.serve import start_service

            steps, restored = StepLog(), ({} if moto is not None else None)
            started.service = start_service(state, state.read_runtime(), steps, sock=listener, restored=restored)
            _echo_restored(restored or {}, echo)
            write_pidfile(state.pidfile("service"), os.getpid())
            timer.add_remote("service: ", steps.steps)
        started.listener = None  # the service's gateway owns it now
        _verify(url, token, state.service_log)
    if endpoint:
        with timer.step("endpoint agent online"):
            _wait_endpoint_online(url, token, ENDPOINT, started.agent_proc, state.home)
    if moto is not None:
        lower_priority(moto.pid, AWS_STAND_IN_NICE)  # from now on it yields the task path's cores
    return url, user


def _record_timings(state: StateDir, timings: dict) -> None:
    """runtime.json keeps the last start's timings; the runtime's log gets one line."""
    state.write_runtime({**state.read_runtime(), "startup": timings})
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with open(state.service_log, "a") as log:
        log.write(f"{stamp} INFO skyfn.local.up: {summary_line(timings)}\n")


def _serve_foreground(started: _Started, echo: Callable[[str], None]) -> None:
    import signal

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


def _load_aws_state(state: StateDir, aws_url: str) -> dict:
    """moto's DynamoDB and S3 as the last `skyfn local down` saved them (infra/local/snapshot.py)."""
    directory = state.workdir("moto") / "snapshot"
    if not (directory / "tables.json").exists():
        return {}  # a fresh home: nothing saved (and boto3 not imported for nothing)
    from infra.local import snapshot

    return snapshot.load(aws_url, directory)


def _echo_restored(counts: dict, echo: Callable[[str], None]) -> None:
    if counts.get("tables"):
        echo(f"restored {counts['items']} DynamoDB items and {counts['objects']} S3 objects saved by the last "
             "`skyfn local down`")
