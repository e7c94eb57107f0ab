"""The scaling decision: `decide(policy, snapshot)`, a pure function from the pending work
and each block's state to how many blocks to start and which to stop (the policy is in
endpoint_agent/scaling/__init__.py). Deterministic, no I/O.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from endpoint_agent.providers import JobState
from endpoint_agent.scaling.config import ScalingConfig

@dataclass(frozen=True)
class BlockInfo:
    """One block as the strategy sees it."""
    block_id: str
    state: JobState = JobState.PENDING      # the scheduler's view of its job
    managers: int = 0                       # its managers connected to the interchange now
    workers: int = 0                        # their workers
    free_workers: int = 0                   # their workers without a task
    tasks: int = 0                          # tasks its managers hold (running or queued there)
    idle_since: Optional[float] = None      # holding no task since (None: busy); queued: submitted at
    draining: bool = False                  # being stopped


@dataclass(frozen=True)
class Snapshot:
    now: float
    pending_tasks: int                      # tasks at the interchange not given to any manager
    blocks: tuple[BlockInfo, ...] = ()


@dataclass(frozen=True)
class Decision:
    start: int = 0
    stop: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class Policy:
    """The numbers `decide` needs (a ScalingConfig provides them)."""
    min_blocks: int = 0
    max_blocks: int = 1
    nodes_per_block: int = 1
    workers_per_node: int = 1
    parallelism: float = 1.0
    max_idletime: float = 120.0

    @classmethod
    def of(cls, cfg: ScalingConfig, workers_per_node: Optional[int] = None) -> "Policy":
        w = cfg.workers_per_node or workers_per_node
        if not w:
            raise ValueError("workers_per_node is not set (in the scaling config or from the endpoint's workers)")
        return cls(cfg.min_blocks, cfg.max_blocks, cfg.nodes_per_block, w, cfg.parallelism, cfg.max_idletime)

    @property
    def block_slots(self) -> int:
        return self.nodes_per_block * self.workers_per_node


def block_capacity(policy: Policy, b: BlockInfo) -> int:
    """Tasks this block can take without queueing: free workers of its connected managers,
    plus full nodes for the managers still to come (all of them while it is queued)."""
    missing_nodes = max(0, policy.nodes_per_block - b.managers)
    return max(0, b.free_workers) + missing_nodes * policy.workers_per_node


def block_backlog(b: BlockInfo) -> int:
    """Tasks queued at the block's managers behind busy workers (prefetched)."""
    busy = max(0, b.workers - b.free_workers)
    return max(0, b.tasks - busy)


def decide(policy: Policy, snap: Snapshot) -> Decision:
    """How many blocks to start and which to stop. Pure and deterministic."""
    live = [b for b in snap.blocks if not b.state.terminal and not b.draining]
    n = len(live)
    demand = max(0, snap.pending_tasks) + sum(block_backlog(b) for b in live)
    capacity = sum(block_capacity(policy, b) for b in live)
    excess = demand - capacity

    start = 0
    why = []
    if excess > 0 and n < policy.max_blocks:
        want = math.ceil(excess * policy.parallelism / max(1, policy.block_slots))
        if n == 0:
            want = max(want, 1)  # never leave work with no block at all
        start = min(want, policy.max_blocks - n)
        if start:
            why.append(f"{demand} task(s) waiting, capacity {capacity}: +{start} block(s)")
    if n + start < policy.min_blocks:
        more = policy.min_blocks - n - start
        start += more
        why.append(f"below min_blocks {policy.min_blocks}: +{more}")
    if start:
        return Decision(start=start, reason="; ".join(why))

    # scale in: only while nothing waits at the interchange
    if snap.pending_tasks > 0 or n <= policy.min_blocks:
        return Decision(reason="steady")
    idle = [b for b in live
            if b.tasks == 0 and b.idle_since is not None and snap.now - b.idle_since >= policy.max_idletime]
    # queued / not yet connected blocks first (nothing warm to lose), then the longest idle
    idle.sort(key=lambda b: (b.managers > 0, b.idle_since, b.block_id))
    stop = tuple(b.block_id for b in idle[: n - policy.min_blocks])
    if stop:
        return Decision(stop=stop, reason=f"{len(stop)} block(s) idle for {policy.max_idletime:g} s or more")
    return Decision(reason="steady")
