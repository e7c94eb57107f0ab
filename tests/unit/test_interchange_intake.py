"""Intake (endpoint_agent/interchange/intake.py): task packs become pending tasks; cancels end them."""
from __future__ import annotations

import time

import pytest
import zmq

from endpoint_agent import wire
from endpoint_agent.interchange.intake import Intake
from endpoint_agent.interchange.results import ResultBatcher
from endpoint_agent.interchange.state import PLAIN
from endpoint_agent.task_record import T_ID, T_MGR, T_PACK, T_ROUTE
from skyfn.protocol.messages import TaskPack, TaskSpec
from tests.unit.agent_parts import make_state, recv_all, registered_manager

FID = "0f8fad5b-d9cb-469f-a165-70867728950e"
OTHER = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
NO_BODY = "6fa459ea-ee8a-3ca4-894e-db77e160355e"


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(0)


def _intake(st):
    return Intake(st.config, st.endpoint_id, ResultBatcher(st.config))


def _pack(specs, functions=None, **kw):
    return TaskPack(pack_id="p", endpoint_id="ep", functions={FID: "body"} if functions is None else functions,
                    tasks=[TaskSpec(**{"function_id": FID, "payload": "x", **s}) for s in specs], **kw)


def _deliver(st, receipt, pack):
    st.handoff.append((receipt, pack, 50.0))
    st.given += len(pack.tasks)


def test_plain_and_routed_tasks_are_keyed_recorded_and_pended(ctx):
    st = make_state(ctx)
    intake = _intake(st)
    _deliver(st, "r1", _pack([{"task_id": "a"}, {"task_id": "b", "container": "sci"},
                              {"task_id": "c", "resources": {"cores": 4, "gpus": 1}},
                              {"task_id": "d", "resources": {"cores": 1}}], owner="alice"))
    intake.ingest(st)
    assert (st.taken, st.received_packs, st.received_tasks, st.n_pending) == (4, 1, 4, 4)
    assert st.load() == 4 and st.functions == {FID: "body"}
    by_id = {t[T_ID]: (k, t) for k, t in st.tasks.items()}
    keys = [by_id[i][0] for i in "abcd"]
    assert keys == sorted(keys) and len(set(keys)) == 4          # keys grow in arrival order
    assert by_id["a"][1][T_ROUTE] == PLAIN and by_id["d"][1][T_ROUTE] == PLAIN   # one core is plain
    assert by_id["b"][1][T_ROUTE] == ("sci", 0, 0) and by_id["c"][1][T_ROUTE] == ("none", 4, 1)
    assert list(st.pending[PLAIN]) == [keys[0], keys[3]] and list(st.pending[("sci", 0, 0)]) == [keys[1]]
    seq = by_id["a"][1][T_PACK]
    assert st.packs[seq] == ["r1", 4, "alice"] and by_id["a"][1][T_MGR] is None


def test_refusals_fail_with_a_result_and_an_empty_pack_is_acked_at_once(ctx):
    st = make_state(ctx, allowed_functions=[FID, NO_BODY])
    intake = _intake(st)
    _deliver(st, "r-empty", _pack([]))
    _deliver(st, "r1", _pack([{"task_id": "ok"}, {"task_id": "no-body", "function_id": NO_BODY},
                              {"task_id": "globus", "stage_in": [{"collection": "c", "path": "/x"}]}]))
    pack = _pack([{"task_id": "refused", "function_id": OTHER}], functions={OTHER: "evil"})
    _deliver(st, "r2", pack)
    intake.ingest(st)
    got = {r["task_id"]: r["reason"] for r in intake.out.results}
    assert set(got) == {"no-body", "globus", "refused"}
    assert "was not in the task pack" in got["no-body"]
    assert "not in the allowed_functions" in got["refused"] and OTHER not in st.functions  # body not kept
    assert list(st.tasks.values())[0][T_ID] == "ok" and st.n_pending == 1
    assert intake.out.acks == ["r-empty", "r2"]                          # r1 still has "ok" running
    assert st.failed == 3 and intake.gate is not None and OTHER in intake.gate.logged


def test_a_cancel_before_arrival_drops_the_task_on_arrival(ctx):
    st = make_state(ctx)
    intake = _intake(st)
    intake.on_cancel(st, ["early"])
    assert "early" in intake.early_cancel
    _deliver(st, "r1", _pack([{"task_id": "early"}, {"task_id": "kept"}]))
    intake.ingest(st)
    assert [t[T_ID] for t in st.tasks.values()] == ["kept"] and st.cancelled == 1 and st.n_pending == 1
    assert intake.out.results == []     # a cancelled task has no result


def test_cancel_drops_a_pending_task_and_tells_the_manager_holding_one(ctx):
    st = make_state(ctx)
    intake = _intake(st)
    m, sock = registered_manager(st, ctx, "m1")
    _deliver(st, "r1", _pack([{"task_id": "queued"}, {"task_id": "dispatched"}, {"task_id": "other"}]))
    intake.ingest(st)
    k_disp = next(k for k, t in st.tasks.items() if t[T_ID] == "dispatched")
    st.pending[PLAIN].remove(k_disp)    # as dispatch does
    st.n_pending -= 1
    st.tasks[k_disp][T_MGR] = m.identity
    m.assigned.add(k_disp)
    intake.on_cancel(st, ["queued", "dispatched", "unknown"])
    assert [t[T_ID] for t in st.tasks.values()] == ["other"] and st.n_pending == 1 and st.cancelled == 2
    assert m.assigned == set() and "unknown" in intake.early_cancel
    msgs = recv_all(sock, 0.3)
    assert msgs == [[wire.CANCEL, wire.dumps([k_disp])]]
    # the pack is done when its last task ends, with or without a result
    intake.on_cancel(st, ["other"])
    assert intake.out.acks == ["r1"] and st.packs == {}


def test_early_cancels_expire(ctx):
    st = make_state(ctx)
    intake = _intake(st)
    intake.early_cancel["old"] = time.monotonic() - 1
    intake.on_cancel(st, ["new"])
    assert set(intake.early_cancel) == {"new"}
