"""Slurm: a generated batch script submitted with `sbatch --parsable`, states from
`squeue`, jobs that already left squeue from `scontrol show job` (works without
accounting, for MinJobAge seconds), and `scancel`.

No sacct: many sites run without slurmdbd, and a job gone from both squeue and
scontrol is resolved by what we know (we cancelled it: CANCELLED; else it ended: COMPLETED).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Optional

from endpoint_agent.providers.base import (
    BatchProvider, JobState, command_error, format_walltime, optional_directives, safe_job_name,
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
                 cores_per_node: Optional[int] = None, mem_per_node: Optional[str] = None, **batch):
        super().__init__(**batch)  # BatchProvider's: script_dir, worker_init, scheduler_options, cmd_timeout, env
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
        d += optional_directives(("#SBATCH --partition={}", self.partition),
                                 ("#SBATCH --account={}", self.account),
                                 ("#SBATCH --qos={}", self.qos),
                                 ("#SBATCH --constraint={}", self.constraint),
                                 ("#SBATCH --cpus-per-task={}", self.cores_per_node),
                                 ("#SBATCH --mem={}", self.mem_per_node))
        if self.exclusive:
            d.append("#SBATCH --exclusive")
        return d

    # --parsable prints "jobid" or "jobid;cluster"
    submit_command = ("sbatch", "--parsable")
    job_id_pattern = re.compile(r"\d+(_\d+)?")

    def job_id_of(self, last_line: str) -> str:
        return last_line.split(";")[0]

    def status(self, job_ids: Iterable[str]) -> dict[str, JobState]:
        ids = [str(j) for j in job_ids]
        if not ids:
            return {}
        argv = ["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i %t"]
        p = self.run(argv, check=False)
        if p.returncode != 0 and not any(g in p.stderr.lower() for g in _GONE):
            raise command_error(argv, p)
        seen = parse_squeue(p.stdout) if p.returncode == 0 else {}
        return self.settle(ids, lambda jid: seen[jid] if jid in seen else self._scontrol_state(jid))

    def _scontrol_state(self, job_id: str) -> Optional[JobState]:
        """The fallback for a job squeue no longer lists: None when Slurm forgot it."""
        argv = ["scontrol", "show", "job", "-o", job_id]
        p = self.run(argv, check=False)
        if p.returncode != 0:
            if any(g in p.stderr.lower() for g in _GONE):
                return None
            raise command_error(argv, p)
        return parse_scontrol_state(p.stdout)

    cancel_command = "scancel"
    already_done = _ALREADY_DONE

    def mentions(self, job_id: str, line: str) -> bool:
        return re.search(rf"\b{re.escape(job_id.lower())}\b", line) is not None
