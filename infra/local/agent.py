"""Driving the endpoint agent of the embedded runtime through its own CLI
(`skyfn-endpoint start|stop NAME`), so the runtime starts it exactly as a user would.
The agent daemonizes itself and records its pid in `$SKYFN_HOME/endpoints/NAME/agent.pid`.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from infra.local.lambda_pool import REPO_ROOT, child_env
from infra.local.processes import recorded_process, terminate


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


def run(args: list[str], home: Path, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run(endpoint_command() + args, env=child_env({"SKYFN_HOME": str(home)}), cwd=str(REPO_ROOT),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


def _last_line(result: subprocess.CompletedProcess) -> str:
    lines = (result.stderr or result.stdout or "").strip().splitlines()
    return lines[-1] if lines else f"exit code {result.returncode}"


def pidfile(home: Path, name: str) -> Path:
    return Path(home) / "endpoints" / name / "agent.pid"


def start(name: str, home: Path) -> None:
    result = run(["start", name], home)
    if result.returncode != 0:
        raise RuntimeError(f"`skyfn-endpoint start {name}` failed: {_last_line(result)} "
                           f"(log: {Path(home) / 'endpoints' / name / 'agent.log'})")


def stop(name: str, home: Path, timeout: float = 15.0) -> bool:
    """Stop the agent with its own command; if that fails, end the pid it recorded.
    Returns True if an agent was running."""
    proc = recorded_process(pidfile(home, name))
    if proc is None:
        from endpoint_agent.data_plane import end_leftover_redis

        end_leftover_redis(Path(home) / "endpoints" / name)  # left up by an agent killed hard
        return False
    try:
        run(["stop", name], home, timeout=timeout + 15)
    except (OSError, subprocess.TimeoutExpired):
        pass
    if proc.is_running():
        terminate(proc, timeout)
    return True
