"""The aAPP scheduler: pick a worker for one invocation of a tagged function.

Walk the tag's blocks top to bottom; in each block keep the workers that are valid
(online; under the block's invalidate thresholds; running every `tag` and no `!tag` of
its affinity) and let the block's strategy choose among them. The first block with a
valid worker wins. When none has one, the tag's followup applies: `default` walks the
policy's `default` tag (or the built-in "any online worker"), `fail` fails the decision
with a reason naming each rejected worker.

    any               uniform random choice
    best_first        first valid worker in the block's order (`*`: the state's order)
    warm_first        a worker with an idle warm container of the task's type, most free
                      slots first; without one, the one with the most free slots (funcX)
    shortest_backlog  fewest queued + running tasks per slot (Balsam's multi-site rule)
    round_robin       the next valid worker after the previous choice of this block
    data_local        the valid worker holding the most bytes of the task's data refs
                      (skyfn.data); without one, shortest_backlog

Data awareness: `decide(..., data={worker: bytes})` says where the task's refs live.
Besides `data_local`, the affinity `data` keeps only workers holding them (`!data`: only
workers that do not); a task without refs is not constrained by it.

Decisions run under the state's lock. `place()` decides and records the start in the same
critical section, so concurrent placements cannot both take a worker's last allowed slot.
The hot path builds no strings: reasons are formatted only when explaining or failing.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Optional

from skyfn.placement.model import DATA_AFFINITY, Block, Policy, TagPolicy
from skyfn.placement.state import LiveState, WorkerState

OFFLINE, FULL, CAPACITY, CONCURRENCY, MISSING, FORBIDDEN, UNKNOWN, NO_DATA, HAS_DATA = range(1, 10)
# Rejections a later decision may not repeat: load and co-location change as tasks run.
TRANSIENT = frozenset({FULL, CAPACITY, CONCURRENCY, MISSING, FORBIDDEN})
_POS = attrgetter("pos")


@dataclass(slots=True)
class BlockTrace:
    """How one block was evaluated (explain mode)."""

    policy_tag: str
    number: int                  # 1-based within its tag
    line: Optional[int]
    description: str
    valid: list[str] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (worker, reason)
    chosen: Optional[str] = None
    codes: set[int] = field(default_factory=set)
    order: list[str] = field(default_factory=list)   # every worker considered, in the block's order

    @property
    def where(self) -> str:
        return f"line {self.line}" if self.line else "built in"

    def as_dict(self) -> dict[str, Any]:
        return {"tag": self.policy_tag, "block": self.number, "line": self.line, "block_description": self.description,
                "valid": self.valid, "rejected": [{"worker": w, "reason": r} for w, r in self.rejected],
                "chosen": self.chosen}


@dataclass(slots=True)
class Decision:
    worker: Optional[str]        # None: the task cannot be placed (see reason)
    tag: Optional[str]           # the function's tag as asked
    policy_tag: Optional[str]    # the tag whose blocks decided ("default", "(built-in default)", ...)
    block: Optional[int] = None  # 1-based block number inside policy_tag
    line: Optional[int] = None   # that block's line in the policy file
    via: str = "tag"             # "tag" | "default" (tag not in policy) | "followup" (followup: default)
    reason: str = ""
    transient: bool = False      # failed only because of load or co-location: a retry may succeed
    trace: list[BlockTrace] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.worker is not None

    def as_dict(self) -> dict[str, Any]:
        return {"worker": self.worker, "tag": self.tag, "policy_tag": self.policy_tag, "block": self.block,
                "line": self.line, "via": self.via, "reason": self.reason, "transient": self.transient,
                "trace": [t.as_dict() for t in self.trace]}

    def explain(self) -> str:
        """Human-readable account: each block tried, each worker rejected and why, the choice."""
        head = (f"tag {self.tag!r}" if self.tag is not None else "untagged function")
        if self.ok:
            where = f"line {self.line}" if self.line else "built in"
            out = [f"{head} -> worker {self.worker!r} ({self.policy_tag!r} block {self.block}, {where})"]
        else:
            out = [f"{head} -> no worker: {self.reason}"]
        if self.via == "default" and self.tag is not None:
            out.append(f"  (the policy has no tag {self.tag!r}: the {self.policy_tag!r} blocks apply)")
        for t in self.trace:
            out.append(f"  {t.policy_tag!r} block {t.number} ({t.where}): {t.description}")
            reasons = dict(t.rejected)
            for w in t.order:
                if w in reasons:
                    out.append(f"    {w}: rejected, {reasons[w]}")
                else:
                    out.append(f"    {w}: valid" + ("  <- chosen" if w == t.chosen else ""))
            if not t.order:
                out.append("    (no workers)")
        return "\n".join(out)


class Scheduler:
    """Decisions for one policy over one live state.

    respect_capacity: also reject workers whose slots are all busy, whatever the block says
    (the agent's interchange, which must not push work to a full manager). The service
    leaves it off: endpoints queue work, and backlog is what shortest_backlog weighs.
    """

    def __init__(self, policy: Policy, state: LiveState, *, seed: Optional[int] = None,
                 respect_capacity: bool = False):
        self.policy = policy
        self.state = state
        self.respect_capacity = respect_capacity
        self._rng = random.Random(seed)
        self._data: Optional[dict[str, int]] = None  # the current decision's data locations
        self._cursor: dict[int, int] = {}                                    # id(block) -> round-robin position
        self._resolved: dict[int, tuple[int, list[WorkerState], tuple[str, ...]]] = {}  # id(block) -> (version, ...)
        self._blocks: list[Block] = [b for tp in policy.tags.values() for b in tp.blocks]  # keep ids alive

    # --- public ----------------------------------------------------------------------
    def decide(self, tag: Optional[str] = None, *, container: Optional[str] = None,
               explain: bool = False, data: Optional[dict[str, int]] = None) -> Decision:
        """`data`: worker name -> bytes of the task's data refs held there (data awareness)."""
        with self.state.lock:
            return self._decide(tag, container, explain, data)

    def place(self, tag: Optional[str] = None, *, container: Optional[str] = None,
              data: Optional[dict[str, int]] = None) -> Decision:
        """Decide and, when a worker is chosen, record the invocation as started on it."""
        with self.state.lock:
            d = self._decide(tag, container, False, data)
            if d.worker is not None:
                self.state._start(self.state.workers[d.worker], tag)
            return d

    def cursors(self) -> dict[str, int]:
        """Round-robin positions by block ("<tag>#<block number>"), to carry them across
        processes (the service decides per request, in whichever Lambda runs it)."""
        names = self._block_names()
        return {names[k]: v for k, v in self._cursor.items() if k in names}

    def set_cursors(self, cursors: dict[str, int]) -> None:
        ids = {name: k for k, name in self._block_names().items()}
        for name, pos in cursors.items():
            if name in ids and isinstance(pos, int) and pos >= 0:
                self._cursor[ids[name]] = pos

    def _block_names(self) -> dict[int, str]:
        tps = [*self.policy.tags.values(), self.policy.default]
        return {id(b): f"{tp.name}#{n}" for tp in tps for n, b in enumerate(tp.blocks, 1)}

    # --- core ------------------------------------------------------------------------
    def _plan(self, tag: Optional[str]) -> list[tuple[TagPolicy, str]]:
        policy = self.policy
        own = policy.tags.get(tag) if tag is not None else None
        if own is None:
            return [(policy.default, "default")]
        plan = [(own, "tag")]
        if own.followup == "default" and own is not policy.default:
            plan.append((policy.default, "followup"))
        return plan

    def _decide(self, tag: Optional[str], container: Optional[str], explain: bool,
                data: Optional[dict[str, int]] = None) -> Decision:
        self._data = data  # read by _scan and _choose (decisions run under the state's lock)
        plan = self._plan(tag)
        traces: Optional[list[BlockTrace]] = [] if explain else None
        for tp, via in plan:
            for number, block in enumerate(tp.blocks, 1):
                trace = None
                if traces is not None:
                    trace = BlockTrace(tp.name, number, block.line, block.describe())
                    traces.append(trace)
                w = self._pick(block, container, trace)
                if w is not None:
                    reason = f"{tp.name!r} block {number}, strategy {block.strategy}"
                    if data:
                        held = data.get(w.name)
                        reason += (f"; data local: {w.name} holds {held} bytes of the task's refs" if held else
                                   f"; the task's refs live on {', '.join(sorted(data))}, not on {w.name}")
                    return Decision(worker=w.name, tag=tag, policy_tag=tp.name, block=number, line=block.line,
                                    via=via, reason=reason, trace=traces if traces is not None else [])
        if not explain:  # failures are rare: evaluate again, this time collecting every reason
            return self._decide(tag, container, True, data)
        last, last_via = plan[-1]
        parts = []
        for t in traces:
            why = "; ".join(f"{w} {r}" for w, r in t.rejected[:6])
            if len(t.rejected) > 6:
                why += f"; and {len(t.rejected) - 6} more"
            parts.append(f"{t.policy_tag!r} block {t.number} ({t.where}): {why or 'no workers'}")
        if last_via == "tag":
            ending = "followup: fail"
        elif last_via == "followup":
            ending = f"followup: default, and the {last.name!r} blocks had none either"
        else:
            ending = f"the tag has no blocks of its own; the {last.name!r} blocks had none"
        what = f"tag {tag!r}" if tag is not None else "an untagged function"
        reason = f"no valid worker for {what}: " + " | ".join(parts) + f" ({ending})"
        transient = any(t.codes & TRANSIENT for t in traces)
        return Decision(worker=None, tag=tag, policy_tag=last.name, via=plan[-1][1], reason=reason,
                        transient=transient, trace=traces)

    def _candidates(self, block: Block) -> tuple[list[WorkerState], tuple[str, ...]]:
        """The block's workers that exist in the state (in block order) and the names that do not."""
        state = self.state
        if block.workers is None:
            return state.order, ()
        key = id(block)
        cached = self._resolved.get(key)
        if cached is not None and cached[0] == state.version:
            return cached[1], cached[2]
        found = [state.workers[n] for n in block.workers if n in state.workers]
        missing = tuple(n for n in block.workers if n not in state.workers)
        self._resolved[key] = (state.version, found, missing)
        return found, missing

    def _pick(self, block: Block, container: Optional[str], trace: Optional[BlockTrace]) -> Optional[WorkerState]:
        cands, missing = self._candidates(block)
        strategy = block.strategy
        n = len(cands)
        start = self._cursor.get(id(block), 0) % n if strategy == "round_robin" and n else 0
        if trace is None and block.require and block.workers is None:
            # Only workers running every required tag can be valid: start from the
            # smallest such set (kept by the state) instead of visiting every worker.
            by_tag = self.state.by_tag
            subset = None
            for t in block.require:
                if t == DATA_AFFINITY:
                    continue
                holders = by_tag.get(t)
                if not holders:
                    return None
                if subset is None or len(holders) < len(subset):
                    subset = holders
            if subset is not None and len(subset) < n:
                cands = sorted(subset, key=_POS)
                if start:
                    cands = [w for w in cands if w.pos >= start] + [w for w in cands if w.pos < start]
                start = 0
        if start:
            cands = cands[start:] + cands[:start]
        rejected: Optional[list] = [] if trace is not None else None
        first_only = trace is None and (strategy == "best_first" or strategy == "round_robin")
        valid = self._scan(block, cands, rejected, first_only)
        if trace is not None:
            for name in missing:
                trace.rejected.append((name, "unknown worker (not among the current workers)"))
                trace.codes.add(UNKNOWN)
            for w, code in rejected:
                trace.rejected.append((w.name, self._reason(code, w, block, self._data)))
                trace.codes.add(code)
            trace.valid = [w.name for w in valid]
            listed = block.workers if block.workers is not None else [w.name for w in self.state.order]
            trace.order = list(listed)
        if not valid:
            return None
        chosen = self._choose(strategy, valid, container)
        if strategy == "round_robin":
            self._cursor[id(block)] = (self._candidates(block)[0].index(chosen) + 1) % n
        if trace is not None:
            trace.chosen = chosen.name
        return chosen

    def _scan(self, block: Block, cands: list[WorkerState], rejected: Optional[list],
              first_only: bool) -> list[WorkerState]:
        data = self._data
        inv = block.invalidate
        cap = inv.capacity_used if inv is not None else None
        mci = inv.max_concurrent_invocations if inv is not None else None
        req, forb = block.require, block.forbid
        full = self.respect_capacity
        valid = []
        for w in cands:
            r = w.running
            c = w.capacity
            code = 0
            if not w.online:
                code = OFFLINE
            elif full and c and r >= c:
                code = FULL
            elif cap is not None and c and r * 100.0 >= cap * c:
                code = CAPACITY
            elif mci is not None and r >= mci:
                code = CONCURRENCY
            elif req or forb:
                tags = w.tags
                for t in forb:
                    if t == DATA_AFFINITY:
                        if data and w.name in data:
                            code = HAS_DATA
                            break
                    elif tags.get(t):
                        code = FORBIDDEN
                        break
                else:
                    for t in req:
                        if t == DATA_AFFINITY:
                            if data and w.name not in data:
                                code = NO_DATA
                                break
                        elif not tags.get(t):
                            code = MISSING
                            break
            if code:
                if rejected is not None:
                    rejected.append((w, code))
                continue
            valid.append(w)
            if first_only:
                break
        return valid

    def _choose(self, strategy: str, valid: list[WorkerState], container: Optional[str]) -> WorkerState:
        data = self._data
        if len(valid) == 1 or strategy == "best_first" or strategy == "round_robin":
            return valid[0]
        if strategy == "any":
            return valid[self._rng.randrange(len(valid))]
        if strategy == "data_local" and data:
            holders = [w for w in valid if data.get(w.name)]
            if holders:
                most = max(data[w.name] for w in holders)
                valid = [w for w in holders if data[w.name] == most]
                if len(valid) == 1:
                    return valid[0]
            strategy = "shortest_backlog"  # ties, or nobody valid holds the data
        if strategy == "shortest_backlog" or strategy == "data_local":
            best, best_score = None, 0.0
            for w in valid:
                score = (w.queued + w.running) / (w.capacity or 1)
                if best is None or score < best_score:
                    best, best_score = w, score
            return best
        # warm_first: warm workers of this container type first, then the most free slots
        pool = valid
        if container is not None:
            warm = [w for w in valid if w.warm.get(container)]
            if warm:
                pool = warm
        best, best_free = None, 0
        for w in pool:
            free = (w.capacity - w.running) if w.capacity else -w.running
            if best is None or free > best_free:
                best, best_free = w, free
        return best

    @staticmethod
    def _reason(code: int, w: WorkerState, block: Block, data: Optional[dict[str, int]] = None) -> str:
        if code == NO_DATA:
            return f"holds none of the task's data (its refs live on {', '.join(sorted(data or ()))}; affinity data)"
        if code == HAS_DATA:
            return "holds the task's data (anti-affinity !data)"
        if code == OFFLINE:
            return "offline"
        if code == FULL:
            return f"full ({w.running} of {w.capacity} slots busy)"
        if code == CAPACITY:
            return (f"capacity used {w.capacity_used():.0f}% reaches the {block.invalidate.capacity_used:g}% "
                    f"threshold ({w.running} of {w.capacity} slots busy)")
        if code == CONCURRENCY:
            return (f"{w.running} concurrent invocations reach max_concurrent_invocations "
                    f"{block.invalidate.max_concurrent_invocations}")
        if code == MISSING:
            need = [t for t in block.require if not w.tags.get(t)]
            return f"runs no {need[0]!r} function (affinity {need[0]})"
        if code == FORBIDDEN:
            bad = [t for t in block.forbid if w.tags.get(t)]
            return f"runs {w.tags[bad[0]]} {bad[0]!r} function(s) (anti-affinity !{bad[0]})"
        return "unknown worker"
