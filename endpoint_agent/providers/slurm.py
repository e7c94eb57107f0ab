"""Slurm: a generated batch script submitted with `sbatch --parsable`, states from
`squeue`, jobs that already left squeue from `scontrol show job` (works without
accounting, for MinJobAge seconds), and `scancel`.

No sacct: many sites run without slurmdbd, and a job gone from both squeue and
scontrol is resolved by what we know (we cancelled it: CANCELLED; else it ended: COMPLETED).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Mapping, Optional

from endpoint_agent.providers.base import (
    BatchProvider, JobState, ProviderError, command_failed, format_walltime, safe_job_name,
)

# squeue's compact codes (%t) and the full names (scontrol JobState=, squeue %T)
SLURM_STATES: dict[str, JobState] = {
    "PD": JobState.PENDING, "PENDING": JobState.PENDING,
    "CF": JobState.PENDING, "CONFIGURING": JobState.PENDING,   # nodes booting
    "RQ": JobState.PENDING, "REQUEUED": JobState.PENDING,
    "RH": JobState.PENDING, "REQUEUE_HOLD": JobState.PENDING,
    "RF": JobState.PENDING, "REQUEUE_FED": JobState.PENDING,
    "RD": JobState.PENDING, "RESV_DEL_HOLD": JobState.PENDING,
    "S": JobState.PENDING, "SUSPENDED": JobState.PENDING,      # holds nodes but runs nothing
    "ST": JobState.PENDING, "STOPPED": JobState.PENDING,
    "R": JobState.RUNNING, "RUNNING": JobState.RUNNING,
    "CG": JobState.RUNNING, "COMPLETING": JobState.RUNNING,    # still releasing its nodes
    "SI": JobState.RUNNING, "SIGNALING": JobState.RUNNING,
    "SO": JobState.RUNNING, "STAGE_OUT": JobState.RUNNING,
    "RS": JobState.RUNNING, "RESIZING": JobState.RUNNING,
    "CD": JobState.COMPLETED, "COMPLETED": JobState.COMPLETED,
    "CA": JobState.CANCELLED, "CANCELLED": JobState.CANCELLED,
    "F": JobState.FAILED, "FAILED": JobState.FAILED,
    "TO": JobState.FAILED, "TIMEOUT": JobState.FAILED,
    "NF": JobState.FAILED, "NODE_FAIL": JobState.FAILED,
    "PR": JobState.FAILED, "PREEMPTED": JobState.FAILED,
    "BF": JobState.FAILED, "BOOT_FAIL": JobState.FAILED,
    "DL": JobState.FAILED, "DEADLINE": JobState.FAILED,
    "OOM": JobState.FAILED, "OUT_OF_MEMORY": JobState.FAILED,
    "RV": JobState.FAILED, "REVOKED": JobState.FAILED,
    "SE": JobState.FAILED, "SPECIAL_EXIT": JobState.FAILED,
}

_GONE = ("invalid job id", "unknown job", "does not exist")
_ALREADY_DONE = ("already completing or completed", "job/step already completed", "invalid job id")


def parse_state(code: str) -> JobState:
    code = code.strip().upper().split()[0] if code.strip() else ""
    # "CANCELLED by 0" (sacct-style) and "COMPLETING+" style suffixes
    code = code.rstrip("+")
    return SLURM_STATES.get(code, JobState.UNKNOWN)


def parse_squeue(text: str) -> dict[str, JobState]:
    """Lines of `squeue -h -o '%i %t'` -> {job id: state}."""
    out: dict[str, JobState] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            out[parts[0]] = parse_state(parts[1])
    return out


def parse_scontrol_state(text: str) -> Optional[JobState]:
    m = re.search(r"\bJobState=(\S+)", text)
    return parse_state(m.group(1)) if m else None


class SlurmProvider(BatchProvider):
    label = "slurm"

    def __init__(self, *, partition: Optional[str] = None, account: Optional[str] = None,
                 qos: Optional[str] = None, constraint: Optional[str] = None, exclusive: bool = True,
                 cores_per_node: Optional[int] = None, mem_per_node: Optional[str] = None,
                 script_dir=None, worker_init: str = "", scheduler_options: str = "",
                 cmd_timeout: float = 30.0, env: Optional[Mapping[str, str]] = None):
        super().__init__(script_dir=script_dir, worker_init=worker_init, scheduler_options=scheduler_options,
                         cmd_timeout=cmd_timeout, env=env)
        self.partition = partition
        self.account = account
        self.qos = qos
        self.constraint = constraint
        self.exclusive = exclusive
        self.cores_per_node = cores_per_node
        self.mem_per_node = mem_per_node

    def directives(self, nodes: int, walltime: float, job_name: str, out_base: Path) -> list[str]:
        d = [f"#SBATCH --job-name={safe_job_name(job_name)}",
             f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --time={format_walltime(walltime)}",
             f"#SBATCH --output={out_base}.out",
             f"#SBATCH --error={out_base}.err"]
        if self.partition:
            d.append(f"#SBATCH --partition={self.partition}")
        if self.account:
            d.append(f"#SBATCH --account={self.account}")
        if self.qos:
            d.append(f"#SBATCH --qos={self.qos}")
        if self.constraint:
            d.append(f"#SBATCH --constraint={self.constraint}")
        if self.cores_per_node:
            d.append(f"#SBATCH --cpus-per-task={self.cores_per_node}")
        if self.mem_per_node:
            d.append(f"#SBATCH --mem={self.mem_per_node}")
        if self.exclusive:
            d.append("#SBATCH --exclusive")
        return d

    def submit(self, command: str, nodes: int, walltime: float, job_name: str) -> str:
        script = self.write_script(command, nodes, walltime, job_name)
        p = self.run(["sbatch", "--parsable", str(script)])
        # --parsable prints "jobid" or "jobid;cluster"; warnings may precede it
        lines = [ln.strip() for ln in p.stdout.splitlines() if ln.strip()]
        job_id = lines[-1].split(";")[0] if lines else ""
        if not re.fullmatch(r"\d+(_\d+)?", job_id):
            raise ProviderError(f"`sbatch --parsable {script}` printed no job id: stdout {p.stdout.strip()!r}, "
                                f"stderr {p.stderr.strip()!r}", command=["sbatch", "--parsable", str(script)],
                                returncode=p.returncode, stderr=p.stderr, stdout=p.stdout)
        self.last_known[job_id] = JobState.PENDING
        return job_id

    def status(self, job_ids: Iterable[str]) -> dict[str, JobState]:
        ids = [str(j) for j in job_ids]
        if not ids:
            return {}
        argv = ["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i %t"]
        p = self.run(argv, check=False)
        if p.returncode != 0 and not any(g in p.stderr.lower() for g in _GONE):
            raise ProviderError(command_failed(argv, p.returncode, p.stderr, p.stdout), command=argv,
                                returncode=p.returncode, stderr=p.stderr, stdout=p.stdout)
        seen = parse_squeue(p.stdout) if p.returncode == 0 else {}
        out: dict[str, JobState] = {}
        for jid in ids:
            state = seen.get(jid)
            if state is None:
                state = self._scontrol_state(jid)
            if state is None:
                state = self._gone(jid)
            out[jid] = state
            if state is not JobState.UNKNOWN:
                self.last_known[jid] = state
        return out

    def _scontrol_state(self, job_id: str) -> Optional[JobState]:
        """The fallback for a job squeue no longer lists: None when Slurm forgot it."""
        argv = ["scontrol", "show", "job", "-o", job_id]
        p = self.run(argv, check=False)
        if p.returncode != 0:
            if any(g in p.stderr.lower() for g in _GONE):
                return None
            raise ProviderError(command_failed(argv, p.returncode, p.stderr, p.stdout), command=argv,
                                returncode=p.returncode, stderr=p.stderr, stdout=p.stdout)
        return parse_scontrol_state(p.stdout)

    cancel_command = "scancel"
    already_done = _ALREADY_DONE

    def mentions(self, job_id: str, line: str) -> bool:
        return re.search(rf"\b{re.escape(job_id.lower())}\b", line) is not None
