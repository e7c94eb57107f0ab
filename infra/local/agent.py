"""Driving the endpoint agent of the embedded runtime through its own CLI
(`skyfn-endpoint start|stop NAME`), so the runtime starts it exactly as a user would.
The agent daemonizes itself and records its pid in `$SKYFN_HOME/endpoints/NAME/agent.pid`.
Its config.yaml is the default template plus a `direct:` section: SDKs on this machine
may open direct sessions with it (endpoint_agent/direct/server.py).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from infra.local.standins.lambda_pool import REPO_ROOT, child_env
from infra.local.processes import recorded_process, terminate

LOCAL_DIRECT = """
# --- Direct sessions (set by the embedded runtime) ----------------------------------
# SDKs on this machine send tasks straight to this agent; the service still authorizes
# each session and records each task. `direct: null` turns them off.
direct:
  listen: 127.0.0.1
"""


def endpoint_command() -> list[str]:
    """`skyfn-endpoint`: the console script beside our interpreter, else on PATH, else the
    module (the checkout is not pip-installed)."""
    beside = Path(sys.executable).with_name("skyfn-endpoint")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("skyfn-endpoint")
    if found:
        return [found]
    return [sys.executable, "-m", "endpoint_agent"]


def run(args: list[str], home: Path, timeout: float = 60.0, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(endpoint_command() + args, env=child_env({"SKYFN_HOME": str(home), **(env or {})}),
                          cwd=str(REPO_ROOT), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


def aws_env(record: dict) -> dict:
    """The agent's AWS settings for a runtime whose queues are SQS (--from-templates): moto's
    address and region; its credentials come from the service (its endpoint's session)."""
    if not record.get("from_templates"):
        return {}
    region = (record.get("aws_deployer") or {}).get("AWS_REGION", "us-east-1")
    return {"AWS_ENDPOINT_URL": record["aws_endpoint"], "AWS_DEFAULT_REGION": region, "AWS_REGION": region}


def _last_line(result: subprocess.CompletedProcess) -> str:
    lines = (result.stderr or result.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit code {result.returncode}"


def pidfile(home: Path, name: str) -> Path:
    return Path(home) / "endpoints" / name / "agent.pid"


def ensure_direct(name: str, home: Path) -> None:
    """Direct sessions on for the runtime's endpoint: its config.yaml (the default template
    when there is none yet) gets LOCAL_DIRECT unless it has a `direct` key already. A file
    that is not a valid mapping is left alone: `skyfn-endpoint start` reports it."""
    from endpoint_agent.config import write_template
    from endpoint_agent.paths import EndpointPaths

    paths = EndpointPaths(name, Path(home) / "endpoints")
    if not paths.config.exists():
        write_template(paths)
    text = paths.config.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return
    if data is not None and (not isinstance(data, dict) or "direct" in data):
        return
    with open(paths.config, "a") as f:
        f.write(LOCAL_DIRECT if text.endswith("\n") else "\n" + LOCAL_DIRECT)


def start(name: str, home: Path) -> None:
    """`skyfn-endpoint start NAME`, with the AWS settings of the runtime in `home` (aws_env)."""
    from infra.local.state import StateDir

    ensure_direct(name, home)
    result = run(["start", name], home, env=aws_env(StateDir.at(home).read_runtime()))
    if result.returncode != 0:
        raise RuntimeError(f"`skyfn-endpoint start {name}` failed: {_last_line(result)} "
                           f"(log: {Path(home) / 'endpoints' / name / 'agent.log'})")


def spawn(name: str, home: Path) -> subprocess.Popen:
    """`skyfn-endpoint start NAME --foreground` in a session of its own, its output appended
    to the endpoint's agent.log: what `skyfn-endpoint start NAME` runs, without that
    command's own process, which only waits for the agent to hold its pid file (`skyfn local
    up` waits for the endpoint to come online instead: a Python start fewer on its critical
    path). With the AWS settings of the runtime in `home` (aws_env)."""
    import time

    from endpoint_agent.paths import EndpointPaths
    from infra.local.state import StateDir

    ensure_direct(name, home)
    log_path = EndpointPaths(name, Path(home) / "endpoints").log
    env = child_env({"SKYFN_HOME": str(home), **aws_env(StateDir.at(home).read_runtime())})
    with open(log_path, "ab") as log:
        log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting endpoint {name}\n".encode())
        log.flush()
        return subprocess.Popen(endpoint_command() + ["start", name, "--foreground"], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, cwd=str(REPO_ROOT), env=env, start_new_session=True)


def log_tail(name: str, home: Path, lines: int = 5) -> str:
    """The last lines of the endpoint's agent.log, joined with " | "."""
    try:
        text = (Path(home) / "endpoints" / name / "agent.log").read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(text.strip().splitlines()[-lines:])


def stop(name: str, home: Path, timeout: float = 15.0) -> bool:
    """Stop the agent with its own command; if that fails, end the pid it recorded.
    Returns True if an agent was running."""
    proc = recorded_process(pidfile(home, name))
    if proc is None:
        from endpoint_agent.data.plane import end_leftover_redis

        end_leftover_redis(Path(home) / "endpoints" / name)  # left up by an agent killed hard
        return False
    try:
        run(["stop", name], home, timeout=timeout + 15)
    except (OSError, subprocess.TimeoutExpired):
        pass
    if proc.is_running():
        terminate(proc, timeout)
    return True
