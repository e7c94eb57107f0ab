"""`skyfn policy check`: validate a policy file and explain decisions against a worker state.

    skyfn policy check policy.yaml                       # valid? warnings?
    skyfn policy check policy.yaml --tag divide --state state.yaml

The state file (YAML or JSON) lists workers as LiveState.from_mapping reads them:

    workers:
      w1: {capacity: 4, running: 1, tags: {impera: 1}}
      w2: {capacity: 4, tags: {heavy: 2}, queued: 3, warm: {py311: 1}, online: true}

Without --state, the workers the policy names are taken as idle. Without --tag but with a
state, every tag of the policy (and an untagged function) is explained.
Exit codes: 0 valid (and every explained decision found a worker), 1 invalid policy or
unreadable state, 2 valid but some explained decision found no worker.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from skyfn.placement.loader import load_policy_file
from skyfn.placement.model import PolicyError
from skyfn.placement.scheduler import Scheduler
from skyfn.placement.state import LiveState
from skyfn.placement.yaml_errors import describe as describe_yaml_error


@dataclass
class CheckReport:
    exit_code: int = 0
    lines: list[str] = field(default_factory=list)       # stdout
    errors: list[str] = field(default_factory=list)      # stderr
    data: dict[str, Any] = field(default_factory=dict)   # --json


def load_state(path: str) -> LiveState:
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read state file {p}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        line, reason = describe_yaml_error(exc)
        where = f":{line}" if line else ""
        raise ValueError(f"state file {p}{where}: {reason.replace('not valid YAML', 'not valid YAML/JSON', 1)}") \
            from None
    if raw is None:
        raise ValueError(f"state file {p} is empty: list workers as `workers: {{w1: {{capacity: 4}}}}`")
    return LiveState.from_mapping(raw, source=str(p))


def check(path: str, tags: Optional[list[str]] = None, state_path: Optional[str] = None,
          container: Optional[str] = None, untagged: bool = False) -> CheckReport:
    report = CheckReport()
    try:
        policy = load_policy_file(path)
    except PolicyError as exc:
        report.exit_code = 1
        report.errors.extend(f"{path}:{p.line or '-'}: {p.key + ': ' if p.key else ''}{p.reason}"
                             for p in exc.problems)
        report.errors.append(f"{path}: rejected ({len(exc.problems)} problem{'s' * (len(exc.problems) != 1)}); "
                             "nothing was loaded")
        report.data = {"valid": False, "problems": exc.details()}
        return report
    names = list(policy.tags)
    report.lines.append(f"{path}: valid, {len(names)} tag{'s' * (len(names) != 1)} ({', '.join(names)})")
    for w in policy.warnings:
        report.lines.append(f"{path}:{w.line}: warning: {w.key}: {w.reason}")
    report.data = {"valid": True, "tags": names, "warnings": [w.as_dict() for w in policy.warnings],
                   "decisions": []}
    if not tags and not state_path and not untagged:
        return report
    if state_path:
        try:
            state = load_state(state_path)
        except ValueError as exc:
            report.exit_code = 1
            report.errors.append(str(exc))
            return report
        for problem in policy.check_workers(state.names()):
            report.lines.append(f"{path}:{problem.line}: warning: {problem.key}: {problem.reason}")
    else:
        state = LiveState()
        for name in policy.worker_names():
            state.upsert(name)
        report.lines.append(f"(no --state: the {len(state)} worker(s) the policy names, idle"
                            + (f": {', '.join(state.names())})" if len(state) else ")"))
    asked: list[Optional[str]] = list(tags) if tags else []
    if untagged or (not tags and state_path):
        if not tags:
            asked = [*names]
        asked.append(None)
    scheduler = Scheduler(policy, state, seed=0)
    for tag in asked:
        decision = scheduler.decide(tag, container=container, explain=True)
        report.lines.append("")
        report.lines.extend(decision.explain().splitlines())
        report.data["decisions"].append(decision.as_dict())
        if not decision.ok:
            report.exit_code = 2
    return report
