"""PBS (OpenPBS / PBS Professional): a generated script submitted with `qsub`, states from
`qstat -f -F json -x` (history included, so finished jobs keep their exit status), or from
plain `qstat` on servers without JSON output (older PBS Pro, Torque), and `qdel`.

qstat exit codes are PBS error numbers modulo 256: 153 is "Unknown Job Id" (15001) and 35
"Job has finished" (15139); both mean the job left the queue, not that qstat failed.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Literal, Optional

from endpoint_agent.providers.base import (
    BatchProvider, JobState, ProviderError, command_error, format_walltime, optional_directives, safe_job_name,
)

PBS_STATES: dict[str, JobState] = {
    "Q": JobState.PENDING,   # queued
    "H": JobState.PENDING,   # held
    "W": JobState.PENDING,   # waiting for its start time
    "T": JobState.PENDING,   # in transit
    "M": JobState.PENDING,   # moved to another server
    "S": JobState.PENDING,   # suspended (holds nodes, runs nothing)
    "U": JobState.PENDING,   # suspended: workstation busy
    "R": JobState.RUNNING,
    "E": JobState.RUNNING,   # exiting: still on its nodes
    "B": JobState.RUNNING,   # array job: begun
    "X": JobState.COMPLETED,  # subjob finished
    "F": JobState.COMPLETED,  # finished (history); the exit status refines it
    "C": JobState.COMPLETED,  # Torque: completed
}

_GONE = ("unknown job id", "job has finished", "does not exist")
_QDEL_DONE = ("job has finished", "unknown job id", "request invalid for state of job")
JOB_SUBSTATE_TERMINATED = 91  # deleted (qdel) before or while running


def job_state_from_json(job: dict[str, Any]) -> JobState:
    code = str(job.get("job_state", "")).strip().upper()
    state = PBS_STATES.get(code, JobState.UNKNOWN)
    if code == "F":
        exit_status = job.get("Exit_status")
        if job.get("substate") == JOB_SUBSTATE_TERMINATED:
            return JobState.CANCELLED
        if exit_status is not None and int(exit_status) != 0:
            return JobState.FAILED
    return state


def parse_qstat_json(text: str) -> dict[str, JobState]:
    """`qstat -f -F json` output -> {full job id: state}. ValueError when not JSON."""
    data = json.loads(text)
    jobs = data.get("Jobs") or {}
    return {jid: job_state_from_json(job) for jid, job in jobs.items()}


_PLAIN_ROW = re.compile(r"^(\S+)\s+.*\s([A-Z])\s+(\S+)\s*$")


def parse_qstat_plain(text: str) -> dict[str, JobState]:
    """Default `qstat` table -> {job id as printed (may end in '*' when truncated): state}."""
    out: dict[str, JobState] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith(("Job id", "Job ID", "---", " ")):
            continue
        m = _PLAIN_ROW.match(line.rstrip())
        if m:
            out[m.group(1)] = PBS_STATES.get(m.group(2), JobState.UNKNOWN)
    return out


def _same_job(wanted: str, printed: str) -> bool:
    """'1234.pbs-server' matches '1234.pbs-server', '1234.pbs-serv*' and '1234'."""
    if wanted == printed:
        return True
    if printed.endswith("*"):
        return wanted.startswith(printed[:-1])
    return wanted.split(".")[0] == printed.split(".")[0]


class PBSProvider(BatchProvider):
    label = "pbs"

    def __init__(self, *, queue: Optional[str] = None, account: Optional[str] = None,
                 cpus_per_node: Optional[int] = None, select_options: str = "", place: Optional[str] = "scatter",
                 status_format: Literal["auto", "json", "plain"] = "auto", **batch):
        super().__init__(**batch)  # BatchProvider's: script_dir, worker_init, scheduler_options, cmd_timeout, env
        self.queue = queue
        self.account = account
        self.cpus_per_node = cpus_per_node
        self.select_options = select_options.lstrip(":")
        self.place = place
        self.status_format = status_format

    def directives(self, nodes: int, walltime: float, job_name: str, out_base: Path) -> list[str]:
        select = f"{nodes}"
        if self.cpus_per_node:
            select += f":ncpus={self.cpus_per_node}"
        if self.select_options:
            select += f":{self.select_options}"
        # PBS job names: at most 15 characters on older servers, starting with a letter
        name = safe_job_name(job_name, 15)
        if not name[0].isalpha():
            name = ("s" + name)[:15]
        d = [f"#PBS -N {name}",
             f"#PBS -l select={select}",
             f"#PBS -l walltime={format_walltime(walltime)}",
             f"#PBS -o {out_base}.out",
             f"#PBS -e {out_base}.err"]
        return d + optional_directives(("#PBS -l place={}", self.place),
                                       ("#PBS -q {}", self.queue),
                                       ("#PBS -A {}", self.account))

    submit_command = ("qsub",)
    job_id_pattern = re.compile(r"\d+(\[\d*\])?(\.[\w.-]+)?")

    def status(self, job_ids: Iterable[str]) -> dict[str, JobState]:
        ids = [str(j) for j in job_ids]
        if not ids:
            return {}
        seen: Optional[dict[str, JobState]] = None
        if self.status_format in ("auto", "json"):
            seen = self._status_json(ids)
        if seen is None:
            seen = self._status_plain(ids)

        def said(jid: str) -> Optional[JobState]:
            state = next((s for printed, s in seen.items() if _same_job(jid, printed)), None)
            if state is not None and state.terminal and jid in self.cancelled:
                return JobState.CANCELLED
            return state

        return self.settle(ids, said)

    def _status_json(self, ids: list[str]) -> Optional[dict[str, JobState]]:
        """None when this qstat has no JSON output (auto mode then uses the plain table)."""
        argv = ["qstat", "-f", "-F", "json", "-x", *ids]
        p = self.run(argv, check=False)
        err = p.stderr.lower()
        if p.stdout.strip():
            try:
                return parse_qstat_json(p.stdout)
            except (ValueError, AttributeError, TypeError) as exc:
                # some PBS Pro versions print invalid JSON (unescaped variables): use the table
                if self.status_format == "json":
                    raise ProviderError(f"`{' '.join(argv)}` printed output that is not qstat JSON ({exc})",
                                        command=argv, returncode=p.returncode, stderr=p.stderr,
                                        stdout=p.stdout[:2000]) from None
                return None
        if p.returncode == 0 or any(g in err for g in _GONE):
            return {}
        if self.status_format == "auto" and ("invalid option" in err or "usage" in err or "illegal" in err):
            self.status_format = "plain"  # this qstat has no -F json / -x: remember it
            return None
        raise command_error(argv, p)

    def _status_plain(self, ids: list[str]) -> dict[str, JobState]:
        argv = ["qstat", *ids]
        p = self.run(argv, check=False)
        if p.returncode != 0 and not p.stdout.strip() and not any(g in p.stderr.lower() for g in _GONE):
            raise command_error(argv, p)
        return parse_qstat_plain(p.stdout)

    cancel_command = "qdel"
    already_done = _QDEL_DONE

    def mentions(self, job_id: str, line: str) -> bool:
        return job_id.lower() in line or job_id.split(".")[0] in line.split()
