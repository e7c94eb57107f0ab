"""What a submission sends: the body of each call, per-task options, the user config of a
multi-user endpoint, a Batch of calls, and how a large submission is split into POST /tasks
requests (each with its own idempotency key, sent by skyfn.client.Client.submit_tasks).

Request bodies are plain dicts shaped like the models of ``skyfn.protocol.api`` (no model
is built per task on the hot path).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

from skyfn.dataflow import bind_inputs
from skyfn.protocol.serialize import pack_args

FunctionRef = Union[str, Callable[..., Any]]

# One POST /tasks carries at most this many tasks / about this many bytes of JSON; larger
# batches are split, each request with its own idempotency key.
REQUEST_MAX_TASKS = 5_000
REQUEST_MAX_BYTES = 8 << 20
_TASK_OVERHEAD = 128  # JSON keys, quotes, ids of one task entry


def _task_size(task: dict) -> int:
    p = task["payload"]
    # JSON escapes quotes, backslashes and the header's newline; payloads are ASCII.
    return len(p) + p.count('"') + p.count("\\") + _TASK_OVERHEAD + 40 * len(task.get("inputs") or ())


def split_requests(tasks: list[dict], max_tasks: Optional[int] = None, max_bytes: Optional[int] = None) -> list[list[dict]]:
    """Split tasks into POST /tasks bodies of at most ``max_tasks`` tasks / ~``max_bytes``."""
    max_tasks = min(max_tasks or REQUEST_MAX_TASKS, REQUEST_MAX_TASKS)
    max_bytes = max_bytes or REQUEST_MAX_BYTES
    chunks: list[list[dict]] = []
    cur: list[dict] = []
    size = 0
    for t in tasks:
        s = _task_size(t)
        if cur and (len(cur) >= max_tasks or size + s > max_bytes):
            chunks.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += s
    if cur:
        chunks.append(cur)
    return chunks


def task_options(resource_specification: Optional[dict] = None, walltime: Optional[float] = None) -> dict:
    """Per-task options of a submission: resources ({"cores": n, "gpus": n}) and walltime."""
    opts: dict[str, Any] = {}
    if resource_specification:
        unknown = set(resource_specification) - {"cores", "gpus"}
        if unknown:
            raise ValueError(f"unknown resource_specification keys {sorted(unknown)}: allowed are 'cores' and 'gpus'")
        opts["resources"] = dict(resource_specification)
    if walltime is not None:
        opts["walltime"] = float(walltime)
    return opts


def check_user_config(user_config: Optional[dict]) -> Optional[dict]:
    """``user_config`` as given when it is None or a valid one (a JSON object of at most
    16 KiB, nested at most 8 deep: skyfn.protocol.user_config); ValueError naming the problem
    otherwise, before anything is sent (the service refuses it with 400 too)."""
    if user_config is None:
        return None
    from skyfn.protocol.user_config import problem

    why = problem(user_config)
    if why is not None:
        raise ValueError(why)
    return user_config


class Batch:
    """Tasks collected with :meth:`add` and submitted together by ``Client.batch_run``
    (``client``: the skyfn.client.Client that made it)."""

    def __init__(self, client: Any, endpoint_id: Optional[str] = None,
                 resource_specification: Optional[dict] = None, walltime: Optional[float] = None,
                 user_config: Optional[dict] = None):
        self._client = client
        self.endpoint_id = endpoint_id
        self.tasks: list[dict] = []
        self._options = task_options(resource_specification, walltime)
        self.user_config = check_user_config(user_config)  # sent with the batch (multi-user endpoints)

    def add(self, function_id: FunctionRef, *args: Any, endpoint_id: Optional[str] = None, **kwargs: Any) -> None:
        """Add a call; futures and TaskRefs among its arguments are inputs (see Client.run)."""
        if not isinstance(function_id, str):
            function_id = self._client._function_id_for(function_id)
        task = {"function_id": function_id, **call_body(args, kwargs), **self._options}
        if endpoint_id:
            task["endpoint_id"] = endpoint_id
        elif not self.endpoint_id:
            raise ValueError("no endpoint: pass endpoint_id to create_batch(...) or to add(...)")
        self.tasks.append(task)

    def __len__(self) -> int:
        return len(self.tasks)

    def __repr__(self) -> str:
        return f"<Batch of {len(self.tasks)} tasks for {self.endpoint_id or 'per-task endpoints'}>"


def call_body(args: tuple, kwargs: dict) -> dict[str, Any]:
    """The payload of a call made at once, and its inputs (skyfn.dataflow) by task id."""
    args, kwargs, inputs = bind_inputs(args, kwargs)
    if not inputs:
        return {"payload": pack_args(args, kwargs)}
    return {"payload": pack_args(args, kwargs), "inputs": inputs}


def no_memo(task: dict) -> dict:
    """A task with inputs, asking for no memoization whatever the submission's or the
    function's setting: its payload's placeholders would match any other inputs' results."""
    return task if task.get("memoize") is False else {**task, "memoize": False}
