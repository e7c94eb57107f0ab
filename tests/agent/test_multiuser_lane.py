"""The user agent's lane wrappers (endpoint_agent/multiuser/lane.py) on real Redis streams:
results go out sealed (the service can verify them, a changed byte cannot), an audit copy of
each final result goes first with the task's function and identity from the pack it came in,
cancelled tasks the agent holds are copied CANCELLED, and the result itself never reaches
the audit stream."""
from __future__ import annotations

import json
import secrets

from endpoint_agent.multiuser.lane import LaneControl, LaneResults, LaneTasks, Ledger
from skyfn.protocol.lanes import is_sealed, open_envelope, verify
from skyfn.protocol.messages import ControlMessage, ResultPack, TaskResult
from skyfn.protocol.queues.redis_streams import RedisStreamQueue


def pack(task_ids, function_id="f1", identity="user-alice"):
    return json.dumps({"pack_id": "p1", "endpoint_id": "ep", "functions": {function_id: "body"},
                       "tasks": [{"task_id": t, "function_id": function_id, "payload": "x"} for t in task_ids],
                       "function_meta": {function_id: {"owner": identity, "name": "square"}},
                       "identity": {"id": identity, "email": "alice@example.org"}, "owner": identity}).encode()


def queues(redis_url, *names):
    out = [RedisStreamQueue(f"{n}-{secrets.token_hex(4)}", url=redis_url, consumer="t") for n in names]
    for q in out:
        q.ensure()
    return out


def test_results_are_sealed_and_audited(redis_url):
    tasks_q, results_q, audit_q = queues(redis_url, "tasks", "results", "audit")
    ledger = Ledger()
    key = secrets.token_hex(32)
    tasks = LaneTasks(tasks_q, ledger)
    results = LaneResults(results_q, lane="ab12cd34ef56ab78", mac_key=key, endpoint_id="ep-real", ledger=ledger,
                          audit=audit_q)
    tasks_q.send([pack(["t1", "t2"])])
    got = tasks.receive(max_messages=5)
    assert len(got) == 1
    body = ResultPack(endpoint_id="ep", results=[
        TaskResult(task_id="t1", state="SUCCEEDED", result="SECRET-VALUE",
                   events=[("RUNNING", 1.0), ("SUCCEEDED", 2.0)]),
        TaskResult(task_id="t2", state="FAILED", reason="boom", events=[("FAILED", 3.0)])]).model_dump_json().encode()
    results.send([body])

    sent = results_q.receive(max_messages=5)
    assert len(sent) == 1 and is_sealed(sent[0].body)
    lane, mac, inner = open_envelope(sent[0].body)
    assert lane == "ab12cd34ef56ab78" and verify(key, lane, inner, mac)
    assert ResultPack.model_validate_json(inner) == ResultPack.model_validate_json(body).model_copy(
        update={"endpoint_id": "ep-real"})
    assert not verify(key, lane, inner.replace(b"SECRET", b"SECRFT"), mac)
    assert not verify(secrets.token_hex(32), lane, inner, mac)

    copies = [c for m in audit_q.receive(max_messages=5) for c in json.loads(m.body)["audit"]]
    assert [(c["task_id"], c["function_id"], c["function_name"], c["identity_id"], c["state"], c["reason"])
            for c in copies] == [("t1", "f1", "square", "user-alice", "SUCCEEDED", None),
                                 ("t2", "f1", "square", "user-alice", "FAILED", "boom")]
    assert copies[0]["events"] == [["RUNNING", 1.0], ["SUCCEEDED", 2.0]]
    assert all("SECRET" not in json.dumps(c) for c in copies)


def test_progress_updates_are_not_audited(redis_url):
    results_q, audit_q = queues(redis_url, "results", "audit")
    results = LaneResults(results_q, lane="ab12cd34ef56ab78", mac_key=secrets.token_hex(32), endpoint_id="ep-real",
                          ledger=Ledger(),
                          audit=audit_q)
    results.send([b'{"endpoint_id":"ep","results":[],"updates":[{"task_id":"t1","state":"RUNNING","ts":1.0}]}'])
    assert audit_q.depth() == 0 and results_q.depth() == 1


def test_cancels_of_held_tasks_are_copied_once(redis_url):
    tasks_q, control_q, audit_q = queues(redis_url, "tasks", "control", "audit")
    ledger = Ledger()
    tasks_q.send([pack(["t1"])])
    LaneTasks(tasks_q, ledger).receive()
    control = LaneControl(control_q, ledger=ledger, audit=audit_q)
    control_q.send([ControlMessage(cancel=["t1", "not-mine"]).model_dump_json().encode()])
    control_q.send([ControlMessage(cancel=["t1"]).model_dump_json().encode()])
    assert len(control.receive(max_messages=5)) == 2  # the agent still gets every cancel
    copies = [c for m in audit_q.receive(max_messages=5) for c in json.loads(m.body)["audit"]]
    assert [(c["task_id"], c["state"], c["function_id"]) for c in copies] == [("t1", "CANCELLED", "f1")]
