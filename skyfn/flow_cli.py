"""`skyfn flow run | show`: load a flow from a Python file or module and run it on the
service (or print its Amazon States Language). Imported only by the `flow` commands.

A flow file defines a `skyfn.flows.Flow` (the attribute `flow`, or the only Flow in the
module; `--flow NAME` picks another) and may define `INPUT`, the default input.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Optional

from skyfn.flows import Flow


class FlowCliError(Exception):
    """A problem the user can fix; printed as one line."""


def load_module(target: str):
    path = Path(target)
    if target.endswith(".py") or path.is_file():
        if not path.is_file():
            raise FlowCliError(f"no such file: {target}")
        name = f"skyfn_flow_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # the source serializer looks functions up through their module
        sys.path.insert(0, str(path.resolve().parent))
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(target)
    except ImportError as exc:
        raise FlowCliError(f"cannot import {target!r} ({exc}): give a .py file or an importable module") from None


def find_flow(module, attr: Optional[str]) -> Flow:
    if attr:
        flow = getattr(module, attr, None)
        if not isinstance(flow, Flow):
            raise FlowCliError(f"{module.__name__}.{attr} is not a skyfn.flows.Flow")
        return flow
    if isinstance(getattr(module, "flow", None), Flow):
        return module.flow
    flows = [name for name, value in vars(module).items() if isinstance(value, Flow)]
    if len(flows) != 1:
        raise FlowCliError(f"{module.__name__} defines {len(flows)} flows ({', '.join(flows) or 'none'}): "
                           "name one with --flow, or call it `flow`")
    return getattr(module, flows[0])


def parse_input(text: Optional[str], module) -> Any:
    if text is None:
        return getattr(module, "INPUT", None)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise FlowCliError(f"--input is not JSON ({exc}); e.g. --input '{{\"images\": 8}}'") from None


def run(target: str, input_text: Optional[str], attr: Optional[str], wait: bool, timeout: float) -> tuple[int, str]:
    """(exit code, text to print)."""
    from skyfn import Client
    from skyfn.runs import RunFailed

    module = load_module(target)
    flow = find_flow(module, attr)
    value = parse_input(input_text, module)
    with Client() as client:
        started = flow.run(client, value)
        if not wait:
            return 0, json.dumps({"run_id": started.run_id})
        try:
            return 0, json.dumps(started.result(timeout=timeout), indent=2)
        except RunFailed as exc:
            return 1, f"error: {exc}"


def show(target: str, attr: Optional[str]) -> str:
    module = load_module(target)
    return json.dumps(find_flow(module, attr).to_asl(), indent=2)
