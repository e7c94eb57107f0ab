"""A private embedded runtime for one benchmark: its own SKYFN_HOME with an endpoint
`local` of the given config, started detached and stopped at the end."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import yaml


@contextmanager
def embedded_runtime(prefix: str, endpoint_config: dict) -> Iterator[Path]:
    from infra.local import runtime

    home = Path(tempfile.mkdtemp(prefix=prefix))
    cfg = home / "endpoints" / "local"
    cfg.mkdir(parents=True)
    (cfg / "config.yaml").write_text(yaml.safe_dump(endpoint_config))
    os.environ["SKYFN_HOME"] = str(home)
    runtime.up(home, detach=True, echo=lambda *_: None)
    try:
        yield home
    finally:
        runtime.down(home, echo=lambda *_: None)
