"""Renders an ASL definition: fills its `${Name}` placeholders (CloudFormation's
DefinitionSubstitutions syntax) with ARNs and names, for the embedded runtime and for
anything that needs the final JSON. CDK passes the same substitutions to CloudFormation
instead (`stepfunctions.catalog.substitutions_for`).

Only `${Name}` is a placeholder; JSONPath's `$`, `$$` and `$.x` are left alone. A
placeholder without a value, or a value for a placeholder the definition does not use,
is an error naming it.
"""
from __future__ import annotations

import json
import re
from typing import Any

from stepfunctions.catalog import MACHINES, StateMachine

PLACEHOLDER = re.compile(r"\$\{([A-Za-z][A-Za-z0-9_]*)\}")


class RenderError(ValueError):
    pass


def placeholders(text: str) -> set[str]:
    return set(PLACEHOLDER.findall(text))


def load(machine: StateMachine | str) -> str:
    """The raw definition text of a catalog machine (by object or name)."""
    if isinstance(machine, str):
        try:
            machine = MACHINES[machine]
        except KeyError:
            raise RenderError(f"no state machine {machine!r}: known are {sorted(MACHINES)}") from None
    return machine.path.read_text()


def render_text(text: str, values: dict[str, str], strict: bool = True) -> str:
    used = placeholders(text)
    missing = sorted(used - values.keys())
    if missing:
        raise RenderError(f"no value for placeholder(s) {missing}")
    unused = sorted(values.keys() - used)
    if strict and unused:
        raise RenderError(f"value(s) for {unused} given, but the definition has no such placeholder")
    for name, value in values.items():
        if not isinstance(value, str) or '"' in value or "\\" in value:
            raise RenderError(f"value of {name} must be a plain string without quotes or backslashes")
    out = PLACEHOLDER.sub(lambda m: values[m.group(1)], text)
    json.loads(out)  # still valid JSON
    return out


def render(machine: StateMachine | str, values: dict[str, str]) -> str:
    """The definition of `machine` with every placeholder filled (JSON text)."""
    return render_text(load(machine), values)


def render_dict(machine: StateMachine | str, values: dict[str, str]) -> dict[str, Any]:
    return json.loads(render(machine, values))
