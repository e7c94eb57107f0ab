"""Issue 3's required Slurm test, against the real private Slurm cluster: an agent with no
local managers and the slurm provider (min_blocks 0, max_blocks 1). Pending tasks -> a
block is submitted with sbatch -> its manager (started by srun in the job) connects to the
interchange over TCP with CurveZMQ -> tasks run and their results come back -> after
max_idletime the block is drained and its job cancelled, and squeue no longer lists it."""
from __future__ import annotations

import shlex
import threading
import time


from endpoint_agent.agent import Agent
from endpoint_agent.config import EndpointConfig
from endpoint_agent.paths import EndpointPaths
from endpoint_agent.providers import JobState
from endpoint_agent.scaling import (
    BlockManager, InterchangeAdapter, ScalingConfig, build_launcher, build_provider, node_prologue,
)
from tests.agent import fns
from tests.agent.slurm_cluster import slurm_cluster  # noqa: F401 - the fixture


def wait_for(pred, timeout, what, on_fail=lambda: ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{on_fail()}")


def test_blocks_submitted_managers_connect_tasks_run_scale_in_cancels(slurm_cluster, queues, home, tmp_path):
    cfg = EndpointConfig(managers=0, workers=2, encryption="on", task_queue=queues.task_desc,
                         results_queue=queues.results_desc, receive_wait=0.5, manager_heartbeat_period=1.0,
                         grace_period=3)
    agent = Agent("slurm-ep", cfg, endpoint_id="ep", paths=EndpointPaths("slurm-ep"), write_status_file=False)
    runner = threading.Thread(target=agent.run, name="agent", daemon=True)
    runner.start()
    ix = wait_for(lambda: agent.state == "running" and agent.interchange, 30, "the agent to run")
    assert ix.server_key, "CurveZMQ is on: managers must get the server key"

    scaling = ScalingConfig(provider="slurm", launcher="srun", min_blocks=0, max_blocks=1, init_blocks=0,
                            workers_per_node=2, max_idletime=3, strategy_period=0.5, walltime="00:10:00",
                            partition="debug", exclusive=False)
    provider = build_provider(scaling, script_dir=tmp_path / "blocks")
    cancels: list[list[str]] = []
    real_cancel = provider.cancel
    provider.cancel = lambda ids: (cancels.append(list(ids)), real_cancel(ids))[1]
    bm = BlockManager(scaling, provider, build_launcher(scaling), InterchangeAdapter(ix),
                      lambda bid: ix.manager_command(bid, 2), prologue=node_prologue(), name="skyfn-test")

    def debug():
        return f"blocks: {bm.status()}\nsnapshot: {ix.snapshot()}\n{slurm_cluster.logs(tail=15)}\n" + "\n".join(
            f"--- {f.name}\n{f.read_text()[-3000:]}" for f in sorted((tmp_path / "blocks").glob("*")) if f.is_file())

    bm.start()
    try:
        time.sleep(1.5)
        assert not bm.blocks, "no work, min_blocks 0: no block"
        ids = queues.push(fns.square, [(i,) for i in range(40)])
        (block_id,) = wait_for(lambda: list(bm.blocks) or None, 20, "a block to be submitted", debug)
        job_id = bm.blocks[block_id].job_id
        assert job_id and job_id.isdigit()
        script = next((tmp_path / "blocks").glob("*.submit")).read_text()
        assert "#SBATCH --partition=debug" in script and "exec srun --ntasks-per-node=1 -N 1" in script
        assert f"--block {block_id}" in script and f"--server-key {shlex.quote(ix.server_key)}" in script

        # the job's manager connects over TCP
        wait_for(lambda: ix.snapshot()["blocks"].get(block_id, {}).get("managers") == 1, 60,
                 "the block's manager to connect", debug)
        (mgr,) = [m for m in ix.snapshot()["managers"] if m["block"] == block_id]
        assert mgr["workers"] == 2 and not mgr["local"]
        results = queues.collect(ids, timeout=60)
        assert {t: r[0]["state"] for t, r in results.items()} == {t: "SUCCEEDED" for t in ids}
        assert len(bm.blocks) == 1, "max_blocks 1"
        st = slurm_cluster.run("squeue", "-h", "-j", job_id, "-o", "%t").stdout.strip()
        assert st == "R", f"the block's job runs while tasks run (squeue: {st!r})"

        # idle for max_idletime (3 s): drained, then its job cancelled
        wait_for(lambda: cancels, 30, "scale-in to cancel the job", debug)
        assert cancels == [[job_id]]
        wait_for(lambda: not bm.blocks, 30, "the block to be forgotten", debug)
        (done,) = bm.finished
        assert done.block_id == block_id and done.drain_started is not None
        assert done.state in (JobState.CANCELLED, JobState.COMPLETED)
        active = slurm_cluster.run("squeue", "-h", "-o", "%i").stdout.split()
        assert job_id not in active, "squeue still lists the cancelled block's job"
        assert not ix.snapshot()["blocks"].get(block_id, {}).get("managers")
        # nothing waits: no new block is submitted
        time.sleep(2)
        assert not bm.blocks and len(bm.finished) == 1
    finally:
        bm.stop()
        agent.stop()
        runner.join(30)
