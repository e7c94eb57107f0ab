"""Agent-level placement: the interchange places tasks on managers with an aAPP policy
(`placement_policy`), by the function tag carried in each TaskSpec. Real agent process,
three real local managers, real workers, real Redis streams."""
from __future__ import annotations

import textwrap

import pytest

from endpoint_agent.config import ConfigError, parse_config
from endpoint_agent.interchange import ManagerHandle
from endpoint_agent.interchange.placement import ManagerPlacement, parse_policy
from skyfn.protocol.messages import TaskPack, TaskSpec
from skyfn.protocol.serialize import deserialize, pack_args, serialize_function
from tests.agent import fns

POLICY = textwrap.dedent("""\
    spread:
      - workers: "*"
        affinity: "!spread"
    strict:
      - workers: "*"
        affinity: "!strict"
      - followup: fail
    init:
      - workers: "*"
        strategy: best_first
        affinity: "!query"
    query:
      - workers: "*"
        affinity: init
      - followup: fail
    """)


def push(queues, tag: str, calls: list[tuple], prefix: str) -> list[str]:
    fid = "whoami"
    specs = [TaskSpec(task_id=f"{prefix}{i}", function_id=fid, payload=pack_args(args, {}), tag=tag)
             for i, args in enumerate(calls)]
    pack = TaskPack(pack_id=f"{prefix}-pack", endpoint_id="ep", functions={fid: serialize_function(fns.whoami)},
                    tasks=specs)
    queues.send([pack.model_dump_json().encode()], [[s.task_id for s in specs]])
    return [s.task_id for s in specs]


def managers_by_pid(agent) -> dict[int, str]:
    st = agent.wait_status(lambda s: len(s.get("managers") or []) == 3
                           and all(len(m["worker_pids"]) == 2 for m in s["managers"]))
    return {pid: m["id"] for m in st["managers"] for pid in m["worker_pids"]}


@pytest.fixture
def agent(agent_factory):
    a = agent_factory(managers=3, workers=2, placement_policy=POLICY, manager_heartbeat_period=0.5)
    a.start(wait_workers=6)
    yield a
    a.terminate()


def test_anti_affinity_spreads_and_followup_default_or_fail(queues, agent):
    owner = managers_by_pid(agent)
    # three long `spread` tasks: each on its own manager (none may join another)
    ids = push(queues, "spread", [(i, 1.5) for i in range(3)], "s")
    queues.wait_running(ids)
    # a fourth has no spread-free manager: its followup (default) places it anyway
    extra = push(queues, "spread", [(9, 0.0)], "x")
    results = queues.collect(ids + extra, timeout=30)
    placed = [owner[deserialize(results[t][0]["result"])[1]] for t in ids]
    assert len(set(placed)) == 3
    assert results[extra[0]][0]["state"] == "SUCCEEDED"
    # `strict` has followup fail: the fourth is refused with the policy's reason
    strict = push(queues, "strict", [(i, 4.0) for i in range(3)], "k")
    queues.wait_running(strict)
    refused = push(queues, "strict", [(9, 0.0)], "r")
    got = queues.collect(strict + refused, timeout=30)
    assert len({owner[deserialize(got[t][0]["result"])[1]] for t in strict}) == 3
    (r,) = got[refused[0]]
    assert r["state"] == "FAILED"
    assert r["reason"].startswith("placement: no valid worker for tag 'strict': 'strict' block 1 (line 5): ")
    assert r["reason"].count("(anti-affinity !strict)") == 3 and r["reason"].endswith("(followup: fail)")


def test_directional_affinity_query_joins_init(queues, agent):
    owner = managers_by_pid(agent)
    lonely = push(queues, "query", [(0, 0.0)], "q0")
    (r,) = queues.collect(lonely, timeout=30)[lonely[0]]
    assert r["state"] == "FAILED" and "runs no 'init' function (affinity init)" in r["reason"]
    init = push(queues, "init", [(1, 5.0)], "i")  # outlives the queries, even on a busy machine
    queues.wait_running(init)
    queries = push(queues, "query", [(i, 0.3) for i in range(4)], "q")
    results = queues.collect(init + queries, timeout=30)
    init_mgr = owner[deserialize(results[init[0]][0]["result"])[1]]
    # every query ran beside init (its manager has 2 workers: they queue for the free one)
    assert {owner[deserialize(results[t][0]["result"])[1]] for t in queries} == {init_mgr}


def test_sync_mirrors_managers_and_warm_first_prefers_a_warm_container():
    """ManagerPlacement over real ManagerHandle objects: capacity, assigned tags and warm
    containers reach the engine; warm_first picks the manager with an idle warm one."""
    from endpoint_agent.task_record import T_ROUTE

    placement = ManagerPlacement(parse_policy("default:\n  - workers: '*'\n    strategy: warm_first\n"))
    a, b = ManagerHandle(b"mgr-a"), ManagerHandle(b"mgr-b")
    for m, warm in ((a, {}), (b, {"img": 1})):
        m.registered, m.workers, m.warm = True, 4, warm
    tasks = {1: [None] * 9, 2: [None] * 9}
    tasks[1][T_ROUTE] = ("img", 0, 0, "t")
    tasks[2][T_ROUTE] = ("img", 0, 0, None)
    a.assigned = {1, 2}
    placement.sync([a, b], tasks, T_ROUTE)
    assert placement.state.snapshot()["mgr-a"] == {"capacity": 4, "running": 2, "queued": 0, "tags": {"t": 1},
                                                   "warm": {}, "online": True}
    assert placement.scheduler.decide("t", container="img").worker == "mgr-b"
    assert placement.scheduler.decide("t", container="other").worker == "mgr-b"  # most free workers
    b.warm = {}
    b.assigned = {7, 8, 9}
    placement.sync([a, b], tasks, T_ROUTE)
    assert placement.scheduler.decide("t", container="img").worker == "mgr-a"
    placement.sync([b], tasks, T_ROUTE)  # a manager gone is gone from the state
    assert placement.state.names() == ["mgr-b"]


def test_a_bad_placement_policy_is_a_config_error_with_the_line():
    with pytest.raises(ConfigError) as info:
        parse_config({"placement_policy": "t:\n  - workers: '*'\n    strategy: fastest\n"}, "config.yaml")
    assert "placement_policy rejected: line 3: t[1].strategy: unknown strategy 'fastest'" in str(info.value)
    assert parse_config({"placement_policy": POLICY}, "config.yaml").placement_policy == POLICY
