"""Block bookkeeping: the `BlockManager` runs the strategy (strategy.py) every
`strategy_period` s: it submits blocks through a provider and a launcher, tracks their
jobs, and stops a block by first asking the interchange to drain its managers
(`InterchangeControl`), cancelling its job only once they are gone. Also the manager
command line a block runs on each node and the shell prologue that lets it find the code.
"""
from __future__ import annotations

import logging
import shlex
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

from endpoint_agent.launchers import Launcher
from endpoint_agent.providers import JobState, Provider, ProviderError
from endpoint_agent.scaling.config import ScalingConfig
from endpoint_agent.scaling.strategy import BlockInfo, Decision, Policy, Snapshot, decide

log = logging.getLogger("skyfn.agent.scaling")

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
    """The manager command line of endpoint_agent/wire.py (stable; A's contract)."""
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
    root = str(Path(__file__).resolve().parents[2])  # holds endpoint_agent/
    lines = [f"export PYTHONPATH={shlex.quote(root)}${{PYTHONPATH:+:$PYTHONPATH}}", "export PYTHONUNBUFFERED=1"]
    for k, v in (extra_env or {}).items():
        lines.append(f"export {k}={shlex.quote(v)}")
    return "\n".join(lines)
