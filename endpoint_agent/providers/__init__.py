"""Providers: how the endpoint gets nodes (Parsl's split: providers get nodes, launchers
start managers on them, the interchange runs tasks).

    local   blocks are process groups on this machine
    slurm   sbatch / squeue (+ scontrol for jobs that left squeue) / scancel
    pbs     qsub / qstat -f -F json -x (or the plain table) / qdel
"""
from __future__ import annotations

from typing import Any

from endpoint_agent.providers.base import (
    TERMINAL, JobState, Provider, ProviderError, format_walltime, parse_walltime, run_command,
)

PROVIDERS = ("local", "slurm", "pbs")


def make_provider(name: str, **options: Any) -> Provider:
    """A provider by name; options are its constructor's keywords (None values dropped)."""
    opts = {k: v for k, v in options.items() if v is not None}
    if name == "local":
        from endpoint_agent.providers.local import LocalProvider

        allowed = {"script_dir", "worker_init", "env", "kill_grace", "max_jobs"}
        return LocalProvider(**{k: v for k, v in opts.items() if k in allowed})
    if name == "slurm":
        from endpoint_agent.providers.slurm import SlurmProvider

        return SlurmProvider(**opts)
    if name == "pbs":
        from endpoint_agent.providers.pbs import PBSProvider

        return PBSProvider(**opts)
    raise ValueError(f"unknown provider {name!r}; allowed: {', '.join(PROVIDERS)}")


__all__ = ["JobState", "Provider", "ProviderError", "TERMINAL", "PROVIDERS", "make_provider", "run_command",
           "format_walltime", "parse_walltime"]
