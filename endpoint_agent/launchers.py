"""Launchers: how a block's batch script starts one manager on each of its nodes.

A launcher turns the manager's command line (argv) into the shell command the provider
puts in the block's script (it runs once, on the block's first node):

    single    COMMAND                                       one node: run it once
    srun      srun --ntasks-per-node=1 -N NODES COMMAND     Slurm: one task per node
    mpiexec   mpiexec -n NODES -ppn 1 COMMAND               MPICH/Hydra, Intel MPI, Cray PALS

`overrides` are extra options placed before the command (e.g. `--cpu-bind=none` for srun,
`--hostfile $PBS_NODEFILE` for mpiexec). Every argument is shell-quoted; the output is exact
and tested. `exec` makes the launcher (or the manager) the script's main process, so a
cancel's signal reaches it directly.
"""
from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from typing import Sequence


class Launcher(ABC):
    name = "launcher"

    def __init__(self, overrides: str = ""):
        self.overrides = overrides.strip()

    @abstractmethod
    def __call__(self, command: Sequence[str], nodes: int) -> str:
        """The shell line that starts `command` once on each of `nodes` nodes."""

    def _extra(self) -> str:
        return f" {self.overrides}" if self.overrides else ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(overrides={self.overrides!r})"


class SingleNodeLauncher(Launcher):
    """Runs the command once, where the script runs. For blocks of one node (and local)."""

    name = "single"

    def __call__(self, command: Sequence[str], nodes: int) -> str:
        if nodes != 1:
            raise ValueError(f"the single-node launcher starts one manager; a block of {nodes} nodes "
                             "needs launcher srun (Slurm) or mpiexec")
        pre = f"{self.overrides} " if self.overrides else ""
        return f"exec {pre}{shlex.join(command)}"


class SrunLauncher(Launcher):
    name = "srun"

    def __call__(self, command: Sequence[str], nodes: int) -> str:
        _check_nodes(nodes)
        return f"exec srun --ntasks-per-node=1 -N {nodes}{self._extra()} {shlex.join(command)}"


class MpiexecLauncher(Launcher):
    name = "mpiexec"

    def __call__(self, command: Sequence[str], nodes: int) -> str:
        _check_nodes(nodes)
        return f"exec mpiexec -n {nodes} -ppn 1{self._extra()} {shlex.join(command)}"


def _check_nodes(nodes: int) -> None:
    if not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"nodes must be a positive integer, got {nodes!r}")


LAUNCHERS: dict[str, type[Launcher]] = {
    "single": SingleNodeLauncher,
    "srun": SrunLauncher,
    "mpiexec": MpiexecLauncher,
}


def make_launcher(name: str, overrides: str = "") -> Launcher:
    try:
        return LAUNCHERS[name](overrides)
    except KeyError:
        raise ValueError(f"unknown launcher {name!r}; allowed: {', '.join(LAUNCHERS)}") from None
