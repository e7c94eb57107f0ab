"""Runs from the SDK: every Step Functions execution the service starts for you is a run.
Large batches (POST /batches, a Step Functions Distributed Map), SPMD groups
(POST /spmd-groups) and the status of any run, a flow's too (GET /runs/{id}); flows
themselves are built in skyfn.flows.

    batch = submit_batch(client, square, [(i,) for i in range(100_000)], "local")
    batch.wait()                      # {"state": "COMPLETE", "counts": {"SUCCEEDED": ...}, ...}
    group = run_group(client, rank_main, "local", world_size=4)
    group.result()                    # {"group_id": ..., "results": [rank 0's, rank 1's, ...]}
"""
from __future__ import annotations

import time
from skyfn.protocol.ids import uuid7_hex
from typing import Any, Callable, Iterable, Optional, Union
from urllib.parse import quote

from skyfn.protocol.errors import SkyfnError
from skyfn.protocol.serialize import pack_args

FINAL_RUN_STATES = frozenset({"SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"})
FunctionRef = Union[str, Callable[..., Any]]


class RunFailed(SkyfnError):
    """A run ended in FAILED, TIMED_OUT or ABORTED; `error` and `cause` are
    Step Functions' (e.g. TaskFailed and the task's exception)."""

    def __init__(self, run_id: str, state: str, error: Optional[str], cause: Optional[str]):
        super().__init__(f"run {run_id} ended {state}: {error or 'no error name'}: {cause or ''}".rstrip(": "))
        self.run_id, self.state, self.error, self.cause = run_id, state, error, cause


def function_id(client, fn: FunctionRef) -> str:
    return fn if isinstance(fn, str) else client._function_id_for(fn)


def endpoint_id(client, endpoint: str) -> str:
    return client.endpoint_id(endpoint)


class Run:
    """A run: a Step Functions execution the service started for you."""

    def __init__(self, client, run_id: str, kind: str):
        self.client, self.run_id, self.kind = client, run_id, kind

    def __repr__(self) -> str:
        return f"<skyfn {self.kind} run {self.run_id}>"

    def status(self) -> dict[str, Any]:
        return self.client._http.get(f"/runs/{quote(self.run_id, safe='')}")

    def wait(self, timeout: Optional[float] = None, poll: float = 0.5) -> dict[str, Any]:
        """Block until the run is final; returns its status (whatever the outcome)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            st = self.status()
            if st["state"] in FINAL_RUN_STATES:
                return st
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.run_id} still {st['state']} after {timeout} s")
            time.sleep(poll)

    def result(self, timeout: Optional[float] = None) -> Any:
        """The run's output; RunFailed if it did not succeed."""
        st = Run.wait(self, timeout)
        if st["state"] != "SUCCEEDED":
            raise RunFailed(self.run_id, st["state"], st.get("error"), st.get("cause"))
        return st.get("output")


class BatchRun(Run):
    def __init__(self, client, answer: dict[str, Any]):
        super().__init__(client, answer["run_id"], "batch")
        self.batch_id: str = answer["batch_id"]
        self.task_ids: list[str] = answer["task_ids"]
        self.chunks: int = answer["chunks"]

    def progress(self) -> dict[str, Any]:
        """GET /batches/{id}: run_state, state, counts of final task states, failed chunks."""
        return self.client._http.get(f"/batches/{quote(self.batch_id, safe='')}")

    def wait(self, timeout: Optional[float] = None, poll: float = 0.5) -> dict[str, Any]:
        """Block until the run is final; returns the batch's progress report."""
        super().wait(timeout, poll)
        return self.progress()


def submit_batch(client, fn: FunctionRef, args: Iterable[Union[tuple, list]], endpoint: str, *,
                 kwargs: Optional[Iterable[dict]] = None, max_retries: int = 3, deadline_seconds: float = 3600.0,
                 poll_seconds: int = 2) -> BatchRun:
    """One task per element of `args` (each a tuple of positional arguments), as one
    batch run. Task ids come back at once (BatchRun.task_ids), in order."""
    arg_list = [tuple(a) for a in args]
    kw_list = list(kwargs) if kwargs is not None else [{}] * len(arg_list)
    if len(kw_list) != len(arg_list):
        raise ValueError(f"{len(kw_list)} kwargs for {len(arg_list)} argument tuples")
    body = {"endpoint_id": endpoint_id(client, endpoint), "function_id": function_id(client, fn),
            "payloads": [pack_args(a, k) for a, k in zip(arg_list, kw_list)], "max_retries": max_retries,
            "idempotency_key": uuid7_hex(), "deadline_seconds": deadline_seconds,
            "poll_seconds": poll_seconds}
    return BatchRun(client, client._http.post("/batches", body))


def run_group(client, fn: FunctionRef, endpoint: str, world_size: int, *, max_retries: int = 0,
              **kwargs: Any) -> Run:
    """Run `fn` once per rank, all at once, each called as fn(rank=, world_size=,
    rendezvous={host, port, group, token}, **kwargs). The result is {group_id,
    world_size, results} with the ranks' results in rank order."""
    body = {"endpoint_id": endpoint_id(client, endpoint), "function_id": function_id(client, fn),
            "world_size": world_size, "kwargs": kwargs, "max_retries": max_retries}
    answer = client._http.post("/spmd-groups", body)
    return Run(client, answer["run_id"], "group")
