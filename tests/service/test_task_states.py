"""POST /endpoints/<id>/task-states (lambdas/core/tasks/endpoint_states.py), on a real
redis-server and moto: an endpoint's agent learns the states of its own tasks -- what a
multi-user endpoint's privileged process checks its user agents' audit copies against --
and nothing of another endpoint's: their tasks are UNKNOWN, like ids that do not exist.
Another endpoint's credential and a user's token are refused (403); bad input is a 422 that
names the problem."""
from __future__ import annotations

import uuid

import pytest

from skyfn.protocol import pack_args, serialize_function
from skyfn.protocol.task_states import MAX_TASK_STATES
from tests.service.conftest import Api


def double(x):
    return 2 * x


def _endpoint(api, name):
    status, reg = api.call("POST", "/endpoints", {"name": name, "metadata": {"multi_user": True}})
    assert status == 201 and reg["agent_credential"], reg
    return reg["endpoint_id"], Api(reg["agent_credential"])


def _submit(api, ep, n=2):
    _, fn = api.call("POST", "/functions", {"function": serialize_function(double)})
    status, sub = api.call("POST", "/tasks", {"endpoint_id": ep, "tasks": [
        {"function_id": fn["function_id"], "payload": pack_args((i,), {})} for i in range(n)]})
    assert status == 202, sub
    return sub["task_ids"]


@pytest.fixture
def two(api, other_api):
    """alice's endpoint Y with two tasks (one cancelled), mallory's endpoint X with one."""
    y, y_agent = _endpoint(api, "hpc")
    x, x_agent = _endpoint(other_api, "laptop")
    ty = _submit(api, y)
    tx = _submit(other_api, x, 1)
    status, _ = api.call("DELETE", f"/tasks/{ty[1]}")
    assert status == 200
    return {"y": y, "y_agent": y_agent, "ty": ty, "x": x, "x_agent": x_agent, "tx": tx}


def test_an_endpoint_learns_the_states_of_its_own_tasks_only(two):
    ghost = str(uuid.uuid4())
    ids = [*two["ty"], two["tx"][0], ghost]
    status, answer = two["y_agent"].call("POST", f"/endpoints/{two['y']}/task-states", {"task_ids": ids})
    assert status == 200, answer
    states = answer["states"]
    assert set(states) == set(ids)
    assert states[two["ty"][0]]["state"] == "QUEUED"
    cancelled = states[two["ty"][1]]
    assert cancelled["state"] == "CANCELLED" and cancelled["end"] > 0 and cancelled.get("reason")
    # mallory's task and a task that never was: the same answer, nothing of either
    assert states[two["tx"][0]] == states[ghost] == {"state": "UNKNOWN"}
    # and mallory's endpoint, asking about alice's tasks, learns nothing either
    status, answer = two["x_agent"].call("POST", f"/endpoints/{two['x']}/task-states", {"task_ids": two["ty"]})
    assert status == 200 and all(s == {"state": "UNKNOWN"} for s in answer["states"].values()), answer


def test_another_endpoints_credential_and_a_user_token_are_refused(two, api):
    body = {"task_ids": two["ty"]}
    status, answer = two["x_agent"].call("POST", f"/endpoints/{two['y']}/task-states", body)
    assert status == 403 and answer["error"] == "forbidden", answer
    assert "task-states" in answer["message"]
    status, answer = api.call("POST", f"/endpoints/{two['y']}/task-states", body)  # the endpoint's owner
    assert status == 403 and "endpoint credential" in answer["message"], answer
    status, answer = two["y_agent"].call("POST", f"/endpoints/{two['y']}/task-states", body, token="nope")
    assert status == 401, answer


@pytest.mark.parametrize("body, says", [
    ({}, "task_ids"),
    ({"task_ids": []}, "task_ids"),
    ({"task_ids": "abc"}, "task_ids"),
    ({"task_ids": [7]}, "task_ids"),
    ({"task_ids": [""]}, "task_ids"),
    ({"task_ids": ["x" * 129]}, "task_ids"),
    ({"task_ids": [str(i) for i in range(MAX_TASK_STATES + 1)]}, "task_ids"),
    ({"task_ids": ["a"], "also": 1}, "also"),
])
def test_bad_input_is_a_422_naming_the_problem(two, body, says):
    status, answer = two["y_agent"].call("POST", f"/endpoints/{two['y']}/task-states", body)
    assert status == 422, answer
    assert says in str(answer), answer
