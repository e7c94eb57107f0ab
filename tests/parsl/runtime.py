"""The embedded skyfn runtime for the Parsl tests, started as a user starts it (`skyfn local
up --detach`) in a private SKYFN_HOME with a local endpoint of 4 workers (what Parsl's
CI gave Globus Compute's endpoint: a ThreadPoolEngine of 4).

``local_runtime()`` is a context manager (tests/parsl/conftest.py); ``ensure_runtime()`` is
for tests/parsl/skyfn_config.py: it uses the runtime of $SKYFN_HOME when one is running
there, else starts one in a temporary home and stops it when the process exits;
``python -m tests.parsl.runtime up|down HOME`` is for scripts/test_parsl.sh.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Optional

import yaml

WORKERS = 4


def _write_endpoint_config(home: Path, workers: int) -> None:
    cfg = home / "endpoints" / "local"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "config.yaml").write_text(yaml.safe_dump({"workers": workers, "heartbeat_period": 1}))


def start(home: Path, workers: int = WORKERS) -> None:
    """Start the runtime in `home` and point this process's SDK at it (SKYFN_HOME)."""
    from infra.local import runtime

    _write_endpoint_config(home, workers)
    os.environ["SKYFN_HOME"] = str(home)
    os.environ.pop("AWS_ENDPOINT_URL", None)  # the runtime's own moto, not a test session's
    runtime.up(home, detach=True, echo=lambda *_: None)


def stop(home: Path) -> None:
    from infra.local import runtime

    runtime.down(home, echo=lambda *_: None)


@contextlib.contextmanager
def local_runtime(home: Path, workers: int = WORKERS) -> Iterator[Path]:
    old = os.environ.get("SKYFN_HOME")
    try:
        start(home, workers)
        yield home
    finally:
        stop(home)
        if old is None:
            os.environ.pop("SKYFN_HOME", None)
        else:
            os.environ["SKYFN_HOME"] = old


def _running(home: str) -> bool:
    from infra.local import runtime

    try:
        report = runtime.status(home)
    except Exception:
        return False
    return bool(report.get("healthy")) and any(e.get("name") == "local" for e in report.get("endpoints", []))


def ensure_runtime() -> Optional[Path]:
    """The runtime of $SKYFN_HOME if one runs there; else a new one in a temporary home,
    stopped (and its home removed) at exit. Returns the home it started, or None."""
    home = os.environ.get("SKYFN_HOME")
    if home and _running(home):
        return None
    new = Path(tempfile.mkdtemp(prefix="skyfn-parsl-"))

    def _cleanup() -> None:
        stop(new)
        shutil.rmtree(new, ignore_errors=True)

    atexit.register(_cleanup)
    start(new)
    return new


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("up", "down"):
        sys.exit("usage: python -m tests.parsl.runtime up|down HOME")
    (start if sys.argv[1] == "up" else stop)(Path(sys.argv[2]))
