"""Elastic scaling: the decision function (pure, deterministic), the config's errors, and the
BlockManager driven step by step with a fake provider and a fake interchange."""
from __future__ import annotations

import pytest

from endpoint_agent.launchers import SingleNodeLauncher, SrunLauncher
from endpoint_agent.providers import JobState, ProviderError
from endpoint_agent.scaling import (
    BlockInfo, BlockManager, Decision, Policy, ScalingConfig, ScalingConfigError, Snapshot, decide,
    manager_command, parse_scaling_config,
)

P = Policy(min_blocks=0, max_blocks=4, nodes_per_block=2, workers_per_node=4, parallelism=1.0, max_idletime=120)
R, Q = JobState.RUNNING, JobState.PENDING


def blk(bid, state=R, managers=2, workers=8, free=8, tasks=0, idle_since=0.0, draining=False):
    return BlockInfo(bid, state, managers, workers, free, tasks, idle_since, draining)


def snap(pending, *blocks, now=1000.0):
    return Snapshot(now, pending, tuple(blocks))


# --- scale out -----------------------------------------------------------------------------------
def test_nothing_to_do():
    assert decide(P, snap(0)) == Decision(reason="steady")


def test_first_block_for_pending_work():
    assert decide(P, snap(1)).start == 1
    assert decide(P, snap(8)).start == 1          # 8 slots per block
    assert decide(P, snap(9)).start == 2
    assert decide(P, snap(1000)).start == 4       # capped at max_blocks


def test_parallelism_covers_a_fraction_of_the_excess():
    half = Policy(0, 10, 1, 4, 0.5, 120)
    assert decide(half, snap(40)).start == 5      # ceil(40 * 0.5 / 4)
    zero = Policy(0, 10, 1, 4, 0.0, 120)
    assert decide(zero, snap(40)).start == 1      # never zero blocks for waiting work
    assert decide(zero, snap(40, blk("a", managers=1, workers=4, free=0, tasks=4, idle_since=None))).start == 0


def test_idle_capacity_absorbs_pending_work():
    # connected block with 8 free workers: 8 pending tasks fit, 9 do not
    assert decide(P, snap(8, blk("a", free=8))).start == 0
    assert decide(P, snap(9, blk("a", free=8))).start == 1


def test_pending_blocks_count_toward_capacity():
    queued = blk("q", state=Q, managers=0, workers=0, free=0, idle_since=990.0)
    assert decide(P, snap(8, queued)).start == 0       # the queued block will take them
    assert decide(P, snap(20, queued)).start == 2      # 12 beyond it: two more blocks
    # a half-connected block: 1 of 2 managers connected, 1 free worker + a node to come
    half = blk("h", managers=1, workers=4, free=1, tasks=3, idle_since=None)
    assert decide(P, snap(5, half)).start == 0
    assert decide(P, snap(6, half)).start == 1


def test_unknown_state_blocks_count_too():
    unknown = blk("u", state=JobState.UNKNOWN, managers=0, workers=0, free=0)
    assert decide(P, snap(8, unknown)).start == 0


def test_prefetched_backlog_is_demand():
    # tasks queued at managers behind busy workers count, as Parsl's outstanding tasks
    busy = blk("a", free=0, tasks=8 + 30, idle_since=None)
    assert decide(P, snap(0, busy)).start == 4 - 1  # 30 waiting -> 4 blocks wanted, 3 allowed


def test_max_blocks_respected():
    full = [blk(f"b{i}", free=0, tasks=8, idle_since=None) for i in range(4)]
    assert decide(P, snap(500, *full)).start == 0
    assert decide(Policy(0, 0, 1, 1), snap(10)).start == 0


def test_min_blocks_kept():
    p = Policy(min_blocks=2, max_blocks=4, nodes_per_block=1, workers_per_node=1)
    assert decide(p, snap(0)).start == 2
    assert decide(p, snap(0, blk("a"))).start == 1
    d = decide(p, snap(0, blk("a", idle_since=0), blk("b", idle_since=0)))
    assert d.start == 0 and d.stop == ()


def test_terminal_and_draining_blocks_do_not_count():
    gone = blk("g", state=JobState.COMPLETED, managers=0, workers=0, free=0)
    draining = blk("d", draining=True)
    assert decide(P, snap(4, gone, draining)).start == 1


# --- scale in --------------------------------------------------------------------------------------
def test_idle_block_stopped_after_max_idletime():
    assert decide(P, snap(0, blk("a", idle_since=881.0))).stop == ()          # idle 119 s
    d = decide(P, snap(0, blk("a", idle_since=880.0)))                         # idle 120 s
    assert d.stop == ("a",) and d.start == 0 and "idle" in d.reason


def test_never_stops_a_block_with_tasks():
    # idle_since is stale but the block holds a task: never stopped
    busy = blk("a", free=7, tasks=1, idle_since=0.0)
    assert decide(P, snap(0, busy)).stop == ()
    # even with min_blocks 0 and every other condition met
    assert decide(Policy(0, 1, 1, 1, 1.0, 0), snap(0, blk("b", workers=1, free=0, tasks=1, idle_since=0))).stop == ()


def test_no_scale_in_while_work_waits():
    idle = blk("a", idle_since=0.0)
    busy = blk("b", free=0, tasks=8, idle_since=None)
    assert decide(P, snap(3, idle, busy)).stop == ()


def test_scale_in_down_to_min_blocks_longest_idle_first():
    p = Policy(min_blocks=1, max_blocks=4, nodes_per_block=1, workers_per_node=1, max_idletime=60)
    blocks = [blk("a", idle_since=500.0), blk("b", idle_since=100.0), blk("c", idle_since=300.0)]
    assert decide(p, snap(0, *blocks)).stop == ("b", "c")


def test_queued_blocks_stopped_first_when_no_work():
    p = Policy(0, 4, 1, 1, 1.0, 60)
    queued = blk("q", state=Q, managers=0, workers=0, free=0, idle_since=900.0)
    connected = blk("c", idle_since=100.0)
    assert decide(p, snap(0, connected, queued)).stop == ("q", "c")


def test_decide_is_deterministic():
    blocks = [blk(f"b{i}", idle_since=float(i % 3)) for i in range(10)]
    p = Policy(2, 20, 1, 1, 1.0, 10)
    first = decide(p, snap(0, *blocks))
    assert all(decide(p, snap(0, *reversed(blocks))) == first for _ in range(5))
    assert first.stop == ("b0", "b3", "b6", "b9", "b1", "b4", "b7", "b2")


# --- config -----------------------------------------------------------------------------------------
def test_config_defaults_and_aliases():
    c = parse_scaling_config({})
    assert (c.provider, c.launcher_name, c.min_blocks, c.max_blocks, c.max_idletime) == ("local", "single", 0, 1, 120)
    c = parse_scaling_config({"provider": "slurm", "nodes_per_block": 4, "aggressiveness": 0.25,
                              "walltime": "02:00:00", "queue": "debug"})
    assert c.launcher_name == "srun" and c.parallelism == 0.25 and c.walltime == 7200
    assert parse_scaling_config({"provider": "pbs", "nodes_per_block": 2}).launcher_name == "mpiexec"


@pytest.mark.parametrize("data,key,value,allowed", [
    ({"provider": "sge"}, "provider", "'sge'", "local, slurm, pbs"),
    ({"parallelism": 1.5}, "parallelism", "1.5", "from 0 to 1"),
    ({"max_blocks": -1}, "max_blocks", "-1", "from 0 to 10000"),
    ({"walltime": "25:61:00"}, "walltime", "'25:61:00'", "HH:MM:SS"),
    ({"launcher": "aprun"}, "launcher", "'aprun'", "single, srun, mpiexec"),
    ({"min_blocks": 3, "max_blocks": 2}, "min_blocks", "3", "0 to max_blocks"),
    ({"provider": "pbs", "launcher": "srun"}, "launcher", "'srun'", "single, mpiexec"),
    ({"provider": "slurm", "nodes_per_block": 2, "launcher": "single"}, "launcher", "'single'", "srun"),
    ({"nodes_per_block": 2}, "nodes_per_block", "2", "1"),
])
def test_config_errors_name_key_value_allowed(data, key, value, allowed):
    with pytest.raises(ScalingConfigError) as e:
        parse_scaling_config(data, "config.yaml")
    msg = str(e.value)
    assert "config.yaml" in msg and f"'{key}'" in msg and value in msg and allowed in msg, msg


def test_config_unknown_key():
    with pytest.raises(ScalingConfigError, match="unknown key 'max_block'.*allowed keys: provider"):
        parse_scaling_config({"max_block": 2})


# --- BlockManager ---------------------------------------------------------------------------------
class FakeProvider:
    label = "fake"

    def __init__(self):
        self.jobs: dict[str, JobState] = {}
        self.submitted: list[tuple[str, int, float, str]] = []
        self.cancelled: list[str] = []
        self.fail_submit = False
        self.fail_status = False

    def submit(self, command, nodes, walltime, job_name):
        if self.fail_submit:
            raise ProviderError("`sbatch --parsable x` exited with code 1: sbatch: error: QOSMaxSubmitJobPerUserLimit")
        jid = str(100 + len(self.submitted))
        self.submitted.append((command, nodes, walltime, job_name))
        self.jobs[jid] = JobState.PENDING
        return jid

    def status(self, ids):
        if self.fail_status:
            raise ProviderError("`squeue ...` exited with code 1: slurm_load_jobs error: Socket timed out")
        return {j: self.jobs.get(j, JobState.UNKNOWN) for j in ids}

    def cancel(self, ids):
        for j in ids:
            self.cancelled.append(j)
            self.jobs[j] = JobState.CANCELLED
        return {j: True for j in ids}

    def close(self):
        pass


class FakeInterchange:
    def __init__(self):
        self.pending = 0
        self.blocks: dict[str, dict] = {}
        self.drained: list[str] = []

    def block_snapshot(self):
        return {"pending": self.pending, "blocks": {k: dict(v) for k, v in self.blocks.items()}}

    def drain_block(self, block_id):
        self.drained.append(block_id)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def make_bm(**cfg):
    config = ScalingConfig(**{"provider": "slurm", "max_blocks": 2, "max_idletime": 60, "workers_per_node": 2, **cfg})
    prov, ix, clock = FakeProvider(), FakeInterchange(), Clock()
    bm = BlockManager(config, prov, SrunLauncher() if config.launcher_name == "srun" else SingleNodeLauncher(), ix,
                      lambda bid: manager_command("tcp://10.0.0.1:5000", bid, 2, python="python3"),
                      prologue="export PYTHONPATH=/src", name="skyfn-ep", clock=clock)
    return bm, prov, ix, clock


def test_block_lifecycle_out_and_in():
    bm, prov, ix, clock = make_bm()
    assert bm.step().start == 0 and not prov.submitted
    ix.pending = 3
    d = bm.step()
    assert d.start == 2  # 3 tasks, 2 slots per block
    (cmd, nodes, walltime, name), _ = prov.submitted
    bid = name.removeprefix("skyfn-ep-")
    assert cmd == ("export PYTHONPATH=/src\nexec python3 -m endpoint_agent.manager "
                   f"--interchange tcp://10.0.0.1:5000 --block {bid} --workers 2")
    assert nodes == 1 and walltime == 3600
    # the blocks are still queued: no more submissions however long it takes
    clock.t += 30
    assert bm.step().start == 0 and len(prov.submitted) == 2
    # they start, managers connect, tasks run
    ids = list(bm.blocks)
    for jid in prov.jobs:
        prov.jobs[jid] = JobState.RUNNING
    ix.pending = 0
    ix.blocks = {ids[0]: {"managers": 1, "workers": 2, "free": 0, "tasks": 2, "last_busy": clock.t},
                 ids[1]: {"managers": 1, "workers": 2, "free": 1, "tasks": 1, "last_busy": clock.t}}
    bm.step()
    assert [b["state"] for b in bm.status()["blocks"]] == ["RUNNING", "RUNNING"]
    # work done; idle, but not yet for max_idletime
    ix.blocks = {k: {**v, "free": 2, "tasks": 0} for k, v in ix.blocks.items()}
    clock.t += 1
    bm.step()
    clock.t += 58.5  # idle since last_busy (1030): 59.5 s
    assert bm.step().stop == ()
    # a short task ran on block 1 between two rounds: its idle clock restarts
    ix.blocks[ids[1]]["last_busy"] = clock.t
    clock.t += 0.5
    d = bm.step()
    assert d.stop == (ids[0],) and ix.drained == [ids[0]]
    assert prov.cancelled == []  # its manager is still connected: drain first
    ix.blocks.pop(ids[0])        # the manager said BYE and left
    bm.step()
    assert prov.cancelled == ["100"]
    bm.step()                    # the job is CANCELLED and has no manager: forgotten
    assert list(bm.blocks) == [ids[1]]
    clock.t += 60
    assert bm.step().stop == (ids[1],)


def test_block_with_tasks_is_never_cancelled():
    bm, prov, ix, clock = make_bm(max_idletime=0)
    ix.pending = 1
    bm.step()
    (bid,) = bm.blocks
    prov.jobs["100"] = JobState.RUNNING
    ix.pending = 0
    ix.blocks = {bid: {"managers": 1, "workers": 2, "free": 1, "tasks": 1, "last_busy": clock.t}}
    for _ in range(10):
        clock.t += 1000
        assert bm.step().stop == ()
    assert ix.drained == [] and prov.cancelled == []


def test_scheduler_errors_do_not_crash_and_back_off():
    bm, prov, ix, clock = make_bm()
    prov.fail_submit = True
    ix.pending = 1
    bm.step()
    assert "QOSMaxSubmitJobPerUserLimit" in bm.status()["last_error"] and not bm.blocks
    prov.fail_submit = False
    clock.t += 1
    bm.step()
    assert not bm.blocks          # backing off (5 s)
    clock.t += 5
    bm.step()
    assert len(bm.blocks) == 1
    prov.fail_status = True
    clock.t += 1
    bm.step()                     # status unavailable: logged, state kept
    assert "Socket timed out" in bm.status()["last_error"]


def test_block_that_dies_before_connecting_backs_off():
    bm, prov, ix, clock = make_bm(max_blocks=1)
    ix.pending = 1
    bm.step()
    prov.jobs["100"] = JobState.FAILED
    clock.t += 1
    bm.step()
    assert not bm.blocks and "before any manager connected" in bm.status()["last_error"]
    clock.t += 1
    bm.step()
    assert len(prov.submitted) == 1   # not resubmitted at once
    clock.t += 10
    bm.step()
    assert len(prov.submitted) == 2


def test_init_and_min_blocks_and_stop_cancels_all():
    bm, prov, ix, clock = make_bm(min_blocks=1, init_blocks=2, max_blocks=3)
    bm.step()
    assert len(prov.submitted) == 2
    for _ in range(3):
        clock.t += 100
        bm.step()
    # both queued blocks idle past max_idletime: one is stopped, min_blocks keeps the other
    assert len(ix.drained) == 1 and len(prov.cancelled) == 1
    bm.stop()
    assert sorted(prov.cancelled) == ["100", "101"]


def test_idle_clock_of_a_block_starts_when_it_connects():
    # queued for longer than max_idletime, then its manager connects and runs short tasks
    # between two rounds: it must not be stopped at once
    bm, prov, ix, clock = make_bm(max_idletime=3, max_blocks=1)
    ix.pending = 40
    bm.step()
    (bid,) = bm.blocks
    ix.pending = 0
    clock.t += 10
    prov.jobs["100"] = JobState.RUNNING
    ix.blocks = {bid: {"managers": 1, "workers": 2, "free": 2, "tasks": 0, "last_busy": None}}
    assert bm.step().stop == ()
    clock.t += 3
    assert bm.step().stop == (bid,)
