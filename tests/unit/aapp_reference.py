"""The aAPP paper's scheduling algorithm (Listing 1: `schedule` and `valid`), transcribed as
plain Python to serve as the reference for skyfn's engine in test_placement_differential.py.

De Palma, Giallorenzo, Mauro, Trentin, Zavattaro, "Affinity-aware Serverless Function
Scheduling" (ICSA 2025, arXiv:2407.14572; also "Function Scheduling in OpenWhisk with aAPP").
The listing's text could not be retrieved here, so this follows the algorithm as the paper
describes it (and docs/placement.md restates it):

  schedule(f, conf):  take the blocks of f's tag (the `default` tag for an untagged function
      or a tag the script does not define); walk them top to bottom; in each block keep the
      block's workers (`*`: every worker) that are `valid`; if any is, the block's strategy
      picks one — `best_first` the first in the block's order, `any` one at random. When no
      block yields a worker, the tag's followup decides: `default` schedules f with the
      `default` tag's blocks, `fail` fails. The default tag's own followup is `fail`.
  valid(f, w, block, conf):  w has the memory f needs; no invalidation condition of the
      block holds (`capacity_used p%`: w's used memory is at least p% of its memory;
      `max_concurrent_invocations n`: w runs at least n functions); and for the block's
      affinity, every `t` has a function tagged t running on w and every `!t` has none.

Only the adaptations skyfn's model forces are made, each a parameter named where it is
used (the differential test states why):
  - memory is counted in slots: every function needs one unit and a worker's memory is its
    slot count (skyfn's `capacity`); `memory=None` is a worker whose size is unknown, for
    which the memory check and `capacity_used` do not apply;
  - `memory_check=False` leaves the memory check out (skyfn's service level queues work on
    a full endpoint);
  - a script without a `default` tag falls back to `- workers: *` (strategy any).

Data: a script is {tag: {"blocks": [block, ...], "followup": "default" | "fail"}}; a block is
{"workers": None (for `*`) or [names], "strategy": "any" | "best_first", "capacity_used":
percent or None, "max_concurrent_invocations": n or None, "affinity": [(tag, wanted), ...]};
conf is a list of workers in configuration order, each {"name", "memory", "functions": [tag
or None for each running function]}.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Optional

DEFAULT = "default"
IMPLICIT_DEFAULT = {"blocks": [{"workers": None, "strategy": "any", "capacity_used": None,
                                "max_concurrent_invocations": None, "affinity": []}], "followup": "fail"}


@dataclass
class Walked:
    """One block the algorithm looked at: whose, which (1-based) and its valid workers in order."""

    tag: str
    number: int
    valid: list[str]


@dataclass
class Outcome:
    worker: Optional[str]              # None: fail
    tag: Optional[str] = None          # the tag whose block chose ("default" also for the implicit one)
    block: Optional[int] = None
    candidates: list[str] = field(default_factory=list)   # the choosing block's valid workers
    walked: list[Walked] = field(default_factory=list)


def valid(f_memory: int, w: dict, block: dict, memory_check: bool = True) -> bool:
    used = len(w["functions"])
    memory = w["memory"]
    if memory is not None:
        if memory_check and memory - used < f_memory:
            return False
        p = block["capacity_used"]
        if p is not None and Fraction(used * 100) >= Fraction(str(p)) * memory:
            return False
    n = block["max_concurrent_invocations"]
    if n is not None and used >= n:
        return False
    for tag, wanted in block["affinity"]:
        present = tag in w["functions"]
        if present != wanted:
            return False
    return True


def schedule(f_tag: Optional[str], script: dict, conf: list[dict], rng: random.Random, *,
             f_memory: int = 1, memory_check: bool = True) -> Outcome:
    by_name = {w["name"]: w for w in conf}
    name = f_tag if f_tag is not None and f_tag in script else DEFAULT
    walked: list[Walked] = []
    while True:
        tag = script.get(name, IMPLICIT_DEFAULT)
        for number, block in enumerate(tag["blocks"], 1):
            workers = conf if block["workers"] is None else [by_name[n] for n in block["workers"] if n in by_name]
            ok = [w["name"] for w in workers if valid(f_memory, w, block, memory_check)]
            walked.append(Walked(name, number, ok))
            if ok:
                chosen = ok[0] if block["strategy"] == "best_first" else rng.choice(ok)
                return Outcome(chosen, name, number, ok, walked)
        followup = "fail" if name == DEFAULT else tag["followup"]
        if followup == "default":
            name = DEFAULT
            continue
        return Outcome(None, walked=walked)
