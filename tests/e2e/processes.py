"""Processes the e2e tests start themselves (extra endpoint agents): stopped as an operator
would, SIGTERM first, SIGKILL only if that is not heard."""
from __future__ import annotations

import signal
import subprocess


def stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
