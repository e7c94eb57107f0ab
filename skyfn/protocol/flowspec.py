"""The wire form of a flow (skyfn.flows builds it, the service runs it) and its compiler
to Amazon States Language.

A flow is a tree of nodes: `step` (one registered function on one endpoint, called with
the current value as its only argument; its result becomes the current value),
`sequence`, `parallel` (every branch gets the value; the result is the list of branch
results) and `map` (the body runs on each item of the value, a list; the result is the
list of results). Steps, parallels and maps take Retry rules and a catch handler, as in
ASL. Values between steps are JSON.

Each step compiles to four states: submit (RunTask Lambda: submit through the service
core), wait (RunTask: long-poll the task's state for a few seconds), a Choice that loops
back to wait while the task is pending, and a Pass that yields the task's output. A
node with retry/catch is wrapped in a one-branch Parallel so that a retry resubmits the
whole step. The service compiles the flow itself (it fills in the owner), so a user
never writes the Lambda parameters of a state machine.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

NAME = r"^[A-Za-z0-9][A-Za-z0-9 _.:-]{0,59}$"
MAX_NODES = 200
DEFAULT_WAIT_SECONDS = 10
LAMBDA_TRANSIENT = ["Lambda.ServiceException", "Lambda.AWSLambdaException", "Lambda.SdkClientException",
                    "Lambda.TooManyRequestsException", "Unavailable"]
# The service refuses new tasks while its backlog is over its bound (429 backlog; the step
# raises Backlogged, nothing stored): a submit state waits and retries, about an hour in all
# (full jitter: each wait is random up to 2 s, doubling, at most 30 s).
BACKLOG_RETRY = {"ErrorEquals": ["Backlogged"], "IntervalSeconds": 2, "MaxAttempts": 240, "BackoffRate": 2.0,
                 "MaxDelaySeconds": 30, "JitterStrategy": "FULL"}
# Errors a step can end with (docs/runs.md).
STEP_ERRORS = ("TaskFailed", "TaskTimedOut", "TaskCancelled", "EndpointOffline", "NotFound")


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Retry(_Spec):
    errors: list[str] = Field(default_factory=lambda: ["TaskFailed"], min_length=1)
    max_attempts: int = Field(default=2, ge=1, le=20)
    interval_seconds: int = Field(default=1, ge=1, le=3600)
    backoff_rate: float = Field(default=2.0, ge=1.0, le=10.0)


class Catch(_Spec):
    errors: list[str] = Field(default_factory=lambda: ["States.ALL"], min_length=1)
    handler: "Node" = Field(description="runs with {Error, Cause} as its value; its result continues the flow")


class StepNode(_Spec):
    type: Literal["step"] = "step"
    name: str = Field(pattern=NAME)
    function_id: str = Field(min_length=1, max_length=64)
    endpoint_id: str = Field(min_length=1, max_length=64)
    max_retries: int = Field(default=0, ge=0, le=100, description="service-level retries of a lost task")
    wait_seconds: int = Field(default=DEFAULT_WAIT_SECONDS, ge=1, le=20)
    retry: list[Retry] = Field(default_factory=list)
    catch: Optional[Catch] = None


class SequenceNode(_Spec):
    type: Literal["sequence"] = "sequence"
    nodes: list["Node"] = Field(min_length=1)


class ParallelNode(_Spec):
    type: Literal["parallel"] = "parallel"
    name: str = Field(pattern=NAME)
    branches: list["Node"] = Field(min_length=1, max_length=40)
    retry: list[Retry] = Field(default_factory=list)
    catch: Optional[Catch] = None


class MapNode(_Spec):
    type: Literal["map"] = "map"
    name: str = Field(pattern=NAME)
    body: "Node"
    max_concurrency: int = Field(default=0, ge=0, le=1000, description="0: no limit")
    retry: list[Retry] = Field(default_factory=list)
    catch: Optional[Catch] = None


Node = Annotated[Union[StepNode, SequenceNode, ParallelNode, MapNode], Field(discriminator="type")]


class FlowSpec(_Spec):
    version: Literal[1] = 1
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    root: Node


for _m in (Catch, SequenceNode, ParallelNode, MapNode, FlowSpec):
    _m.model_rebuild()


class FlowError(ValueError):
    """A flow that cannot be compiled; the message names the node and the fix."""


def _walk(node, seen: set[str], count: list[int]) -> None:
    count[0] += 1
    if count[0] > MAX_NODES:
        raise FlowError(f"the flow has more than {MAX_NODES} nodes: split it into several flows")
    name = getattr(node, "name", None)
    if name is not None:
        for suffix in ("", "/wait", "/pending?", "/output", "/run", "/guard"):
            if name + suffix in seen:
                raise FlowError(f"two nodes are named {name!r}: give each step, parallel and map a unique name")
        seen.add(name)
    children = (node.nodes if isinstance(node, SequenceNode) else node.branches if isinstance(node, ParallelNode)
                else [node.body] if isinstance(node, MapNode) else [])
    for child in children:
        _walk(child, seen, count)
    catch = getattr(node, "catch", None)
    if catch is not None:
        _walk(catch.handler, seen, count)


class _Compiler:
    def __init__(self, owner: str, run_task_arn: str):
        self.owner = owner
        self.fn = run_task_arn

    def _invoke(self, payload: dict) -> dict:
        return {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                "Parameters": {"FunctionName": self.fn, "Payload": payload},
                "Retry": [{"ErrorEquals": LAMBDA_TRANSIENT + ["Sandbox.Timedout"], "IntervalSeconds": 1,
                           "MaxAttempts": 4, "BackoffRate": 2.0}]}

    @staticmethod
    def _then(state: dict, nxt: Optional[str]) -> dict:
        if nxt is None:
            state["End"] = True
        else:
            state["Next"] = nxt
        return state

    def node(self, node, states: dict, nxt: Optional[str]) -> str:
        """Add `node`'s states to `states`; return the name of its first state."""
        if isinstance(node, SequenceNode):
            start = nxt
            for child in reversed(node.nodes):
                start = self.node(child, states, start)
            return start  # type: ignore[return-value]
        if getattr(node, "retry", None) or getattr(node, "catch", None):
            return self._wrapped(node, states, nxt)
        return self._plain(node, node.name, states, nxt)

    def _plain(self, node, name: str, states: dict, nxt: Optional[str]) -> str:
        if isinstance(node, StepNode):
            return self._step(node, name, states, nxt)
        if isinstance(node, ParallelNode):
            branches = []
            for branch in node.branches:
                sub: dict = {}
                start = self.node(branch, sub, None)
                branches.append({"StartAt": start, "States": sub})
            states[name] = self._then({"Type": "Parallel", "Branches": branches}, nxt)
            return name
        if isinstance(node, MapNode):
            sub = {}
            start = self.node(node.body, sub, None)
            states[name] = self._then({"Type": "Map", "ItemsPath": "$", "MaxConcurrency": node.max_concurrency,
                                       "ItemProcessor": {"ProcessorConfig": {"Mode": "INLINE"},
                                                         "StartAt": start, "States": sub}}, nxt)
            return name
        raise FlowError(f"unknown node type {type(node).__name__}")

    def _step(self, step: StepNode, name: str, states: dict, nxt: Optional[str]) -> str:
        submit = self._invoke({"action": "submit", "owner": self.owner, "function_id": step.function_id,
                               "endpoint_id": step.endpoint_id, "max_retries": step.max_retries,
                               "step": step.name, "args.$": "States.Array($)", "kwargs": {}})
        submit["ResultSelector"] = {"task_id.$": "$.Payload.task_id"}
        submit["Retry"].append(dict(BACKLOG_RETRY))
        submit["Next"] = f"{step.name}/wait"
        states[name] = submit
        wait = self._invoke({"action": "wait", "owner": self.owner, "task_id.$": "$.task_id",
                             "step": step.name, "wait_seconds": step.wait_seconds})
        wait["OutputPath"] = "$.Payload"
        wait["Next"] = f"{step.name}/pending?"
        states[f"{step.name}/wait"] = wait
        states[f"{step.name}/pending?"] = {"Type": "Choice", "Choices": [
            {"Variable": "$.pending", "IsPresent": True, "Next": f"{step.name}/wait"}],
            "Default": f"{step.name}/output"}
        states[f"{step.name}/output"] = self._then({"Type": "Pass", "InputPath": "$.output"}, nxt)
        return name

    def _wrapped(self, node, states: dict, nxt: Optional[str]) -> str:
        """A one-branch Parallel around the node carries its Retry and Catch: a retry
        re-runs the node from its start (a step is resubmitted, not re-polled)."""
        sub: dict = {}
        inner = f"{node.name}/run" if isinstance(node, StepNode) else node.name
        start = self._plain(node, inner, sub, None)
        wrapper: dict = {"Type": "Parallel", "Branches": [{"StartAt": start, "States": sub}], "OutputPath": "$[0]"}
        if node.retry:
            wrapper["Retry"] = [{"ErrorEquals": r.errors, "MaxAttempts": r.max_attempts,
                                 "IntervalSeconds": r.interval_seconds, "BackoffRate": r.backoff_rate}
                                for r in node.retry]
        if node.catch is not None:
            handler_start = self.node(node.catch.handler, states, nxt)
            wrapper["Catch"] = [{"ErrorEquals": node.catch.errors, "Next": handler_start}]
        name = node.name if isinstance(node, StepNode) else f"{node.name}/guard"
        states[name] = self._then(wrapper, nxt)
        return name


def compile_flow(spec: FlowSpec, owner: str, run_task_arn: str) -> dict[str, Any]:
    """The ASL definition of `spec` (a dict). The execution input is {"input": value}."""
    _walk(spec.root, set(), [0])
    c = _Compiler(owner, run_task_arn)
    states: dict[str, Any] = {}
    start = c.node(spec.root, states, None)
    if "Input" in states:
        raise FlowError("'Input' is reserved: rename that node")
    states["Input"] = {"Type": "Pass", "InputPath": "$.input", "Next": start}
    return {"Comment": f"skyfn flow {spec.name} (compiled by skyfn.protocol.flowspec)", "StartAt": "Input",
            "States": states}


def compile_json(spec: FlowSpec, owner: str, run_task_arn: str) -> str:
    return json.dumps(compile_flow(spec, owner, run_task_arn), separators=(",", ":"))
