"""Processes the e2e tests start themselves (extra endpoint agents): stopped as an operator
would, SIGTERM first, SIGKILL only if that is not heard."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import yaml

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def extra_agent(local_home: Path, client, name: str, config: dict[str, Any]) -> Iterator[dict]:
    """A further endpoint of the runtime's user, run by its own agent process with `config`
    (its config.yaml); yields the endpoint as list_endpoints gives it, once online."""
    from infra.local.agent import aws_env
    from infra.local.state import StateDir

    cfg = local_home / "endpoints" / name
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "config.yaml").write_text(yaml.safe_dump(config))
    # from the templates (make test-deploy) its queues are SQS in moto: the runtime's address
    env = dict(os.environ, SKYFN_HOME=str(local_home), PYTHONPATH=str(ROOT),
               **aws_env(StateDir.at(local_home).read_runtime()))
    log = open(cfg / "test.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "endpoint_agent", "start", name, "--foreground"],
                            cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            online = [e for e in client.list_endpoints() if e["name"] == name and e["status"] == "online"]
            if online:
                break
            assert proc.poll() is None and time.monotonic() < deadline, (cfg / "test.log").read_text()[-2000:]
            time.sleep(0.5)
        yield online[0]
    finally:
        stop(proc)
        log.close()


def stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
