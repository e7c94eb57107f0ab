"""Where a module of this repository lives, for the tests that read handlers' source (what
they import, read from the environment, or call)."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def module_path(module: str) -> Path | None:
    """The file of `module` ("lambdas.core.tasks.push"), or None when it is not ours."""
    base = REPO.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None
