"""Providers and launchers without a scheduler: launcher lines (exact), walltimes,
Slurm output parsing and scripts, command errors, the local provider with real processes."""
from __future__ import annotations

import os
import shlex
import sys
import time

import pytest

from endpoint_agent.launchers import MpiexecLauncher, SingleNodeLauncher, SrunLauncher, make_launcher
from endpoint_agent.providers import JobState, ProviderError, make_provider, run_command
from endpoint_agent.providers.base import format_walltime, parse_walltime
from endpoint_agent.providers.slurm import SlurmProvider, parse_scontrol_state, parse_squeue, parse_state

CMD = ["/opt/venv/bin/python", "-m", "endpoint_agent.manager", "--interchange", "tcp://login1:55001",
       "--block", "b1.ab12", "--workers", "8"]
CMD_LINE = ("/opt/venv/bin/python -m endpoint_agent.manager --interchange tcp://login1:55001 "
            "--block b1.ab12 --workers 8")


# --- launchers ---------------------------------------------------------------------------------
def test_single_node_launcher_exact():
    assert SingleNodeLauncher()(CMD, 1) == f"exec {CMD_LINE}"
    assert SingleNodeLauncher("numactl --interleave=all")(CMD, 1) == f"exec numactl --interleave=all {CMD_LINE}"
    with pytest.raises(ValueError, match="srun"):
        SingleNodeLauncher()(CMD, 2)


def test_srun_launcher_exact():
    assert SrunLauncher()(CMD, 4) == f"exec srun --ntasks-per-node=1 -N 4 {CMD_LINE}"
    assert SrunLauncher("--cpu-bind=none --mpi=none")(CMD, 2) == \
        f"exec srun --ntasks-per-node=1 -N 2 --cpu-bind=none --mpi=none {CMD_LINE}"


def test_mpiexec_launcher_exact():
    assert MpiexecLauncher()(CMD, 3) == f"exec mpiexec -n 3 -ppn 1 {CMD_LINE}"
    assert MpiexecLauncher("--hostfile $PBS_NODEFILE")(CMD, 2) == \
        f"exec mpiexec -n 2 -ppn 1 --hostfile $PBS_NODEFILE {CMD_LINE}"


def test_launcher_quotes_arguments():
    cmd = ["python", "-m", "endpoint_agent.manager", "--server-key", "a b&c'd", "--block", "x;rm -rf /"]
    line = SrunLauncher()(cmd, 1)
    assert shlex.split(line)[5:] == cmd
    with pytest.raises(ValueError, match="positive"):
        SrunLauncher()(cmd, 0)
    with pytest.raises(ValueError, match="allowed: single, srun, mpiexec"):
        make_launcher("aprun")


# --- walltimes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("text,seconds", [("01:00:00", 3600), ("1-02:03:04", 93784), ("10:00", 600),
                                          (90, 90), ("45", 45), ("48:00:00", 172800)])
def test_parse_walltime(text, seconds):
    assert parse_walltime(text) == seconds


@pytest.mark.parametrize("bad", ["1:60:00", "abc", "", 0, -5, "00:00:00", True])
def test_parse_walltime_rejects(bad):
    with pytest.raises(ValueError):
        parse_walltime(bad)


def test_format_walltime():
    assert format_walltime(3600) == "01:00:00"
    assert format_walltime(93784) == "26:03:04"
    assert format_walltime(0.2) == "00:00:01"


# --- Slurm parsing and scripts -----------------------------------------------------------------
def test_slurm_states():
    text = "101 PD\n102 R\n103 CG\n104 CD\n105 CA\n106 F\n107 TO\n108 NF\n109 CF\n110 XX\n"
    assert parse_squeue(text) == {
        "101": JobState.PENDING, "102": JobState.RUNNING, "103": JobState.RUNNING, "104": JobState.COMPLETED,
        "105": JobState.CANCELLED, "106": JobState.FAILED, "107": JobState.FAILED, "108": JobState.FAILED,
        "109": JobState.PENDING, "110": JobState.UNKNOWN}
    assert parse_state("CANCELLED by 0") is JobState.CANCELLED
    assert parse_scontrol_state("JobId=7 JobName=x JobState=TIMEOUT Reason=TimeLimit") is JobState.FAILED
    assert parse_scontrol_state("garbage") is None


def test_slurm_script(tmp_path):
    p = SlurmProvider(partition="debug", account="proj42", qos="high", script_dir=tmp_path,
                      worker_init="module load python/3.11\nsource ~/venv/bin/activate",
                      scheduler_options="#SBATCH --gres=gpu:4\n#SBATCH --constraint=a100")
    path = p.write_script("exec srun --ntasks-per-node=1 -N 2 python -m endpoint_agent.manager", 2, 5400,
                          "skyfn-ep-b1.ab12")
    text = path.read_text()
    base = str(path)[:-len(".submit")]
    assert text.splitlines()[:12] == [
        "#!/bin/bash",
        "#SBATCH --job-name=skyfn-ep-b1.ab12",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --time=01:30:00",
        f"#SBATCH --output={base}.out",
        f"#SBATCH --error={base}.err",
        "#SBATCH --partition=debug",
        "#SBATCH --account=proj42",
        "#SBATCH --qos=high",
        "#SBATCH --exclusive",
        "#SBATCH --gres=gpu:4",
    ]
    body = text.split("#SBATCH --constraint=a100\n", 1)[1]
    assert body.index("module load python/3.11") < body.index("exec srun --ntasks-per-node=1 -N 2")
    assert os.access(path, os.X_OK)


# --- command errors -----------------------------------------------------------------------------
def test_run_command_errors_name_command_code_stderr():
    with pytest.raises(ProviderError) as e:
        run_command([sys.executable, "-c", "import sys; sys.stderr.write('sbatch: error: Invalid account'); sys.exit(1)"])
    msg = str(e.value)
    assert "exited with code 1" in msg and "Invalid account" in msg and sys.executable in msg
    assert e.value.returncode == 1 and "Invalid account" in e.value.stderr
    with pytest.raises(ProviderError, match="sbatch-does-not-exist not found on PATH"):
        run_command(["sbatch-does-not-exist", "x"])
    with pytest.raises(ProviderError, match="did not answer within 0.2 s"):
        run_command(["sleep", "5"], timeout=0.2)


def test_slurm_provider_without_slurm_raises_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    p = SlurmProvider(script_dir=tmp_path)
    with pytest.raises(ProviderError, match="sbatch not found on PATH"):
        p.submit("true", 1, 60, "x")


def test_make_provider():
    with pytest.raises(ValueError, match="allowed: local, slurm, pbs"):
        make_provider("lsf")
    assert make_provider("slurm", partition=None).partition is None


# --- local provider -----------------------------------------------------------------------------
def test_local_provider_runs_blocks(tmp_path):
    p = make_provider("local", script_dir=tmp_path, worker_init="export GREETING=hello", kill_grace=1)
    try:
        ok = p.submit(f"echo $GREETING $SKYFN_BLOCK_NODES > {tmp_path}/ran", 1, 60, "skyfn-b1")
        bad = p.submit("exit 3", 1, 60, "skyfn-b2")
        assert p.wait(ok, 10) == 0 and p.wait(bad, 10) == 3
        assert (tmp_path / "ran").read_text().strip() == "hello 1"
        assert p.status([ok, bad, "local-0"]) == {ok: JobState.COMPLETED, bad: JobState.FAILED,
                                                  "local-0": JobState.UNKNOWN}
    finally:
        p.close()


def test_local_provider_cancel_kills_the_process_group(tmp_path):
    p = make_provider("local", script_dir=tmp_path, kill_grace=1)
    try:
        # a child that ignores SIGTERM: the group gets SIGKILL after kill_grace
        job = p.submit(f"{sys.executable} -c \"import signal,time,os; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                       f"open('{tmp_path}/pid','w').write(str(os.getpid())); time.sleep(60)\" & wait", 1, 60, "b")
        deadline = time.time() + 10
        while not (tmp_path / "pid").exists() and time.time() < deadline:
            time.sleep(0.05)
        child = int((tmp_path / "pid").read_text())
        assert p.status([job])[job] is JobState.RUNNING
        assert p.cancel([job]) == {job: True}
        p.wait(job, 10)
        deadline = time.time() + 10
        while time.time() < deadline:
            p.status([job])
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the SIGTERM-ignoring child survived the cancel")
        assert p.status([job])[job] is JobState.CANCELLED
    finally:
        p.close()


def test_local_provider_walltime(tmp_path):
    p = make_provider("local", script_dir=tmp_path, kill_grace=1)
    try:
        job = p.submit("sleep 30", 1, 0.5, "b")
        deadline = time.time() + 10
        while p.status([job])[job] is JobState.RUNNING and time.time() < deadline:
            time.sleep(0.1)
        assert p.status([job])[job] is JobState.FAILED
    finally:
        p.close()
