"""The service double with dataflow (issue 26), for the SDK's dataflow tests.

``DataflowService`` is the FakeService (tests/sdk/fake_service.py) plus what the contract
(/work/notes/issue26-contract.md, skyfn.protocol.dataflow) asks of the service: a task with
``inputs`` is stored WAITING (an input named ``#k`` is the k-th task of the same request,
an unknown id is 404), released once every input SUCCEEDED with an *envelope* for payload,
FAILED with the DependencyFailed reason and the input's error when an input failed or timed
out, CANCELLED when one was cancelled -- transitively. Tasks run through the worker's own
``run_task`` (endpoint_agent/manager/worker.py), so envelopes are opened by the real
worker code. Ids are UUIDs (the DependencyFailed reason names them). Every POST /tasks body
is kept in ``bodies``.
"""
from __future__ import annotations

import time
import uuid
from typing import Any

from endpoint_agent.manager.worker import FunctionCache, run_task
from skyfn.protocol import api
from skyfn.protocol.dataflow import DEPENDENCY_FAILED, make_envelope, parse_input

from .fake_service import ApiError, FakeService, _validate

FINAL = {"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED"}


class DataflowService(FakeService):
    def __init__(self, *a: Any, **kw: Any):
        self.bodies: list[dict] = []
        self.dependents: dict[str, list[str]] = {}
        self.runs: dict[str, int] = {}  # task id -> times it ran
        self._cache = FunctionCache()
        super().__init__(*a, **kw)

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        parts = [p for p in path.split("?")[0].split("/") if p]
        if method == "POST" and parts == ["tasks"]:
            self.bodies.append(body)
        status, answer = super().handle(method, path, body)
        if method == "DELETE" and len(parts) == 2 and parts[0] == "tasks":
            with self.lock:
                self._after_final(parts[1])
        return status, answer

    def finish(self, task_id: str, state: str, reason: str | None = None) -> None:
        super().finish(task_id, state, reason)
        with self.lock:
            self._after_final(task_id)

    # -- submission -------------------------------------------------------------------
    def _submit(self, body: Any) -> tuple[int, Any]:
        req = _validate(api.SubmitTasks, body)
        release = []
        with self.lock:
            if req.idempotency_key and req.idempotency_key in self.submissions:
                return 200, {**self.submissions[req.idempotency_key], "replayed": True}
            ids = [str(uuid.uuid4()) for _ in req.tasks]
            named: list[list[str]] = []
            for pos, tr in enumerate(req.tasks):
                if tr.function_id not in self.functions:
                    raise ApiError(400, "invalid_request", f"unknown function {tr.function_id}")
                if not (tr.endpoint_id or req.endpoint_id):
                    raise ApiError(400, "invalid_request", "no endpoint_id for a task")
                inputs = []
                for text in tr.inputs or ():
                    try:
                        tid, k = parse_input(text, pos)
                    except ValueError as exc:
                        raise ApiError(400, "invalid_request", str(exc)) from None
                    if tid is not None and tid not in self.tasks:
                        raise ApiError(404, "not_found", f"no task {tid}")
                    inputs.append(tid if tid is not None else ids[k])
                named.append(inputs)
            sid = str(uuid.uuid4())
            now = time.time()
            for tid, tr, inputs in zip(ids, req.tasks, named):
                waiting = bool(inputs)
                self.tasks[tid] = {
                    "task_id": tid, "state": "WAITING" if waiting else "QUEUED", "function_id": tr.function_id,
                    "payload": tr.payload, "endpoint_id": tr.endpoint_id or req.endpoint_id, "submission_id": sid,
                    "owner": "tester", "created": now, "inputs": inputs, "memoize": tr.memoize,
                    "events": [("CREATED", now), ("WAITING" if waiting else "QUEUED", now)],
                }
                for i in dict.fromkeys(inputs):
                    self.dependents.setdefault(i, []).append(tid)
                if waiting:
                    self._check(tid)
                else:
                    release.append(tid)
            answer = {"submission_id": sid, "task_ids": ids, "replayed": False}
            if req.idempotency_key:
                self.submissions[req.idempotency_key] = answer
        for tid in release:
            self._runq.put(tid)
        return 202, answer

    # -- the graph (call with the lock held) ----------------------------------------------
    def _check(self, tid: str) -> None:
        t = self.tasks[tid]
        if t["state"] != "WAITING":
            return
        now = time.time()
        for i in t["inputs"]:
            src = self.tasks[i]
            if src["state"] in ("FAILED", "TIMED_OUT"):
                t.update(state="FAILED", reason=DEPENDENCY_FAILED.format(input=i, state=src["state"]),
                         error=src.get("error"))
                break
            if src["state"] == "CANCELLED":
                t.update(state="CANCELLED", reason=f"cancelled: input task {i} was cancelled")
                break
        else:
            if any(self.tasks[i]["state"] != "SUCCEEDED" for i in t["inputs"]):
                return
            t["payload"] = make_envelope(t["payload"], [{"task_id": i, "result": self.tasks[i]["result"]}
                                                        for i in t["inputs"]])
            t["state"] = "QUEUED"
            t["events"].append(("QUEUED", now))
            self._runq.put(tid)
            return
        t["events"].append((t["state"], now))
        self.done_log.append(tid)
        self.lock.notify_all()
        self._after_final(tid)

    def _after_final(self, tid: str) -> None:
        for d in self.dependents.get(tid, ()):
            self._check(d)

    # -- running --------------------------------------------------------------------------
    def _execute(self, t: dict) -> dict[str, Any]:
        """Through the worker's own run_task, envelopes and all."""
        fid = t["function_id"]
        with self.lock:
            self.runs[t["task_id"]] = self.runs.get(t["task_id"], 0) + 1
            self._cache.add({fid: self.functions[fid]["function"]})
        state, result, error = run_task(self._cache, fid, t["payload"])
        return {"state": state, "result": result, "error": error}

    def _finished(self, tid: str) -> None:
        self._after_final(tid)
