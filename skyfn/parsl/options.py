"""How a Parsl task's ``resource_specification`` maps onto skyfn's per-task options.

Parsl hands every task's ``parsl_resource_specification`` to its executor. skyfn takes:

- ``cores``, ``gpus``: the task's resources on its node (``TaskRequest.resources``; the agent
  assigns the cores and GPUs to the worker that runs it);
- ``walltime``: seconds; past it the task ends TIMED_OUT (``TaskRequest.walltime``);
- ``user_config``: variables for a multi-user endpoint's user config template, sent with the
  task's batch (as ``user_endpoint_config`` is for Parsl's GlobusComputeExecutor).

Anything else is refused with Parsl's ``InvalidResourceSpecification`` naming the key and the
accepted ones, before anything is sent. This module only checks and splits; it sends nothing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from parsl.executors.errors import InvalidResourceSpecification

RESOURCE_KEYS = ("cores", "gpus")
ACCEPTED_KEYS = ("cores", "gpus", "walltime", "user_config")


@dataclass(frozen=True)
class TaskOptions:
    """What a skyfn ``Executor`` applies to the tasks it submits: its constructor's
    ``resource_specification``, ``walltime`` and ``user_config``."""

    resources: Optional[dict] = None
    walltime: Optional[float] = None
    user_config: Optional[dict] = None

    def key(self) -> str:
        """A stable text for grouping tasks that share these options."""
        return json.dumps([self.resources, self.walltime, self.user_config], sort_keys=True, default=repr)

    def executor_kwargs(self) -> dict[str, Any]:
        return {"resource_specification": self.resources, "walltime": self.walltime, "user_config": self.user_config}


def _number(key: str, value: Any, integral: bool) -> Any:
    ok = isinstance(value, int) if integral else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or value < 0 or (key == "walltime" and value == 0):
        kind = "a non-negative integer" if integral else "a positive number of seconds"
        raise InvalidResourceSpecification({key}, f"{key!r} must be {kind}, not {value!r}")
    return value


def split(spec: Optional[dict], default_user_config: Optional[dict] = None) -> TaskOptions:
    """The skyfn options of one resource specification. ``default_user_config`` applies when
    the specification has no ``user_config`` of its own."""
    if not spec:
        return TaskOptions(user_config=default_user_config)
    if not isinstance(spec, dict):
        raise InvalidResourceSpecification({type(spec).__name__},
                                           f"a resource specification is a dict with keys {list(ACCEPTED_KEYS)}")
    unknown = sorted(k for k in spec if k not in ACCEPTED_KEYS)
    if unknown:
        names = ", ".join(repr(k) for k in unknown)
        raise InvalidResourceSpecification(
            set(unknown), f"skyfn does not take {names} in a resource specification; "
                          f"the accepted keys are {', '.join(repr(k) for k in ACCEPTED_KEYS)}")
    resources = {k: _number(k, spec[k], integral=True) for k in RESOURCE_KEYS if k in spec}
    walltime = spec.get("walltime")
    if walltime is not None:
        walltime = float(_number("walltime", walltime, integral=False))
    user_config = spec.get("user_config", default_user_config)
    if user_config is not None and not isinstance(user_config, dict):
        raise InvalidResourceSpecification({"user_config"}, f"'user_config' must be a dict, not {user_config!r}")
    return TaskOptions(resources or None, walltime, user_config)
