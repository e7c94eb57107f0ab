"""Issue 15 in the agent: the aAPP paper's Figure 3 script, in the paper's layout (followup
beside the tag), as an endpoint config's `placement_policy` — read from config.yaml as a
user writes it, then placing tasks on real managers as the paper describes."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from endpoint_agent.config import ConfigError, load_config
from endpoint_agent.interchange import ManagerHandle
from endpoint_agent.interchange.placement import ManagerPlacement, parse_policy
from endpoint_agent.task_record import T_ROUTE
from skyfn.protocol.messages import TaskPack, TaskSpec
from skyfn.protocol.serialize import deserialize, pack_args, serialize_function
from tests.agent import fns

FIGURE_3 = (Path(__file__).parents[1] / "unit" / "aapp_figure3.yaml").read_text()


def config_file(tmp_path: Path, policy: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text("managers: 3\nworkers: 2\nplacement_policy: |\n" + textwrap.indent(policy, "  "))
    return path


def test_figure_3_in_config_yaml_loads_and_places_managers_as_the_paper_describes(tmp_path):
    cfg = load_config(config_file(tmp_path, FIGURE_3))
    assert cfg.placement_policy == FIGURE_3
    placement = ManagerPlacement(parse_policy(cfg.placement_policy), seed=1)
    assert {n: tp.followup for n, tp in placement.policy.tags.items()} == \
        {"divide": "fail", "impera": "fail", "heavy": "fail"}
    mgrs = [ManagerHandle(name.encode()) for name in ("m1", "m2", "m3")]
    for m in mgrs:
        m.registered, m.workers = True, 2
    tasks: dict[int, list] = {}

    def run(manager: ManagerHandle, tag: str) -> None:
        key = len(tasks) + 1
        tasks[key] = [None] * 9
        tasks[key][T_ROUTE] = ("", 0, 0, tag)
        manager.assigned = set(manager.assigned) | {key}

    run(mgrs[0], "heavy")
    placement.sync(mgrs, tasks, T_ROUTE)
    s = placement.scheduler
    assert {s.decide("impera").worker for _ in range(30)} == {"m2", "m3"}      # never beside heavy
    assert s.decide("divide").block == 2                                        # no impera yet: block 2
    run(mgrs[2], "impera")
    placement.sync(mgrs, tasks, T_ROUTE)
    assert {s.decide("divide").worker for _ in range(20)} == {"m3"}           # joins impera
    run(mgrs[2], "divide")                                                      # m3 now full (2 workers)
    placement.sync(mgrs, tasks, T_ROUTE)
    d = s.decide("divide")
    assert (d.worker, d.block) == ("m2", 2) and d.transient is False            # m3 full: block 2, no heavy
    assert s.decide("heavy").worker in {"m1", "m2"}                            # away from divide and impera
    run(mgrs[1], "heavy")
    placement.sync(mgrs, tasks, T_ROUTE)
    d = s.decide("divide")
    assert d.worker is None and d.reason.endswith("(followup: fail)")
    assert "'divide' block 2 (line 8): m1 runs 1 'heavy' function(s) (anti-affinity !heavy)" in d.reason


def test_figure_3_errors_in_config_yaml_name_the_policy_line(tmp_path):
    broken = FIGURE_3.replace("  followup: fail\n- impera:", "  followup: later\n- impera:", 1)
    with pytest.raises(ConfigError) as info:
        load_config(config_file(tmp_path, broken))
    assert "placement_policy rejected: line 10: divide.followup: bad followup 'later': use 'default' or 'fail'" \
        in str(info.value)
    unclosed = FIGURE_3.replace("affinity: impera, !heavy", "affinity: [impera, !heavy", 1)
    with pytest.raises(ConfigError) as info:
        load_config(config_file(tmp_path, unclosed))
    assert "placement_policy rejected: line 7: not valid YAML: the '[' opened on line 7 is never closed" \
        in str(info.value)


def push(queues, tag: str, calls: list[tuple], prefix: str) -> list[str]:
    fid = "whoami"
    specs = [TaskSpec(task_id=f"{prefix}{i}", function_id=fid, payload=pack_args(args, {}), tag=tag)
             for i, args in enumerate(calls)]
    pack = TaskPack(pack_id=f"{prefix}-pack", endpoint_id="ep", functions={fid: serialize_function(fns.whoami)},
                    tasks=specs)
    queues.send([pack.model_dump_json().encode()], [[s.task_id for s in specs]])
    return [s.task_id for s in specs]


def test_figure_3_on_a_real_agent(queues, agent_factory):
    agent = agent_factory(managers=3, workers=2, placement_policy=FIGURE_3, manager_heartbeat_period=0.5)
    agent.start(wait_workers=6)
    try:
        st = agent.wait_status(lambda s: len(s.get("managers") or []) == 3
                               and all(len(m["worker_pids"]) == 2 for m in s["managers"]))
        owner = {pid: m["id"] for m in st["managers"] for pid in m["worker_pids"]}
        heavy = push(queues, "heavy", [(0, 8.0)], "h")
        queues.wait_running(heavy)
        impera = push(queues, "impera", [(1, 8.0)], "i")
        queues.wait_running(impera)
        divide = push(queues, "divide", [(2, 0.2)], "d")
        late = push(queues, "heavy", [(3, 0.0)], "l")
        results = queues.collect(heavy + impera + divide + late, timeout=40)
        where = {t: owner[deserialize(results[t][0]["result"])[1]] for t in heavy + impera + divide + late}
        assert where[impera[0]] != where[heavy[0]]          # impera: !heavy
        assert where[divide[0]] == where[impera[0]]         # divide: impera, !heavy
        assert where[late[0]] != where[impera[0]]           # heavy: !divide, !impera
    finally:
        agent.terminate()
