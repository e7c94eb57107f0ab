"""Elastic scaling: how many blocks (batch jobs of `nodes_per_block` nodes, one manager per
node) the endpoint runs, and when to start and stop them.

Three parts, one module each (this package exports their public names):

* `ScalingConfig` (config.py) - the settings (pydantic; errors name the key, the bad value
  and what is allowed) and the provider and launcher they build. Colleague code embeds it
  in the endpoint config.
* `decide(config, snapshot)` (strategy.py) - a pure function: from the pending work and
  each block's state it returns how many blocks to start and which to stop.
  Deterministic, no I/O.
* `BlockManager` (blocks.py) - runs `decide` every `strategy_period` seconds: submits
  blocks through a provider and launcher, tracks their jobs, and stops a block by first
  asking the interchange to drain its managers, cancelling its job only once they are gone.

The policy (Parsl's strategy, with its `parallelism`, made safe for scale-in):

* demand  = tasks waiting at the interchange + tasks held by managers beyond their busy workers
* capacity = free workers of connected managers + the full worker count of blocks whose
  managers have not connected yet (PENDING in the scheduler's queue, or starting) - so a
  block stuck in the queue counts and we do not submit another for the same work
* excess = demand - capacity; when positive, start ceil(excess * parallelism / block size)
  blocks (at least one when there are none), up to max_blocks
* keep at least min_blocks alive
* stop blocks that hold no task and have been idle for max_idletime (a queued block: since
  its submission), longest idle first, down to min_blocks, and only while nothing waits at
  the interchange. A block holding a task is never stopped; a stopped block is drained
  (its managers take nothing more, finish what they run, and exit) before its job is cancelled.
"""
from endpoint_agent.scaling.blocks import (
    Block, BlockManager, InterchangeAdapter, InterchangeControl, manager_command, node_prologue,
)
from endpoint_agent.scaling.config import (
    SCALING_ALLOWED, ScalingConfig, ScalingConfigError, build_launcher, build_provider, format_scaling_error,
    parse_scaling_config,
)
from endpoint_agent.scaling.strategy import (
    BlockInfo, Decision, Policy, Snapshot, block_backlog, block_capacity, decide,
)

__all__ = [
    "SCALING_ALLOWED", "ScalingConfig", "ScalingConfigError", "format_scaling_error", "parse_scaling_config",
    "build_provider", "build_launcher",
    "BlockInfo", "Snapshot", "Decision", "Policy", "block_capacity", "block_backlog", "decide",
    "InterchangeControl", "InterchangeAdapter", "Block", "manager_command", "BlockManager", "node_prologue",
]
