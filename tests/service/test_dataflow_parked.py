"""Parked dependents in the service (lua/wait.lua, settle.lua, release_take.lua, unpark.lua; FINISH,
PROGRESS, EXPIRE): a dependent whose unfinished inputs all go to its own endpoint, whose agent
reports the `park` feature, is sent there ahead of them and released by the agent; the service
never sends it again unless the agent hands it back. Against a real Redis, through the API
handler and the results function, the packs read back from the endpoint's real queue."""
from __future__ import annotations

import time

import pytest

from lambdas.core import deps
from lambdas.core.tasks import dataflow
from lambdas.results import apply_pack
from skyfn.protocol import pack_args, serialize_function
from skyfn.protocol.dataflow import PARK_FEATURE, Input, dependency_failure, open_envelope
from skyfn.protocol.messages import ControlMessage, ResultPack, TaskPack, TaskResult, TaskUpdate
from skyfn.protocol.queues import open_queue
from skyfn.protocol.serialize import serialize
from tests.service.conftest import Api
from tests.service.graph_parts import add, dependent, info, plain, submit
from lambdas.adapters.redis_store.connection import redis_client



def register(api, name: str, features: list[str] | None) -> tuple[dict, Api]:
    status, ep = api.call("POST", "/endpoints", {"name": name})
    assert status in (200, 201), ep
    agent = Api(ep["agent_credential"])
    body = {"stats": {}} if features is None else {"stats": {}, "features": features}
    status, _ = agent.call("POST", f"/endpoints/{ep['endpoint_id']}/heartbeat", body)
    assert status == 200
    return ep, agent


@pytest.fixture
def world(api):
    status, fn = api.call("POST", "/functions", {"function": serialize_function(add), "name": "add"})
    assert status == 201
    ep, _ = register(api, "cluster", [PARK_FEATURE])
    return api, fn["function_id"], ep


def sends(ep: dict) -> list[dict]:
    """Every task spec sent to the endpoint's queue, in order (a task sent twice is listed twice)."""
    out = []
    for _, fields in redis_client().xrange(ep["task_queue"]["name"]):
        out += [t.model_dump() for t in TaskPack.model_validate_json(fields[b"b"]).tasks]
    return out


def sent_to(ep: dict, tid: str) -> list[dict]:
    return [s for s in sends(ep) if s["task_id"] == tid]





def result(task_id: str, state: str = "SUCCEEDED", value=None, error=None, events=()) -> TaskResult:
    return TaskResult(task_id=task_id, state=state, result=serialize(value) if state == "SUCCEEDED" else None,
                      error=error, events=list(events))


def pack(ep, results=(), updates=()) -> None:
    apply_pack(ResultPack(endpoint_id=ep["endpoint_id"], results=list(results), updates=list(updates)))


def update(task_id: str, state: str) -> TaskUpdate:
    return TaskUpdate(task_id=task_id, state=state, ts=time.time(), lease_seconds=60)



def record(tid: str) -> dict:
    return {k.decode(): v.decode() for k, v in redis_client().hgetall(f"t:{tid}").items()}


def load(ep) -> dict:
    return {k.decode(): int(v) for k, v in redis_client().hgetall(f"load:{ep['endpoint_id']}").items()}


def test_a_dependent_on_its_own_endpoint_is_sent_ahead_and_its_agent_releases_it(world):
    api, fid, ep = world
    a, b = submit(api, fid, ep, plain(1, 2), dependent(["#0"], Input(0), 10))
    (spec,) = sent_to(ep, b)  # sent at once, its input still QUEUED
    assert spec["after"] == [a]
    env = open_envelope(spec["payload"])
    assert env["args"] == pack_args((Input(0), 10), {}) and env["inputs"] == [{"task_id": a, "local": True}]
    assert info(api, b)["state"] == "WAITING" and record(b)["pk"] == "1"
    assert record(a)["pn"] == "1"  # pinned while the parked dependent may still be handed back

    # the agent ran both and reports them in one pack: b's RUNNING before a's result
    now = time.time()
    pack(ep, [result(a, value=3), result(b, value=13, events=[["QUEUED", now], ["DISPATCHED", now]])],
         [update(a, "RUNNING"), update(b, "RUNNING")])
    got = info(api, b)
    assert got["state"] == "SUCCEEDED"
    names = [e[0] for e in got["events"]]
    assert names[:2] == ["CREATED", "WAITING"] and "QUEUED" in names and names[-2:] == ["SUCCEEDED", "STORED"]
    rec = record(b)
    assert not {"pk", "wp", "dn"} & set(rec)  # the park, the pack kept for a hand-back, the count: gone
    assert "pn" not in record(a)  # unpinned
    assert load(ep) == {}  # loaded while it ran, unloaded when it ended: nothing left over
    assert len(sent_to(ep, b)) == 1  # never sent again
    r = redis_client()
    assert r.llen("release") == 0 and r.zcard("releasing") == 0 and r.llen("settled") == 0


def test_a_dependents_result_before_its_inputs_is_kept_and_the_input_settles_after(world):
    api, fid, ep = world
    a, b, c = submit(api, fid, ep, plain(1), dependent(["#0"], Input(0)), dependent(["#1"], Input(0)))
    assert sorted(s["task_id"] for s in sends(ep)) == sorted([a, b, c])  # both dependents sent ahead
    pack(ep, [result(b, value=1)])  # the agent's packs may reach the service out of order
    pack(ep, [result(c, value=1)])
    pack(ep, [result(a, value=1)])
    assert [info(api, t)["state"] for t in (a, b, c)] == ["SUCCEEDED"] * 3
    assert len(sends(ep)) == 3 and load(ep) == {}
    assert all(not {"pk", "wp", "dn", "pn"} & set(record(t)) for t in (a, b, c))


def test_nothing_is_parked_on_an_endpoint_whose_agent_does_not_say_it_can(api, world):
    _, fid, _ = world
    for name, features in (("old", None), ("other-features", ["something-else"])):
        ep, _ = register(api, name, features)
        a, b = submit(api, fid, ep, plain(1), dependent(["#0"], Input(0)))
        assert [s["task_id"] for s in sends(ep)] == [a]
        assert "pk" not in record(b)


def test_a_later_heartbeat_without_the_feature_stops_the_parking(api, world):
    _, fid, ep = world
    agent_ep, agent = register(api, "upgraded-then-downgraded", [PARK_FEATURE])
    assert agent.call("POST", f"/endpoints/{agent_ep['endpoint_id']}/heartbeat", {"stats": {}})[0] == 200
    a, b = submit(api, fid, agent_ep, plain(1), dependent(["#0"], Input(0)))
    assert [s["task_id"] for s in sends(agent_ep)] == [a]


def test_a_dependent_with_an_input_on_another_endpoint_waits_at_the_service(api, world):
    _, fid, ep = world
    other, _ = register(api, "elsewhere", [PARK_FEATURE])
    (a,) = submit(api, fid, other, plain(1))
    (b,) = submit(api, fid, ep, dependent([a], Input(0)))
    assert sent_to(ep, b) == [] and "pk" not in record(b)
    pack(other, [result(a, value=4)])
    (spec,) = sent_to(ep, b)
    assert "after" not in spec or spec["after"] is None
    assert open_envelope(spec["payload"])["inputs"] == [{"task_id": a, "result": serialize(4)}]


def test_inputs_already_done_travel_in_the_parked_envelope(world):
    api, fid, ep = world
    (a,) = submit(api, fid, ep, plain(1))
    pack(ep, [result(a, value=5)])
    (b, c) = submit(api, fid, ep, plain(2), dependent([a, "#0"], Input(0), Input(1)))
    (spec,) = sent_to(ep, c)
    assert spec["after"] == [b]
    assert open_envelope(spec["payload"])["inputs"] == [{"task_id": a, "result": serialize(5)},
                                                        {"task_id": b, "local": True}]


def test_handed_back_while_its_input_runs_it_is_released_by_the_service(world):
    api, fid, ep = world
    a, b = submit(api, fid, ep, plain(1), dependent(["#0"], Input(0)))
    pack(ep, updates=[update(b, "UNPARK")])  # the agent could not keep it (restarted, say)
    assert info(api, b)["state"] == "WAITING" and "pk" not in record(b)
    assert len(sent_to(ep, b)) == 1
    pack(ep, [result(a, value=7)])
    assert info(api, b)["state"] == "QUEUED"
    first, again = sent_to(ep, b)
    assert first["after"] == [a] and again.get("after") is None
    assert open_envelope(again["payload"])["inputs"] == [{"task_id": a, "result": serialize(7)}]
    assert "pn" not in record(a) and "wp" not in record(b)  # sent in full: unpinned as any release


def test_handed_back_after_its_input_succeeded_it_is_sent_again_at_once(world):
    api, fid, ep = world
    a, b = submit(api, fid, ep, plain(1), dependent(["#0"], Input(0)))
    pack(ep, [result(a, value=8)])
    assert info(api, b)["state"] == "WAITING"  # its agent releases it: the service does not
    assert len(sent_to(ep, b)) == 1
    pack(ep, updates=[update(b, "UNPARK")])
    assert info(api, b)["state"] == "QUEUED" and load(ep) == {"_": 1}
    again = sent_to(ep, b)[1]
    assert open_envelope(again["payload"])["inputs"] == [{"task_id": a, "result": serialize(8)}]
    pack(ep, [result(b, value=9)])
    assert info(api, b)["state"] == "SUCCEEDED" and load(ep) == {}


def test_a_parked_task_whose_agent_died_running_it_is_sent_again(world):
    api, fid, ep = world
    a, b = submit(api, fid, ep, plain(1), dependent(["#0"], Input(0)))
    pack(ep, [result(a, value=1)], [update(b, "RUNNING")])
    assert info(api, b)["state"] == "RUNNING" and load(ep) == {"_": 1}
    store = deps.store()
    redis_client().zadd("leases", {b: time.time() - 1})  # its lease ran out: the agent is gone
    assert store.expire_leases()[:2] == (1, 0)
    assert info(api, b)["state"] == "QUEUED" and record(b)["pk"] == "1"
    # the queue redelivers the parked message; the new agent has no result of `a`: it hands b back
    pack(ep, updates=[update(b, "UNPARK")])
    assert len(sent_to(ep, b)) == 2 and load(ep) == {"_": 1}
    pack(ep, [result(b, value=2)])
    assert info(api, b)["state"] == "SUCCEEDED" and load(ep) == {}
    assert "pn" not in record(a)


def test_a_parked_task_out_of_retries_frees_its_inputs(world):
    api, fid, ep = world
    a, b = submit(api, fid, ep, plain(1), dict(dependent(["#0"], Input(0)), max_retries=0))
    pack(ep, [result(a, value=1)], [update(b, "RUNNING")])
    redis_client().zadd("leases", {b: time.time() - 1})
    assert deps.store().expire_leases()[:2] == (0, 1)
    assert info(api, b)["state"] == "FAILED"
    assert not {"pk", "wp", "dn"} & set(record(b)) and "pn" not in record(a) and load(ep) == {}


def test_a_failed_input_fails_its_parked_dependents(world):
    api, fid, ep = world
    a, b, c = submit(api, fid, ep, plain(1), dependent(["#0"], Input(0)), dependent(["#1"], Input(0)))
    pack(ep, [result(a, "FAILED", error="the-error")])
    for tid, failed in ((b, a), (c, b)):
        got = info(api, tid)
        assert got["state"] == "FAILED" and dependency_failure(got["reason"]) == (failed, "FAILED")
        assert not {"pk", "wp", "dn"} & set(record(tid))
    # the agent hands back what it held: nothing changes
    pack(ep, updates=[update(b, "UNPARK"), update(c, "UNPARK")])
    assert [info(api, t)["state"] for t in (b, c)] == ["FAILED", "FAILED"] and len(sends(ep)) == 3


def test_cancelling_a_parked_task_tells_its_agent_and_frees_its_inputs(world):
    api, fid, ep = world
    a, b = submit(api, fid, ep, plain(1), dependent(["#0"], Input(0)))
    assert api.call("DELETE", f"/tasks/{b}")[0] == 200
    assert info(api, b)["state"] == "CANCELLED" and not {"pk", "wp"} & set(record(b))
    assert "pn" not in record(a)
    control = open_queue(ep["control_queue"], consumer="agent")  # the agent holding it drops it
    assert [ControlMessage.model_validate_json(m.body).cancel for m in control.receive(10, 1)] == [[b]]
    pack(ep, [result(b, value=1)])  # it ran anyway, before the agent heard: the cancel stands
    assert info(api, b)["state"] == "CANCELLED" and load(ep) == {"_": 1}  # a alone, still queued


def test_an_agent_cannot_hand_back_another_endpoints_task(api, world):
    _, fid, ep = world
    other, _ = register(api, "other", [PARK_FEATURE])
    a, b = submit(api, fid, ep, plain(1), dependent(["#0"], Input(0)))
    pack(other, updates=[update(b, "UNPARK")])
    assert record(b)["pk"] == "1"
    assert dataflow.unpark(other["endpoint_id"], [b]) == 0


def test_a_multi_user_endpoints_dependents_are_not_parked(api, world):
    _, fid, _ = world
    status, ep = api.call("POST", "/endpoints", {"name": "site", "metadata": {"multi_user": True}})
    assert status in (200, 201)
    agent = Api(ep["agent_credential"])
    agent.call("POST", f"/endpoints/{ep['endpoint_id']}/heartbeat", {"stats": {}, "features": [PARK_FEATURE]})
    status, answer = api.call("POST", "/tasks", {"endpoint_id": ep["endpoint_id"], "tasks": [
        {"function_id": fid, **plain(1)}, {"function_id": fid, **dependent(["#0"], Input(0))}]})
    assert status == 202, answer
    assert "pk" not in record(answer["task_ids"][1])
