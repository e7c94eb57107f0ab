"""Flows: a user's state machine of steps (registered functions on endpoints), built in
Python and run by the service as a Step Functions state machine; each execution is a run
(skyfn.runs, docs/runs.md).

    from skyfn.flows import Flow, Map, Parallel, Step

    flow = Flow("ssx",
                Step(acquire, "local"),
                Map(Step(process_image, "local"), max_concurrency=8),
                Step(solve, "hpc").retry(max_attempts=3),
                Parallel(Step(extract_metadata, "local"), Step(plot, "local")))
    output = flow.run(client, {"images": 16}).result()

Each Step calls its function with the current value as its only argument and passes its
result on (values are JSON). Parallel gives every branch the value and yields the list
of their results; Map runs its body on each item of a list. `.retry(...)` and
`.catch(handler, ...)` work as Retry and Catch in Amazon States Language; the errors a
step can end with are TaskFailed, TaskTimedOut, TaskCancelled, EndpointOffline and
NotFound. Functions may be callables (registered on first use) or function ids;
endpoints are names or ids.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Optional, Union

from skyfn.protocol.flowspec import FlowSpec, compile_flow
from skyfn.runs import Run, endpoint_id, function_id

FunctionRef = Union[str, Callable[..., Any]]
_SAFE = re.compile(r"[^A-Za-z0-9 _.:-]")


class _Node:
    name: Optional[str] = None

    def __init__(self) -> None:
        self._retry: list[dict] = []
        self._catch: Optional[dict] = None

    def retry(self, errors: Iterable[str] = ("TaskFailed",), max_attempts: int = 2, interval: int = 1,
              backoff: float = 2.0) -> "_Node":
        """Retry this node (from its start: a step is resubmitted) on these errors."""
        self._retry.append({"errors": list(errors), "max_attempts": max_attempts, "interval_seconds": interval,
                            "backoff_rate": backoff})
        return self

    def catch(self, handler: "_Node", errors: Iterable[str] = ("States.ALL",)) -> "_Node":
        """On these errors (after retries) run `handler` with {Error, Cause} as its value;
        its result continues the flow."""
        self._catch = {"errors": list(errors), "handler": handler}
        return self

    def _common(self, ctx: "_Context") -> dict:
        out: dict[str, Any] = {}
        if self._retry:
            out["retry"] = list(self._retry)
        if self._catch is not None:
            out["catch"] = {"errors": self._catch["errors"], "handler": self._catch["handler"]._spec(ctx)}
        return out

    def _spec(self, ctx: "_Context") -> dict:
        raise TypeError(f"{type(self).__name__} is not a flow node")


class _Context:
    """Resolves functions and endpoints (through a client, or to placeholders) and
    gives every node a unique name."""

    def __init__(self, client=None):
        self.client = client
        self.names: set[str] = set()

    def name(self, wanted: Optional[str], default: str) -> str:
        base = _SAFE.sub("-", wanted or default).lstrip(" _.:-")[:50] or "node"
        name, n = base, 2
        while name in self.names:
            name, n = f"{base}-{n}", n + 1
        self.names.add(name)
        return name

    def function(self, fn: FunctionRef) -> str:
        if self.client is not None:
            return function_id(self.client, fn)
        return fn if isinstance(fn, str) else f"<{getattr(fn, '__name__', 'function')}>"

    def endpoint(self, ep: str) -> str:
        return endpoint_id(self.client, ep) if self.client is not None else ep


class Step(_Node):
    def __init__(self, function: FunctionRef, endpoint: str, name: Optional[str] = None, *, max_retries: int = 0,
                 wait_seconds: int = 10):
        super().__init__()
        self.function, self.endpoint, self.name = function, endpoint, name
        self.max_retries, self.wait_seconds = max_retries, wait_seconds

    def _spec(self, ctx: _Context) -> dict:
        default = self.function if isinstance(self.function, str) else getattr(self.function, "__name__", "step")
        return {"type": "step", "name": ctx.name(self.name, default), "function_id": ctx.function(self.function),
                "endpoint_id": ctx.endpoint(self.endpoint), "max_retries": self.max_retries,
                "wait_seconds": self.wait_seconds, **self._common(ctx)}


class Sequence_(_Node):
    def __init__(self, *nodes: _Node):
        super().__init__()
        if not nodes:
            raise ValueError("a sequence needs at least one node")
        self.nodes = nodes

    def _spec(self, ctx: _Context) -> dict:
        spec = {"type": "sequence", "nodes": [n._spec(ctx) for n in self.nodes]}
        if self._retry or self._catch:
            raise ValueError("retry/catch go on a step, parallel or map, not on a sequence")
        return spec


class Parallel(_Node):
    def __init__(self, *branches: _Node, name: Optional[str] = None):
        super().__init__()
        if not branches:
            raise ValueError("Parallel needs at least one branch")
        self.branches, self.name = branches, name

    def _spec(self, ctx: _Context) -> dict:
        name = ctx.name(self.name, "parallel")
        return {"type": "parallel", "name": name, "branches": [b._spec(ctx) for b in self.branches],
                **self._common(ctx)}


class Map(_Node):
    def __init__(self, body: _Node, name: Optional[str] = None, max_concurrency: int = 0):
        super().__init__()
        self.body, self.name, self.max_concurrency = body, name, max_concurrency

    def _spec(self, ctx: _Context) -> dict:
        name = ctx.name(self.name, "map")
        return {"type": "map", "name": name, "body": self.body._spec(ctx), "max_concurrency": self.max_concurrency,
                **self._common(ctx)}


class Flow:
    """A named flow: its nodes run in sequence."""

    def __init__(self, name: str, *nodes: _Node):
        if not nodes:
            raise ValueError("a flow needs at least one node")
        self.name = name
        self.root: _Node = nodes[0] if len(nodes) == 1 else Sequence_(*nodes)

    def __repr__(self) -> str:
        return f"<skyfn Flow {self.name}>"

    def spec(self, client=None) -> FlowSpec:
        """The wire form; with a client, functions are registered and endpoints resolved."""
        return FlowSpec(name=self.name, root=self.root._spec(_Context(client)))

    def to_asl(self, client=None, owner: str = "<owner>", run_task_arn: str = "${RunTaskArn}") -> dict:
        """The Amazon States Language the service runs (owner and function ARN as placeholders)."""
        return compile_flow(self.spec(client), owner, run_task_arn)

    def run(self, client, input: Any = None) -> Run:
        """Start a run of this flow with `input` as the first step's value."""
        body = {"flow": self.spec(client).model_dump(mode="json"), "input": input}
        answer = client._http.post("/flows", body)
        return Run(client, answer["run_id"], "flow")


Sequence = Sequence_

__all__ = ["Flow", "Map", "Parallel", "Sequence", "Step"]
