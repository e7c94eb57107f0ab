"""Starting flows and SPMD groups (the API side).

A flow's spec is checked (every function and endpoint must be the caller's), compiled to
ASL here with the caller as owner, and deployed as the state machine
`<prefix>-flow-<hash of owner and definition>` (created once, reused by later runs of
the same flow); the run is an execution of it. An SPMD group is a run of the static
spmd-group state machine.
"""
from __future__ import annotations

import hashlib
from typing import Any

from lambdas.adapters import aws
from lambdas.core.identity import allowlist
from lambdas.core.tasks import registry
from lambdas.core.runs import runs
from lambdas.core.errors import Invalid
from lambdas.core.runs.settings import run_settings
from skyfn.protocol.flowspec import FlowError, MapNode, ParallelNode, SequenceNode, StepNode, compile_json
from skyfn.protocol.runs import RunFlow, RunGroup

SPMD_WAIT_SECONDS = 5


class InvalidFlow(Invalid):
    code = "invalid_flow"


def _steps(node) -> list[StepNode]:
    if isinstance(node, StepNode):
        found = [node]
    elif isinstance(node, SequenceNode):
        found = [s for n in node.nodes for s in _steps(n)]
    elif isinstance(node, ParallelNode):
        found = [s for n in node.branches for s in _steps(n)]
    elif isinstance(node, MapNode):
        found = _steps(node.body)
    else:
        found = []
    catch = getattr(node, "catch", None)
    return found + (_steps(catch.handler) if catch is not None else [])


def run_flow(owner: str, req: RunFlow) -> dict[str, Any]:
    ws = run_settings()
    fn_arn = ws.need("run_task_arn", "the RunTask step function")
    role = ws.need("flow_role_arn", "the flow execution role")
    steps = _steps(req.flow.root)
    for ep in {s.endpoint_id for s in steps}:
        registry.check_endpoint(owner, ep)
    fns = registry.function_bodies(owner, {s.function_id for s in steps})
    allowlist.enforce([(s.endpoint_id, s.function_id) for s in steps], fns)  # allowed_functions (403)
    try:
        definition = compile_json(req.flow, owner, fn_arn)
    except FlowError as exc:
        raise InvalidFlow(str(exc)) from None
    digest = hashlib.sha256(f"{owner}\n{definition}".encode()).hexdigest()[:20]
    machine = aws.ensure_machine(f"{ws.machine_prefix}-flow-{digest}", definition, role)
    run_id, arn = runs.start(owner, "flow", machine, {"input": req.input})
    return {"run_id": run_id, "kind": "flow", "execution_arn": arn}


def run_group(owner: str, req: RunGroup) -> dict[str, Any]:
    machine = run_settings().need("spmd_group_arn", "the spmd-group state machine")
    registry.check_endpoint(owner, req.endpoint_id)
    fns = registry.function_bodies(owner, {req.function_id})
    allowlist.enforce([(req.endpoint_id, req.function_id)], fns)
    run_id, arn = runs.start(owner, "group", machine, {
        "owner": owner, "function_id": req.function_id, "endpoint_id": req.endpoint_id,
        "world_size": req.world_size, "kwargs": req.kwargs, "max_retries": req.max_retries,
        "wait_seconds": SPMD_WAIT_SECONDS})
    return {"run_id": run_id, "kind": "group", "execution_arn": arn}
