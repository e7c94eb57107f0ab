"""The Slurm provider against a real single-node Slurm cluster (slurmctld, slurmd and munge
started by tests/agent/slurm_cluster.py; skipped only when the binaries are missing)."""
from __future__ import annotations

import time

import pytest

from endpoint_agent.launchers import SrunLauncher
from endpoint_agent.providers import JobState, ProviderError
from endpoint_agent.providers.slurm import SlurmProvider
from tests.agent.slurm_cluster import slurm_cluster  # noqa: F401 - the fixture


def wait_state(p: SlurmProvider, job: str, want: set[JobState], timeout: float = 30.0) -> list[JobState]:
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = p.status([job])[job]
        if not seen or seen[-1] != s:
            seen.append(s)
        if s in want:
            return seen
        time.sleep(0.2)
    raise AssertionError(f"job {job} never reached {want}; states seen {seen}")


def test_job_runs_and_completes(slurm_cluster, tmp_path):
    p = SlurmProvider(partition="debug", script_dir=tmp_path, exclusive=False,
                      worker_init=f"echo init-ran > {tmp_path}/init")
    out = tmp_path / "ran"
    cmd = SrunLauncher()(["bash", "-c", f"sleep 1; echo $SLURM_JOB_ID $SKYFN_BLOCK_NODES > {out}"], 1)
    job = p.submit(cmd, 1, 120, "skyfn-test-run")
    assert job.isdigit()
    seen = wait_state(p, job, {JobState.COMPLETED, JobState.FAILED})
    assert seen[-1] is JobState.COMPLETED, (seen, slurm_cluster.logs())
    assert set(seen) <= {JobState.PENDING, JobState.RUNNING, JobState.COMPLETED}
    assert (tmp_path / "init").read_text().strip() == "init-ran"
    assert out.read_text().split() == [job, "1"]  # it really ran, in that job, through srun


def test_failed_job(slurm_cluster, tmp_path):
    p = SlurmProvider(script_dir=tmp_path, exclusive=False)
    job = p.submit("exit 7", 1, 60, "skyfn-test-fail")
    assert wait_state(p, job, {JobState.COMPLETED, JobState.FAILED})[-1] is JobState.FAILED


def test_cancel_running_job(slurm_cluster, tmp_path):
    p = SlurmProvider(script_dir=tmp_path, exclusive=False)
    job = p.submit(f"touch {tmp_path}/started; exec sleep 300", 1, 600, "skyfn-test-cancel")
    wait_state(p, job, {JobState.RUNNING})
    assert p.cancel([job]) == {job: True}
    assert wait_state(p, job, {JobState.CANCELLED, JobState.COMPLETED, JobState.FAILED})[-1] is JobState.CANCELLED
    queue = slurm_cluster.run("squeue", "-h", "-o", "%i %t").stdout.split()
    assert job not in queue  # gone from the default (active) queue view
    assert p.cancel([job]) == {job: True}  # cancelling again is harmless


def test_pending_job_and_cancel_while_queued(slurm_cluster, tmp_path):
    p = SlurmProvider(script_dir=tmp_path, exclusive=False)
    held = p.submit("sleep 300", 1, 600, "skyfn-test-held")
    slurm_cluster.run("scontrol", "hold", held)
    try:
        assert p.status([held])[held] is JobState.PENDING
        assert p.cancel([held]) == {held: True}
        assert wait_state(p, held, {JobState.CANCELLED})[-1] is JobState.CANCELLED
    finally:
        slurm_cluster.run("scancel", held, check=False)


def test_job_that_left_squeue_and_scontrol(slurm_cluster, tmp_path):
    p = SlurmProvider(script_dir=tmp_path, exclusive=False)
    # an id Slurm never had: squeue fails for it, scontrol too: UNKNOWN, not an error
    assert p.status(["987654"]) == {"987654": JobState.UNKNOWN}
    # one we submitted and saw, then forgotten by Slurm (simulated): ended, COMPLETED
    p.last_known["987655"] = JobState.RUNNING
    assert p.status(["987655"]) == {"987655": JobState.COMPLETED}


def test_scheduler_errors_are_clear(slurm_cluster, tmp_path):
    p = SlurmProvider(partition="no-such-partition", script_dir=tmp_path)
    with pytest.raises(ProviderError) as e:
        p.submit("true", 1, 60, "skyfn-test-bad")
    msg = str(e.value)
    assert "sbatch --parsable" in msg and "exited with code 1" in msg and "invalid partition" in msg.lower()
    assert e.value.returncode == 1
    # more nodes than the cluster has: Slurm queues it for ever (a block stuck PENDING)
    p = SlurmProvider(script_dir=tmp_path, exclusive=False)
    job = p.submit("true", 50, 60, "skyfn-test-toomany")
    try:
        time.sleep(1)
        assert p.status([job])[job] is JobState.PENDING
    finally:
        assert p.cancel([job]) == {job: True}
