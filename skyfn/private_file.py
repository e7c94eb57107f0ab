"""Files only their owner may read (tokens, credentials, secrets), written whole or not at all:
to a temporary file beside the target, mode 0600, then renamed over it."""
from __future__ import annotations

import os
from pathlib import Path


def write_private(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` atomically, readable by the owner only (its folder is made if missing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)  # a leftover temporary file keeps its mode through O_TRUNC
    os.replace(tmp, path)
    return path
