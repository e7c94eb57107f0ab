"""Helpers of the service's task-graph tests (test_dataflow, test_dataflow_parked): submit
tasks with and without inputs through the API handler, and read one back with its events."""
from __future__ import annotations

from skyfn.protocol import pack_args


def add(*xs):
    return sum(xs)


def submit(api, fid, ep, *tasks: dict) -> list[str]:
    body = {"endpoint_id": ep["endpoint_id"], "tasks": [{"function_id": fid, **t} for t in tasks]}
    status, answer = api.call("POST", "/tasks", body)
    assert status == 202, answer
    return answer["task_ids"]


def plain(*args) -> dict:
    return {"payload": pack_args(args, {})}


def dependent(inputs: list[str], *args) -> dict:
    return {"payload": pack_args(args, {}), "inputs": inputs}


def info(api, tid: str) -> dict:
    status, body = api.call("POST", "/tasks/status", {"task_ids": [tid], "peek": True, "include_events": True})
    assert status == 200, body
    return body["tasks"][tid]
