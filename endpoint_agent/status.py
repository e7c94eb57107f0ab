"""status.json: what a running agent reports about itself, for `skyfn-endpoint status`.

Written atomically (temporary file + rename) every few seconds by the agent; read by
the CLI, which also checks that the pid is alive (a SIGKILLed agent leaves a stale file).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_status(path: Path, status: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(status, indent=2, sort_keys=True))
    os.replace(tmp, path)


def read_status(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
