"""Elastic scaling: how many blocks (batch jobs of `nodes_per_block` nodes, one manager per
node) the endpoint runs, and when to start and stop them.

Three parts:

* `ScalingConfig` - the settings (pydantic; errors name the key, the bad value and what
  is allowed). Colleague code embeds it in the endpoint config.
* `decide(config, snapshot)` - a pure function: from the pending work and each block's
  state it returns how many blocks to start and which to stop. Deterministic, no I/O.
* `BlockManager` - runs `decide` every `strategy_period` seconds: submits blocks through a
  provider and launcher, tracks their jobs, and stops a block by first asking the
  interchange to drain its managers, cancelling its job only once they are gone.

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
from __future__ import annotations

import logging
import math
import shlex
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Optional, Protocol, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from endpoint_agent.launchers import Launcher, make_launcher
from endpoint_agent.providers import JobState, Provider, ProviderError, make_provider
from endpoint_agent.providers.base import parse_walltime

log = logging.getLogger("skyfn.agent.scaling")

# --- configuration -----------------------------------------------------------------------

SCALING_ALLOWED: dict[str, str] = {
    "provider": "one of: local, slurm, pbs",
    "launcher": "one of: single, srun, mpiexec (default: single for 1-node blocks, srun on Slurm, mpiexec on PBS)",
    "launcher_options": "a string of extra launcher options, e.g. '--cpu-bind=none'",
    "nodes_per_block": "an integer from 1 to 100000",
    "min_blocks": "an integer from 0 to 10000, at most max_blocks",
    "max_blocks": "an integer from 0 to 10000",
    "init_blocks": "an integer from 0 to 10000, between min_blocks and max_blocks",
    "workers_per_node": "an integer from 1 to 4096 (default: the endpoint's workers)",
    "parallelism": "a number from 0 to 1 (fraction of the excess work covered by new blocks)",
    "max_idletime": "a number of seconds from 0 to 604800",
    "strategy_period": "a number of seconds from 0.1 to 3600",
    "walltime": "HH:MM:SS, D-HH:MM:SS or a number of seconds",
    "partition": "a Slurm partition name",
    "queue": "a PBS queue name (on Slurm: the partition)",
    "account": "an account / project name to charge",
    "qos": "a Slurm QOS name",
    "constraint": "a Slurm node constraint (--constraint)",
    "exclusive": "true or false (Slurm --exclusive)",
    "cores_per_node": "an integer from 1 to 100000 (Slurm --cpus-per-task, PBS select ncpus)",
    "mem_per_node": "a Slurm memory size such as 64G",
    "select_options": "extra PBS select resources, e.g. 'ngpus=4:mem=64gb'",
    "scheduler_options": "extra lines for the batch script, e.g. '#SBATCH --gres=gpu:4'",
    "worker_init": "shell lines run on the node before the managers start, e.g. 'module load python'",
    "cmd_timeout": "a number of seconds from 1 to 600",
    "submit_backoff_max": "a number of seconds from 1 to 86400",
}


class ScalingConfig(BaseModel):
    """Providers, launchers and elasticity. YAML keys are these field names; `aggressiveness`
    is accepted for `parallelism`."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    provider: Literal["local", "slurm", "pbs"] = "local"
    launcher: Optional[Literal["single", "srun", "mpiexec"]] = None
    launcher_options: str = ""
    nodes_per_block: int = Field(default=1, ge=1, le=100_000)
    min_blocks: int = Field(default=0, ge=0, le=10_000)
    max_blocks: int = Field(default=1, ge=0, le=10_000)
    init_blocks: int = Field(default=0, ge=0, le=10_000)
    workers_per_node: Optional[int] = Field(default=None, ge=1, le=4096)
    parallelism: float = Field(default=1.0, ge=0.0, le=1.0, alias="aggressiveness")
    max_idletime: float = Field(default=120.0, ge=0, le=604_800)
    strategy_period: float = Field(default=5.0, ge=0.1, le=3600)
    walltime: float = Field(default=3600.0, description="seconds; HH:MM:SS accepted")
    # scheduler options (Parsl's names)
    partition: Optional[str] = Field(default=None, min_length=1)
    queue: Optional[str] = Field(default=None, min_length=1)
    account: Optional[str] = Field(default=None, min_length=1)
    qos: Optional[str] = Field(default=None, min_length=1)
    constraint: Optional[str] = Field(default=None, min_length=1)
    exclusive: bool = True
    cores_per_node: Optional[int] = Field(default=None, ge=1, le=100_000)
    mem_per_node: Optional[str] = Field(default=None, pattern=r"^\d+[KMGT]?$")
    select_options: str = ""
    scheduler_options: str = ""
    worker_init: str = ""
    cmd_timeout: float = Field(default=30.0, ge=1, le=600)
    submit_backoff_max: float = Field(default=300.0, ge=1, le=86_400)

    @field_validator("walltime", mode="before")
    @classmethod
    def _walltime(cls, v: Any) -> float:
        return parse_walltime(v)

    @model_validator(mode="after")
    def _consistent(self) -> "ScalingConfig":
        if self.min_blocks > self.max_blocks:
            raise ValueError(f"key 'min_blocks': value {self.min_blocks} is greater than max_blocks "
                             f"({self.max_blocks}); allowed: an integer from 0 to max_blocks")
        if self.init_blocks > self.max_blocks:
            raise ValueError(f"key 'init_blocks': value {self.init_blocks} is greater than max_blocks "
                             f"({self.max_blocks}); allowed: an integer from min_blocks to max_blocks")
        launcher = self.launcher_name
        if self.nodes_per_block > 1 and launcher == "single":
            raise ValueError(f"key 'launcher': value 'single' starts one manager but nodes_per_block is "
                             f"{self.nodes_per_block}; allowed: srun (Slurm) or mpiexec")
        if launcher == "srun" and self.provider != "slurm":
            raise ValueError(f"key 'launcher': value 'srun' needs provider slurm (provider is {self.provider!r}); "
                             "allowed: single, mpiexec")
        if self.provider == "local" and self.nodes_per_block > 1:
            raise ValueError(f"key 'nodes_per_block': value {self.nodes_per_block} with provider 'local' "
                             "(blocks run on this machine); allowed: 1")
        if self.provider == "slurm" and self.partition and self.queue and self.partition != self.queue:
            raise ValueError(f"key 'queue': value {self.queue!r} disagrees with partition {self.partition!r}; "
                             "allowed: give one of them")
        return self

    @property
    def launcher_name(self) -> str:
        if self.launcher:
            return self.launcher
        if self.nodes_per_block == 1:
            return "single"
        return "srun" if self.provider == "slurm" else "mpiexec"

    def effective_init_blocks(self) -> int:
        return max(self.min_blocks, min(self.init_blocks, self.max_blocks))


def format_scaling_error(exc: ValidationError, source: str, prefix: str = "") -> str:
    lines = [f"invalid scaling configuration in {source}:"]
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        key = prefix + (".".join(loc) if loc else "")
        top = loc[0] if loc else ""
        if top == "aggressiveness":
            top = "parallelism"
        if err.get("type") == "extra_forbidden":
            lines.append(f"  unknown key '{key}' (value {err.get('input')!r}); allowed keys: "
                         f"{', '.join(SCALING_ALLOWED)}")
        elif not loc:
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            lines.append(f"  {msg}")
        else:
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            lines.append(f"  key '{key}': value {err.get('input')!r} is not allowed ({msg}); "
                         f"allowed: {SCALING_ALLOWED.get(top, '?')}")
    return "\n".join(lines)


class ScalingConfigError(ValueError):
    pass


def parse_scaling_config(data: Any, source: str = "config", prefix: str = "") -> ScalingConfig:
    """Validate a mapping (YAML) into a ScalingConfig; ScalingConfigError names key, value, allowed."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ScalingConfigError(f"invalid scaling configuration in {source}: expected a mapping, "
                                 f"got {type(data).__name__}")
    try:
        return ScalingConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise ScalingConfigError(format_scaling_error(exc, source, prefix)) from None


def build_provider(cfg: ScalingConfig, script_dir: Optional[Path] = None, env: Optional[Mapping[str, str]] = None
                   ) -> Provider:
    common: dict[str, Any] = {"script_dir": script_dir, "worker_init": cfg.worker_init, "env": env}
    if cfg.provider == "local":
        return make_provider("local", **common)
    common.update(scheduler_options=cfg.scheduler_options, cmd_timeout=cfg.cmd_timeout, account=cfg.account)
    if cfg.provider == "slurm":
        return make_provider("slurm", partition=cfg.partition or cfg.queue, qos=cfg.qos, constraint=cfg.constraint,
                             exclusive=cfg.exclusive, cores_per_node=cfg.cores_per_node,
                             mem_per_node=cfg.mem_per_node, **common)
    return make_provider("pbs", queue=cfg.queue or cfg.partition, cpus_per_node=cfg.cores_per_node,
                         select_options=cfg.select_options, **common)


def build_launcher(cfg: ScalingConfig) -> Launcher:
    return make_launcher(cfg.launcher_name, cfg.launcher_options)


# --- the decision ------------------------------------------------------------------------

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


# --- what the block manager needs from the interchange -------------------------------------

class InterchangeControl(Protocol):
    """The interchange side of scaling. Both methods are called from the block manager's
    thread and must be thread-safe (e.g. answer from a copy the loop publishes, and queue
    the drain for the loop)."""

    def block_snapshot(self) -> Mapping[str, Any]:
        """{"pending": tasks not given to any manager,
            "blocks": {block_id: {"managers": n connected, "workers": n, "free": n free workers,
                                  "tasks": n held by its managers (running + queued there),
                                  "last_busy": time.monotonic() when it last held a task, or None}}}
        A block appears once one of its managers registered (with --block BLOCK_ID)."""

    def drain_block(self, block_id: str) -> None:
        """Send DRAIN to the block's managers (take nothing more, give back unstarted tasks,
        finish running ones, BYE, exit) and remember the id: a manager of this block that
        registers later is drained at once. Tasks given back are dispatched elsewhere."""


class InterchangeAdapter:
    """InterchangeControl over endpoint_agent.interchange.Interchange as it stands:
    `snapshot()["blocks"][id]` = {managers, workers, free_workers, running, assigned} and
    `drain(block=id)`. `last_busy` is used when the interchange provides it; otherwise it is
    sampled here (a block seen holding tasks is busy at that moment)."""

    def __init__(self, interchange: Any, clock: Callable[[], float] = time.monotonic):
        self.ix = interchange
        self.clock = clock
        self._last_busy: dict[str, float] = {}

    def block_snapshot(self) -> Mapping[str, Any]:
        snap = self.ix.snapshot()
        now = self.clock()
        blocks = {}
        for bid, b in (snap.get("blocks") or {}).items():
            tasks = int(b.get("tasks", b.get("assigned", 0)))
            if tasks:
                self._last_busy[bid] = now
            blocks[bid] = {"managers": int(b.get("managers", 0)), "workers": int(b.get("workers", 0)),
                           "free": int(b.get("free", b.get("free_workers", 0))), "tasks": tasks,
                           "last_busy": b.get("last_busy", self._last_busy.get(bid))}
        return {"pending": int(snap.get("pending", 0)), "blocks": blocks}

    def drain_block(self, block_id: str) -> None:
        self.ix.drain(block=block_id)


@dataclass
class Block:
    block_id: str
    job_id: Optional[str]
    submitted: float
    state: JobState = JobState.PENDING
    nodes: int = 1
    connected_once: bool = False
    idle_since: Optional[float] = None
    drain_started: Optional[float] = None
    cancel_sent: Optional[float] = None
    ended: Optional[float] = None
    last: dict = field(default_factory=dict)  # the interchange's last entry for it

    def as_dict(self, now: float) -> dict[str, Any]:
        return {"block": self.block_id, "job_id": self.job_id, "state": str(self.state), "nodes": self.nodes,
                "managers": int(self.last.get("managers", 0)), "workers": int(self.last.get("workers", 0)),
                "free_workers": int(self.last.get("free", 0)), "tasks": int(self.last.get("tasks", 0)),
                "age_s": round(now - self.submitted, 1), "draining": self.drain_started is not None,
                "idle_s": None if self.idle_since is None else round(now - self.idle_since, 1)}


def manager_command(interchange: str, block_id: str, workers: int, *, server_key: Optional[str] = None,
                    python: str = sys.executable, extra: Sequence[str] = ()) -> list[str]:
    """The manager command line of wire.py (stable; A's contract)."""
    argv = [python, "-m", "endpoint_agent.manager", "--interchange", interchange, "--block", block_id,
            "--workers", str(workers)]
    if server_key:
        argv += ["--server-key", server_key]
    return argv + list(extra)


class BlockManager:
    """Runs the strategy: every `strategy_period` s, refresh job states from the provider,
    read the interchange's snapshot, decide, act. Provider errors are logged and retried
    with backoff; they never end the agent.

    `command(block_id) -> argv` builds the manager command line for a block (see
    `manager_command`); `prologue` is shell text put before the launcher line (e.g.
    exports so the node's Python finds the packages)."""

    def __init__(self, config: ScalingConfig, provider: Provider, launcher: Launcher,
                 interchange: InterchangeControl, command: Callable[[str], list[str]], *,
                 workers_per_node: Optional[int] = None, prologue: str = "", name: str = "skyfn",
                 clock: Callable[[], float] = time.monotonic, drain_timeout: Optional[float] = None):
        self.config = config
        self.policy = Policy.of(config, workers_per_node)
        self.provider = provider
        self.launcher = launcher
        self.interchange = interchange
        self.command = command
        self.prologue = prologue
        self.name = name
        self.clock = clock
        # a drained block whose managers are still there after this long is cancelled only
        # if they hold no task (never kills running work); None: wait forever
        self.drain_timeout = drain_timeout
        self.blocks: dict[str, Block] = {}
        self.finished: list[Block] = []
        self._seq = 0
        self._tag = uuid.uuid4().hex[:4]
        self._failures = 0                 # consecutive blocks that failed or never connected
        self._submit_after = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.last_decision = Decision()
        self.last_error: Optional[str] = None
        self.started_init = False

    # --- the loop --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="skyfn-blocks", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # noqa: BLE001 - the strategy must never end the agent
                log.exception("scaling step failed; trying again in %g s", self.config.strategy_period)
            self._stop.wait(self.config.strategy_period)

    def step(self) -> Decision:
        """One strategy round (also callable directly, e.g. from tests)."""
        with self._lock:
            now = self.clock()
            if not self.started_init:
                self.started_init = True
                n = self.config.effective_init_blocks()
                if n:
                    log.info("starting %d initial block(s)", n)
                    self._submit(n, now)
            self._refresh_states(now)
            snap = self._snapshot(now)
            self._progress_drains(now)
            decision = decide(self.policy, snap)
            self.last_decision = decision
            if decision.start:
                if now < self._submit_after:
                    log.debug("scale-out of %d deferred %.0f s (backoff after failures)", decision.start,
                              self._submit_after - now)
                else:
                    log.info("scaling out: %s", decision.reason)
                    self._submit(decision.start, now)
            for bid in decision.stop:
                log.info("scaling in block %s: %s", bid, decision.reason)
                self._drain(self.blocks[bid], now)
            return decision

    def _refresh_states(self, now: float) -> None:
        ids = {b.job_id: b for b in self.blocks.values() if b.job_id and b.ended is None}
        if not ids:
            return
        try:
            states = self.provider.status(list(ids))
        except ProviderError as exc:
            self._error(f"job status unavailable: {exc}")
            return
        for jid, state in states.items():
            b = ids.get(jid)
            if b is None or state is JobState.UNKNOWN:
                continue
            if state != b.state:
                log.info("block %s (job %s): %s -> %s", b.block_id, jid, b.state, state)
                b.state = state

    def _snapshot(self, now: float) -> Snapshot:
        try:
            snap = self.interchange.block_snapshot()
        except Exception as exc:  # noqa: BLE001
            self._error(f"interchange snapshot failed: {exc}")
            snap = {"pending": 0, "blocks": {}}
        per_block = snap.get("blocks") or {}
        infos = []
        for bid, b in list(self.blocks.items()):
            entry = dict(per_block.get(bid) or {})
            b.last = entry
            managers = int(entry.get("managers", 0))
            tasks = int(entry.get("tasks", 0))
            if managers and not b.connected_once:
                b.connected_once = True
                b.idle_since = now  # the idle clock of a started block runs from its connection
                self._failures = 0
                log.info("block %s: %d manager(s) connected after %.1f s", bid, managers, now - b.submitted)
            last_busy = entry.get("last_busy")
            if tasks > 0:
                b.idle_since = None
            elif b.idle_since is None:
                b.idle_since = max(float(last_busy), b.submitted) if last_busy is not None else now
            elif last_busy is not None and float(last_busy) > b.idle_since:
                b.idle_since = float(last_busy)  # it ran tasks between two rounds
            if b.state.terminal and managers == 0 and b.ended is None:
                self._ended(b, now)
                continue
            infos.append(BlockInfo(bid, b.state, managers, int(entry.get("workers", 0)), int(entry.get("free", 0)),
                                   tasks, b.idle_since, b.drain_started is not None))
        return Snapshot(now, int(snap.get("pending", 0)), tuple(infos))

    def _ended(self, b: Block, now: float) -> None:
        b.ended = now
        del self.blocks[b.block_id]
        self.finished.append(b)
        del self.finished[:-100]
        if b.drain_started is not None:
            if b.cancel_sent is None:
                self._cancel(b, now)  # its managers left and the job ended in the same round
            log.info("block %s (job %s) stopped: %s", b.block_id, b.job_id, b.state)
            return
        if not b.connected_once:
            self._failures += 1
            delay = min(self.config.submit_backoff_max, 5.0 * 2 ** (self._failures - 1))
            self._submit_after = now + delay
            self._error(f"block {b.block_id} (job {b.job_id}) ended {b.state} before any manager connected "
                        f"({self._failures} in a row); next submission in {delay:.0f} s or later. "
                        f"Check worker_init and the job's output in {getattr(self.provider, 'script_dir', '?')}")
        else:
            log.warning("block %s (job %s) ended by itself: %s (walltime or node failure?)", b.block_id,
                        b.job_id, b.state)

    def _error(self, msg: str) -> None:
        self.last_error = msg
        log.error("%s", msg)

    # --- acting ------------------------------------------------------------------------------
    def _new_block_id(self) -> str:
        self._seq += 1
        return f"b{self._seq}.{self._tag}"

    def _submit(self, n: int, now: float) -> None:
        for _ in range(n):
            bid = self._new_block_id()
            try:
                line = self.launcher(self.command(bid), self.config.nodes_per_block)
                script = f"{self.prologue.rstrip()}\n{line}" if self.prologue.strip() else line
                job_id = self.provider.submit(script, self.config.nodes_per_block, self.config.walltime,
                                              f"{self.name}-{bid}")
            except ProviderError as exc:
                self._failures += 1
                delay = min(self.config.submit_backoff_max, 5.0 * 2 ** (self._failures - 1))
                self._submit_after = now + delay
                self._error(f"cannot submit block {bid}: {exc}; retrying in {delay:.0f} s")
                return
            log.info("block %s submitted: job %s (%d node(s), walltime %g s)", bid, job_id,
                     self.config.nodes_per_block, self.config.walltime)
            self.blocks[bid] = Block(bid, job_id, now, nodes=self.config.nodes_per_block, idle_since=now)

    def _drain(self, b: Block, now: float) -> None:
        if b.drain_started is not None:
            return
        b.drain_started = now
        try:
            self.interchange.drain_block(b.block_id)
        except Exception as exc:  # noqa: BLE001
            self._error(f"cannot drain block {b.block_id}: {exc}")
        self._progress_drains(now)

    def _progress_drains(self, now: float) -> None:
        """Cancel the job of a draining block once its managers are gone (or, with a drain
        timeout, once they hold no task); jobs whose cancel was sent are watched until ended."""
        for b in list(self.blocks.values()):
            if b.drain_started is None or b.cancel_sent is not None:
                continue
            managers = int(b.last.get("managers", 0))
            tasks = int(b.last.get("tasks", 0))
            if managers and now > b.drain_started:
                try:  # a manager of the block that registered after the drain began (idempotent)
                    self.interchange.drain_block(b.block_id)
                except Exception as exc:  # noqa: BLE001
                    self._error(f"cannot drain block {b.block_id}: {exc}")
            gone = managers == 0 or b.state.terminal
            overdue = self.drain_timeout is not None and now - b.drain_started >= self.drain_timeout and tasks == 0
            if not (gone or overdue):
                continue
            self._cancel(b, now)

    def _cancel(self, b: Block, now: float) -> None:
        """Cancel a drained block's job. Always sent, even when the job seems to have ended with
        its managers: a no-op then, and it frees nodes a lingering script would keep."""
        b.cancel_sent = now
        if b.job_id is None:
            return
        try:
            self.provider.cancel([b.job_id])
            log.info("block %s drained; job %s cancelled", b.block_id, b.job_id)
        except ProviderError as exc:
            b.cancel_sent = None  # try again next round
            self._error(f"cannot cancel job {b.job_id} of block {b.block_id}: {exc}")

    # --- control -----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        now = self.clock()
        with self._lock:
            return {"provider": self.config.provider, "launcher": self.launcher.name,
                    "min_blocks": self.config.min_blocks, "max_blocks": self.config.max_blocks,
                    "nodes_per_block": self.config.nodes_per_block,
                    "blocks": [b.as_dict(now) for b in self.blocks.values()],
                    "last_decision": self.last_decision.reason, "last_error": self.last_error}

    def stop(self, cancel: bool = True, timeout: float = 10.0) -> None:
        """Stop the strategy thread and (by default) cancel every job still alive: the agent
        is stopping, and its managers go with it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if not cancel:
            return
        with self._lock:
            ids = [b.job_id for b in self.blocks.values() if b.job_id and not b.state.terminal]
            if ids:
                try:
                    self.provider.cancel(ids)
                    log.info("cancelled %d block job(s): %s", len(ids), ", ".join(ids))
                except ProviderError as exc:
                    log.error("cannot cancel block jobs %s at shutdown: %s", ", ".join(ids), exc)
        self.provider.close()


def node_prologue(extra_env: Optional[Mapping[str, str]] = None) -> str:
    """Shell lines that let a node's Python import endpoint_agent from this checkout/venv."""
    root = str(Path(__file__).resolve().parent.parent)
    lines = [f"export PYTHONPATH={shlex.quote(root)}${{PYTHONPATH:+:$PYTHONPATH}}", "export PYTHONUNBUFFERED=1"]
    for k, v in (extra_env or {}).items():
        lines.append(f"export {k}={shlex.quote(v)}")
    return "\n".join(lines)
