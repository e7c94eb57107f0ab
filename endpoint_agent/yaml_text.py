"""YAML text of the agent's configuration files (config.yaml, the multi-user config, identity
mapping files, rendered user config templates) read with errors that name the line and column."""
from __future__ import annotations

from typing import Any

import yaml

from endpoint_agent.errors import ConfigError


def where(exc: yaml.YAMLError, form: str = " line {line}, column {column}") -> str:
    """Where the parser failed, as `form` (1-based line and column); '' when PyYAML says nowhere."""
    mark = getattr(exc, "problem_mark", None)
    return form.format(line=mark.line + 1, column=mark.column + 1) if mark else ""


def problem(exc: yaml.YAMLError) -> str:
    return getattr(exc, "problem", None) or str(exc)


def load(text: str, source: str) -> Any:
    """yaml.safe_load of `text`; ConfigError "<source> line L, column C: not valid YAML: ..." when it is not."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}{where(exc)}: not valid YAML: {problem(exc)}") from None
