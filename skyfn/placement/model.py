"""The aAPP policy model: what a loaded policy is, independent of YAML.

A policy maps tags to ordered blocks plus a followup. A block names its workers
(`*` = every worker the scheduler knows, or a list of names), a strategy, optional
invalidation thresholds and an affinity (tags that must / must not run on the worker).
Objects are immutable; the loader (loader.py) is the only way to build them from text.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

STRATEGIES = ("any", "best_first", "warm_first", "shortest_backlog", "round_robin", "data_local")
# The affinity name that means "where the task's data lives" (skyfn.data refs): `affinity:
# data` keeps only workers holding the task's refs, `!data` only workers that do not.
DATA_AFFINITY = "data"
FOLLOWUPS = ("default", "fail")
DEFAULT_TAG = "default"


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding of the loader: where (line, 1-based), which key, and why."""

    line: Optional[int]
    key: str
    reason: str

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line else "policy"
        return f"{where}: {self.key}: {self.reason}" if self.key else f"{where}: {self.reason}"

    def as_dict(self) -> dict:
        return {"line": self.line, "key": self.key, "reason": self.reason}


class PolicyError(ValueError):
    """A policy was rejected; `problems` lists every error found (none is loaded)."""

    def __init__(self, problems: Iterable[Problem], source: str = "<policy>"):
        self.problems = list(problems)
        self.source = source
        lines = "; ".join(str(p) for p in self.problems)
        super().__init__(f"policy {source} rejected: {lines}")

    def details(self) -> list[dict]:
        return [p.as_dict() for p in self.problems]


@dataclass(frozen=True, slots=True)
class Invalidate:
    """Thresholds that make a worker invalid for a block.

    capacity_used: percent of the worker's slots in use at which it becomes invalid
    (reaching the threshold invalidates; `overload` is capacity_used 100%).
    max_concurrent_invocations: invocations running on the worker at which it becomes invalid.
    """

    capacity_used: Optional[float] = None
    max_concurrent_invocations: Optional[int] = None

    def describe(self) -> str:
        parts = []
        if self.capacity_used is not None:
            parts.append(f"capacity_used {self.capacity_used:g}%")
        if self.max_concurrent_invocations is not None:
            parts.append(f"max_concurrent_invocations {self.max_concurrent_invocations}")
        return ", ".join(parts) or "none"


@dataclass(frozen=True, slots=True)
class Block:
    workers: Optional[tuple[str, ...]]  # None means `*`
    strategy: str = "any"
    invalidate: Optional[Invalidate] = None
    require: tuple[str, ...] = ()       # affinity `tag`: the worker must run one
    forbid: tuple[str, ...] = ()        # affinity `!tag`: the worker must run none
    line: Optional[int] = None

    def describe(self) -> str:
        parts = ["workers " + ("*" if self.workers is None else ", ".join(self.workers)),
                 f"strategy {self.strategy}"]
        if self.invalidate is not None:
            parts.append(f"invalidate {self.invalidate.describe()}")
        if self.require or self.forbid:
            parts.append("affinity " + ", ".join([*self.require, *("!" + t for t in self.forbid)]))
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class TagPolicy:
    name: str
    blocks: tuple[Block, ...]
    followup: str                      # "default" | "fail"
    line: Optional[int] = None


# What `followup: default` falls to when the policy defines no `default` tag:
# any online worker the scheduler knows.
BUILTIN_DEFAULT = TagPolicy(name="(built-in default)", blocks=(Block(workers=None, strategy="any"),),
                            followup="fail")


@dataclass(frozen=True)
class Policy:
    tags: dict[str, TagPolicy]
    warnings: tuple[Problem, ...] = ()
    source: str = "<policy>"
    text: str = field(default="", repr=False)

    @property
    def default(self) -> TagPolicy:
        """The policy for untagged functions, unknown tags and `followup: default`."""
        return self.tags.get(DEFAULT_TAG, BUILTIN_DEFAULT)

    def for_tag(self, tag: Optional[str]) -> TagPolicy:
        if tag is not None:
            found = self.tags.get(tag)
            if found is not None:
                return found
        return self.default

    def worker_names(self) -> dict[str, int]:
        """Every worker named in a block, with the line of its first mention."""
        names: dict[str, int] = {}
        for tp in self.tags.values():
            for b in tp.blocks:
                for w in b.workers or ():
                    names.setdefault(w, b.line or 0)
        return names

    def check_workers(self, known: Iterable[str]) -> list[Problem]:
        """Problems for workers the policy names but `known` does not contain."""
        known = set(known)
        return [Problem(line, "workers", f"worker {name!r} is not one of the known workers "
                                          f"({', '.join(sorted(known)) or 'none'})")
                for name, line in self.worker_names().items() if name not in known]
