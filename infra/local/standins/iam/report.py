"""Least privilege from the access log the enforced moto writes ($SKYFN_IAM_ACCESS_LOG,
infra.local.standins.iam.moto_resources): for each principal -- a function's session
`assumed-role/<role>/<function name>` -- the actions its role's policies allow (as
written, wildcards kept), the actions it used, those allowed but never used, and the
requests refused."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from infra.local.standins.iam import policy as iam_policy


def read_log(path: str | Path) -> list[dict]:
    entries = []
    p = Path(path)
    if not p.exists():
        return entries
    for line in p.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a crash mid-write
    return entries


def split_principal(arn: str) -> tuple[str, str]:
    """(role or user name, session name or "") of a principal ARN."""
    resource = arn.split(":", 5)[-1]
    if resource.startswith("assumed-role/"):
        _, role, session = (resource.split("/", 2) + ["", ""])[:3]
        return role, session
    return resource.rsplit("/", 1)[-1], ""


@dataclass
class PrincipalUsage:
    principal: str
    role: str
    session: str
    allowed_actions: list[str] = field(default_factory=list)   # as the role's policies write them
    used_actions: list[str] = field(default_factory=list)      # allowed requests' actions
    unused_allowed: list[str] = field(default_factory=list)    # allowed patterns no used action matches
    refused: list[dict] = field(default_factory=list)          # {action, resource, reason, count}

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def usage(entries: Iterable[dict], role_policies: dict[str, list[Any]]) -> list[PrincipalUsage]:
    """Per principal of the log, with `role_policies` = {role name: [policy documents]}
    (e.g. roles_policies(specs)); principals of roles not given get no allowed actions."""
    used: dict[str, set[str]] = {}
    refused: dict[str, Counter] = {}
    for e in entries:
        p = e.get("principal", "")
        used.setdefault(p, set())
        refused.setdefault(p, Counter())
        if e.get("allowed"):
            used[p].add(e["action"])
        else:
            refused[p][(e.get("action", ""), e.get("resource", ""), e.get("reason", ""))] += 1
    out = []
    for principal in sorted(used):
        role, session = split_principal(principal)
        allowed = iam_policy.allowed_actions(role_policies.get(role, []))
        actions = sorted(used[principal])
        unused = [a for a in allowed if not a.startswith("NotAction:")
                  and not any(iam_policy.action_matches(a, u) for u in actions)]
        out.append(PrincipalUsage(
            principal=principal, role=role, session=session, allowed_actions=allowed, used_actions=actions,
            unused_allowed=unused,
            refused=[{"action": a, "resource": r, "reason": why, "count": n}
                     for (a, r, why), n in sorted(refused[principal].items())]))
    return out


def roles_policies(specs: Iterable[Any]) -> dict[str, list[dict]]:
    """{role name: its inline policy documents} of infra.local.standins.iam.roles.RoleSpec's."""
    return {s.name: [doc for _, doc in s.policies] for s in specs}


def refusals(entries: Iterable[dict]) -> list[str]:
    """The refused requests, one readable line each (repeats counted)."""
    counts = Counter((e.get("principal", ""), e.get("action", ""), e.get("resource", ""), e.get("reason", ""))
                     for e in entries if not e.get("allowed"))
    lines = []
    for (principal, action, resource, why), n in sorted(counts.items()):
        role, session = split_principal(principal)
        who = f"{session} (role {role})" if session else role
        lines.append(f"{who}: {action} on {resource} refused {why}" + (f" (x{n})" if n > 1 else ""))
    return lines


def format_report(report: list[PrincipalUsage]) -> str:
    """A plain-text least-privilege report."""
    out = []
    for u in report:
        out.append(f"{u.session or u.role}  ({u.principal})")
        out.append(f"  allowed by its policies: {', '.join(u.allowed_actions) or '-'}")
        out.append(f"  used:                    {', '.join(u.used_actions) or '-'}")
        out.append(f"  allowed, never used:     {', '.join(u.unused_allowed) or '-'}")
        for r in u.refused:
            out.append(f"  REFUSED {r['action']} on {r['resource']} {r['reason']} (x{r['count']})")
    return "\n".join(out)
