"""What every provider shares: job states, the provider interface, scheduler command runs,
and the batch-scheduler base (script rendering, submit, status bookkeeping, cancel) that
Slurm and PBS fill in with their directives, commands and parsers.

A provider gets nodes: `submit(command, nodes, walltime, job_name)` asks for `nodes` nodes
for `walltime` seconds and runs the shell `command` (a launcher's output: it starts one
manager per node) once on the first of them; it returns the scheduler's job id.
`status(job_ids)` maps ids to JobState, `cancel(job_ids)` ends jobs. Scheduler commands
that fail raise ProviderError naming the command, its exit code and its stderr; the
block manager logs it and retries later, so a scheduler hiccup never ends the agent.
"""
from __future__ import annotations

import enum
import logging
import os
import re
import shlex
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional

log = logging.getLogger("skyfn.agent.providers")

DEFAULT_CMD_TIMEOUT_S = 30.0


class JobState(str, enum.Enum):
    PENDING = "PENDING"      # queued, held, starting: no node yet
    RUNNING = "RUNNING"      # nodes allocated, the script runs
    COMPLETED = "COMPLETED"  # ended by itself with exit code 0 (or left the scheduler unnoticed)
    FAILED = "FAILED"        # ended with an error, a node failure or its walltime
    CANCELLED = "CANCELLED"  # cancelled (by us or an administrator)
    UNKNOWN = "UNKNOWN"      # the scheduler cannot tell (yet)

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    def __str__(self) -> str:  # log lines read "RUNNING", not "JobState.RUNNING"
        return self.value


TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})


class ProviderError(Exception):
    """A scheduler command failed (or could not be run). Never fatal to the agent."""

    def __init__(self, message: str, *, command: Optional[list[str]] = None, returncode: Optional[int] = None,
                 stderr: str = "", stdout: str = ""):
        self.command = command
        self.returncode = returncode
        self.stderr = stderr
        self.stdout = stdout
        super().__init__(message)


def run_command(argv: list[str], *, timeout: float = DEFAULT_CMD_TIMEOUT_S, input: Optional[str] = None,
                env: Optional[Mapping[str, str]] = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run a scheduler command; errors (missing binary, timeout, non-zero exit when `check`)
    become ProviderError with the command line, exit code and stderr in the message."""
    cmdline = shlex.join(argv)
    full_env = None if env is None else {**os.environ, **env}
    try:
        p = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, env=full_env,
                           stdin=None if input is not None else subprocess.DEVNULL)
    except FileNotFoundError:
        raise ProviderError(f"`{cmdline}` could not run: {argv[0]} not found on PATH "
                            f"(is this a login node of the cluster? is the scheduler's module loaded?)",
                            command=argv) from None
    except PermissionError as exc:
        raise ProviderError(f"`{cmdline}` could not run: {exc}", command=argv) from None
    except subprocess.TimeoutExpired as exc:
        raise ProviderError(f"`{cmdline}` did not answer within {timeout:g} s (scheduler overloaded or down?)",
                            command=argv, stderr=_text(exc.stderr)) from None
    if check and p.returncode != 0:
        raise command_error(argv, p)
    return p


def command_error(argv: list[str], p: subprocess.CompletedProcess) -> ProviderError:
    """The ProviderError of a scheduler command that exited with an error."""
    return ProviderError(command_failed(argv, p.returncode, p.stderr, p.stdout), command=argv,
                         returncode=p.returncode, stderr=p.stderr, stdout=p.stdout)


def command_failed(argv: list[str], returncode: int, stderr: str, stdout: str = "") -> str:
    detail = (stderr or "").strip() or (stdout or "").strip() or "(no output)"
    if len(detail) > 2000:
        detail = detail[:2000] + " ..."
    return f"`{shlex.join(argv)}` exited with code {returncode}: {detail}"


def _text(b) -> str:
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else str(b)


def format_walltime(seconds: float) -> str:
    """Seconds -> HH:MM:SS (hours may exceed 24), what sbatch --time and PBS walltime take."""
    s = max(1, int(round(seconds)))
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


_WALLTIME = re.compile(r"^(?:(\d+)-)?(\d+):(\d{1,2}):(\d{1,2})$")


def parse_walltime(value) -> float:
    """'HH:MM:SS', 'D-HH:MM:SS', 'MM:SS' or a number of seconds -> seconds; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("not a walltime")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError("a walltime must be positive")
        return float(value)
    text = str(value).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return parse_walltime(float(text))
    if re.fullmatch(r"\d+:\d{1,2}", text):
        text = "0:" + text
    m = _WALLTIME.match(text)
    if not m:
        raise ValueError(f"not a walltime: {value!r}")
    days, h, mi, s = (int(g) if g else 0 for g in m.groups())
    if mi >= 60 or s >= 60:
        raise ValueError(f"not a walltime: {value!r}")
    total = days * 86400 + h * 3600 + mi * 60 + s
    if total <= 0:
        raise ValueError("a walltime must be positive")
    return float(total)


_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def safe_job_name(name: str, limit: int = 64) -> str:
    return (_SAFE_NAME.sub("-", name) or "skyfn")[:limit]


def optional_directives(*given: tuple[str, object]) -> list[str]:
    """The directives of the options that are set, in order: (template with `{}` for the value, value)."""
    return [template.format(value) for template, value in given if value]


class Provider(ABC):
    """How to get nodes. Implementations are not thread-safe; one BlockManager drives one."""

    label = "provider"
    #: True when a block's nodes are other machines (managers must connect over TCP)
    remote = True

    @abstractmethod
    def submit(self, command: str, nodes: int, walltime: float, job_name: str) -> str:
        """Start a job running `command` on `nodes` nodes for at most `walltime` s; its id."""

    @abstractmethod
    def status(self, job_ids: Iterable[str]) -> dict[str, JobState]:
        """The state of each id (every id given gets an answer, UNKNOWN if need be)."""

    @abstractmethod
    def cancel(self, job_ids: Iterable[str]) -> dict[str, bool]:
        """Cancel jobs; for each id, whether the scheduler accepted the cancel (an id that
        already ended counts as accepted)."""

    def close(self) -> None:
        """Release what the provider holds (not its jobs)."""


class BatchProvider(Provider):
    """A provider that writes a batch script per job (Slurm, PBS) into `script_dir`."""

    directive = "#"

    def __init__(self, *, script_dir: Optional[str | Path] = None, worker_init: str = "",
                 scheduler_options: str = "", cmd_timeout: float = DEFAULT_CMD_TIMEOUT_S,
                 env: Optional[Mapping[str, str]] = None):
        self.script_dir = Path(script_dir) if script_dir else Path(tempfile.mkdtemp(prefix=f"skyfn-{self.label}-"))
        self.worker_init = worker_init or ""
        self.scheduler_options = scheduler_options or ""
        self.cmd_timeout = cmd_timeout
        self.env = dict(env) if env else None  # extra variables for scheduler commands
        self.cancelled: set[str] = set()       # ids we cancelled: gone from the queue = CANCELLED
        self.last_known: dict[str, JobState] = {}

    @abstractmethod
    def directives(self, nodes: int, walltime: float, job_name: str, out_base: Path) -> list[str]:
        """The scheduler's directive lines of the script (`#SBATCH ...`, `#PBS ...`), without scheduler_options."""

    def render_script(self, command: str, nodes: int, walltime: float, job_name: str, out_base: Path) -> str:
        lines = ["#!/bin/bash"]
        lines += self.directives(nodes, walltime, job_name, out_base)
        lines += [ln.rstrip() for ln in self.scheduler_options.strip().splitlines() if ln.strip()]
        lines += ["", "# generated by skyfn (endpoint_agent.providers); the node's set-up, then the launcher",
                  f"export SKYFN_BLOCK_NODES={nodes}"]
        if self.worker_init.strip():
            lines += ["", "# worker_init", self.worker_init.strip()]
        lines += ["", "# launcher: one manager per node", command, ""]
        return "\n".join(lines)

    def write_script(self, command: str, nodes: int, walltime: float, job_name: str) -> Path:
        self.script_dir.mkdir(parents=True, exist_ok=True)
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{time.monotonic_ns() % 1_000_000:06d}"
        base = self.script_dir / f"{safe_job_name(job_name)}.{stamp}"
        path = Path(f"{base}.submit")
        path.write_text(self.render_script(command, nodes, walltime, job_name, base))
        path.chmod(0o700)
        return path

    def run(self, argv: list[str], *, check: bool = True, input: Optional[str] = None) -> subprocess.CompletedProcess:
        return run_command(argv, timeout=self.cmd_timeout, env=self.env, check=check, input=input)

    # --- submit: the scheduler's submit command and the job id it prints ------------------
    #: the submit command line before the script's path (`sbatch --parsable`, `qsub`)
    submit_command: tuple[str, ...] = ()
    #: what a job id of this scheduler looks like, in full
    job_id_pattern: re.Pattern = re.compile(r"\S+")

    def job_id_of(self, last_line: str) -> str:
        """The job id in the last line the submit command printed (warnings may precede it)."""
        return last_line

    def submit(self, command: str, nodes: int, walltime: float, job_name: str) -> str:
        script = self.write_script(command, nodes, walltime, job_name)
        argv = [*self.submit_command, str(script)]
        p = self.run(argv)
        lines = [ln.strip() for ln in p.stdout.splitlines() if ln.strip()]
        job_id = self.job_id_of(lines[-1]) if lines else ""
        if not self.job_id_pattern.fullmatch(job_id):
            raise ProviderError(f"`{shlex.join(argv)}` printed no job id: stdout {p.stdout.strip()!r}, "
                                f"stderr {p.stderr.strip()!r}", command=argv, returncode=p.returncode,
                                stderr=p.stderr, stdout=p.stdout)
        self.last_known[job_id] = JobState.PENDING
        return job_id

    # --- status: what the scheduler says, else what we know -----------------------------
    def settle(self, ids: list[str], said: Callable[[str], Optional[JobState]]) -> dict[str, JobState]:
        """Each id's state: what the scheduler `said` of it (None: it no longer knows the
        job), else what we know (_gone); remembered for when the scheduler forgets it."""
        out: dict[str, JobState] = {}
        for jid in ids:
            state = said(jid)
            if state is None:
                state = self._gone(jid)
            out[jid] = state
            if state is not JobState.UNKNOWN:
                self.last_known[jid] = state
        return out

    # The scheduler's cancel command, and its stderr phrases meaning "that job already ended".
    cancel_command: str = ""
    already_done: tuple[str, ...] = ()

    def mentions(self, job_id: str, line: str) -> bool:
        """Whether a (lower-cased) line of the cancel command's stderr is about job_id."""
        return job_id.lower() in line

    def cancel(self, job_ids: Iterable[str]) -> dict[str, bool]:
        """Cancel jobs; a job that had already ended counts as cancelled. A failure that is
        about no job in particular (controller down...) raises ProviderError."""
        ids = [str(j) for j in job_ids]
        if not ids:
            return {}
        argv = [self.cancel_command, *ids]
        p = self.run(argv, check=False)
        self.cancelled.update(ids)
        if p.returncode == 0:
            return {j: True for j in ids}
        err_lines = p.stderr.lower().splitlines()
        result: dict[str, bool] = {}
        mentioned = False
        for j in ids:
            lines = [ln for ln in err_lines if self.mentions(j, ln)]
            mentioned = mentioned or bool(lines)
            result[j] = all(any(a in ln for a in self.already_done) for ln in lines)
        if not mentioned:
            self.cancelled.difference_update(ids)
            raise command_error(argv, p)
        for j, ok in result.items():
            if not ok:
                self.cancelled.discard(j)
        return result

    def _gone(self, job_id: str) -> JobState:
        """A job the scheduler no longer knows: we cancelled it, or it ended (Parsl makes the
        same assumption when a job leaves squeue/qstat); never seen at all: UNKNOWN."""
        if job_id in self.cancelled:
            return JobState.CANCELLED
        last = self.last_known.get(job_id)
        if last is None:
            return JobState.UNKNOWN
        return last if last.terminal else JobState.COMPLETED
