"""Local: blocks are process groups on this machine (a login node, a workstation, a test).

`submit` runs the command with bash in a new session, so one block is one process group:
`cancel` sends SIGTERM to the group, then SIGKILL after `kill_grace` seconds. Walltime is
enforced the same way (the block then ends FAILED). Job ids are "local-<pid>".
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterable, Mapping, Optional

from endpoint_agent.providers.base import JobState, Provider, ProviderError, safe_job_name

log = logging.getLogger("skyfn.agent.providers.local")


class _Job:
    def __init__(self, proc: subprocess.Popen, deadline: float):
        self.proc = proc
        self.deadline = deadline
        self.cancelled = False
        self.timed_out = False
        self.kill_at: Optional[float] = None


class LocalProvider(Provider):
    label = "local"
    remote = False

    def __init__(self, *, script_dir=None, worker_init: str = "", env: Optional[Mapping[str, str]] = None,
                 kill_grace: float = 10.0, max_jobs: int = 64):
        self.script_dir = Path(script_dir) if script_dir else Path(tempfile.mkdtemp(prefix="skyfn-local-"))
        self.worker_init = worker_init or ""
        self.env = dict(env) if env else None
        self.kill_grace = kill_grace
        self.max_jobs = max_jobs
        self.jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()

    def submit(self, command: str, nodes: int, walltime: float, job_name: str) -> str:
        self._reap()
        if sum(1 for j in self.jobs.values() if j.proc.poll() is None) >= self.max_jobs:
            raise ProviderError(f"local provider: {self.max_jobs} blocks already running on this machine")
        self.script_dir.mkdir(parents=True, exist_ok=True)
        name = safe_job_name(job_name)
        script = "#!/bin/bash\n"
        if self.worker_init.strip():
            script += "# worker_init\n" + self.worker_init.strip() + "\n"
        script += f"export SKYFN_BLOCK_NODES={nodes}\n{command}\n"
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{time.monotonic_ns() % 1_000_000:06d}"
        base = self.script_dir / f"{name}.{stamp}"
        path = Path(f"{base}.sh")
        path.write_text(script)
        path.chmod(0o700)
        env = None if self.env is None else {**os.environ, **self.env}
        try:
            with open(f"{base}.out", "ab") as out, open(f"{base}.err", "ab") as err:
                proc = subprocess.Popen(["/bin/bash", str(path)], stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                        env=env, start_new_session=True)
        except OSError as exc:
            raise ProviderError(f"local provider: cannot start `/bin/bash {path}`: {exc}") from None
        job_id = f"local-{proc.pid}"
        with self._lock:
            self.jobs[job_id] = _Job(proc, time.monotonic() + walltime)
        log.info("block %s started (%s)", job_id, path)
        return job_id

    def _signal(self, job: _Job, sig: int) -> None:
        try:
            os.killpg(job.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _reap(self) -> None:
        """Enforce walltimes and escalate SIGTERM to SIGKILL (called by every method)."""
        now = time.monotonic()
        with self._lock:
            for job in self.jobs.values():
                if job.proc.poll() is not None:
                    if job.kill_at is not None:  # the leader is gone; its group may not be
                        self._signal(job, signal.SIGKILL)
                        job.kill_at = None
                    continue
                if job.kill_at is None and now >= job.deadline:
                    job.timed_out = True
                    self._signal(job, signal.SIGTERM)
                    job.kill_at = now + self.kill_grace
                elif job.kill_at is not None and now >= job.kill_at:
                    self._signal(job, signal.SIGKILL)

    def _state(self, job: _Job) -> JobState:
        rc = job.proc.poll()
        if rc is None:
            return JobState.RUNNING
        if job.cancelled:
            return JobState.CANCELLED
        if job.timed_out or rc != 0:
            return JobState.FAILED
        return JobState.COMPLETED

    def status(self, job_ids: Iterable[str]) -> dict[str, JobState]:
        self._reap()
        out = {}
        for jid in job_ids:
            job = self.jobs.get(jid)
            out[jid] = self._state(job) if job else JobState.UNKNOWN
        return out

    def cancel(self, job_ids: Iterable[str]) -> dict[str, bool]:
        out = {}
        now = time.monotonic()
        for jid in job_ids:
            job = self.jobs.get(jid)
            if job is None:
                out[jid] = False
                continue
            if job.proc.poll() is None:
                job.cancelled = True
                self._signal(job, signal.SIGTERM)
                job.kill_at = now + self.kill_grace
            out[jid] = True
        self._reap()
        return out

    def wait(self, job_id: str, timeout: float) -> Optional[int]:
        """Test helper: wait for a block's leader process; its exit code or None."""
        job = self.jobs[job_id]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._reap()
            if job.proc.poll() is not None:
                return job.proc.returncode
            time.sleep(0.05)
        return None

    def close(self) -> None:
        """Kill every block still running (the agent is stopping)."""
        for job in self.jobs.values():
            if job.proc.poll() is None:
                self._signal(job, signal.SIGKILL)
                try:
                    job.proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
