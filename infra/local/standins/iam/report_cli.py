"""The least-privilege report of a runtime started from the templates (issue 25):

    python -m infra.local.standins.iam.report_cli --home <SKYFN_HOME> [--markdown] [--cdk-out DIR]

reads the access log the enforced moto wrote (`<home>/local/templates/iam-access.jsonl`)
and the roles' policies, rebuilt from the cloud assembly the runtime was started from
(`from_templates` in `<home>/local/runtime.json`, or --cdk-out), and prints per function
(the functions of the templates mapped to their roles through their role ARN): the actions
its role's policies allow (as written, wildcards kept), the actions it used, those allowed
but never used, and the requests refused. The principals of the log that are no function's
session (the deployer, the agents' sessions of the agent role) follow, as "other principals".

Exit code: 0 when no request was refused, 1 when any was (with the refusals printed last,
one line each), 2 when there is nothing to report on (no runtime from the templates)."""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from infra.local.standins.iam import policy as iam_policy
from infra.local.standins.iam import report as iam_report
from infra.local.standins.iam import roles as iam_roles


class ReportError(Exception):
    """Nothing to report on; the message says why and what to do."""


@dataclass
class FunctionReport:
    """One function (or, with `function` empty, one principal that is no function's session)."""
    function: str
    role: str
    principals: list[str] = field(default_factory=list)
    allowed_actions: list[str] = field(default_factory=list)   # as the role's policies write them
    managed_policies: list[str] = field(default_factory=list)  # attached managed policy ARNs (not expanded)
    used_actions: list[str] = field(default_factory=list)      # actions of allowed requests
    unused_allowed: list[str] = field(default_factory=list)    # allowed patterns no used action matches
    refused: list[dict] = field(default_factory=list)          # {principal, action, resource, reason, count}

    @property
    def name(self) -> str:
        return self.function or (self.principals[0] if self.principals else self.role)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# -- building the report (pure: log entries, role specs, functions) ---------------------------

def build(entries: Iterable[dict], specs: Iterable[Any], functions: dict[str, str]) -> list[FunctionReport]:
    """Per function of `functions` ({function name: role name}), then per other principal
    of the log. `specs` are infra.local.standins.iam.roles.RoleSpec's (name, policies, managed ARNs).
    A request is the function's when its principal is a session of the function's role
    named after the function, or any session of a role only that function has."""
    specs = list(specs)
    policies = iam_report.roles_policies(specs)
    managed = {s.name: list(getattr(s, "managed_policy_arns", []) or []) for s in specs}
    by_role: dict[str, list[str]] = {}
    for fn, role in functions.items():
        by_role.setdefault(role, []).append(fn)

    used: dict[str, set[str]] = {}
    refused: dict[str, Counter] = {}
    principals: dict[str, list[str]] = {}
    roles: dict[str, str] = {}

    def owner(principal: str) -> str:
        role, session = iam_report.split_principal(principal)
        if session in functions and functions[session] == role:
            return session
        if len(by_role.get(role, [])) == 1 and principal.split(":", 5)[-1].startswith("assumed-role/"):
            return by_role[role][0]
        return "principal:" + principal

    for e in entries:
        principal = e.get("principal", "")
        key = owner(principal)
        roles.setdefault(key, iam_report.split_principal(principal)[0])
        used.setdefault(key, set())
        refused.setdefault(key, Counter())
        if principal not in principals.setdefault(key, []):
            principals[key].append(principal)
        if e.get("allowed"):
            used[key].add(e.get("action", ""))
        else:
            refused[key][(principal, e.get("action", ""), e.get("resource", ""), e.get("reason", ""))] += 1

    out = []
    keys = sorted(functions) + sorted(k for k in used if k.startswith("principal:"))
    for key in keys:
        is_function = not key.startswith("principal:")
        role = functions[key] if is_function else roles[key]
        allowed = iam_policy.allowed_actions(policies.get(role, []))
        actions = sorted(used.get(key, ()))
        unused = [a for a in allowed if not a.startswith("NotAction:")
                  and not any(iam_policy.action_matches(a, u) for u in actions)]
        out.append(FunctionReport(
            function=key if is_function else "", role=role, principals=principals.get(key, []),
            allowed_actions=allowed, managed_policies=managed.get(role, []), used_actions=actions,
            unused_allowed=unused,
            refused=[{"principal": p, "action": a, "resource": r, "reason": why, "count": n}
                     for (p, a, r, why), n in sorted(refused.get(key, Counter()).items())]))
    return out


def refused_lines(reports: Iterable[FunctionReport]) -> list[str]:
    """Every refused request, one line each, naming the function (or principal) and action."""
    lines = []
    for r in reports:
        for x in r.refused:
            _, session = iam_report.split_principal(x["principal"])
            who = r.function or session or x["principal"]
            lines.append(f"{who} (role {r.role}): {x['action']} on {x['resource']} refused {x['reason']}"
                         + (f" (x{x['count']})" if x["count"] > 1 else ""))
    return lines


# -- formatting -------------------------------------------------------------------------------

def _list(items: list[str]) -> str:
    return ", ".join(items) or "-"


def format_text(reports: list[FunctionReport]) -> str:
    out = []
    for r in reports:
        title = f"{r.function}  (role {r.role})" if r.function else f"{r.name}  (other principal, role {r.role})"
        out.append(title)
        if r.function and not r.principals:
            out.append("  (made no request in this run)")
        out.append(f"  allowed by its policies: {_list(r.allowed_actions)}")
        if r.managed_policies:
            out.append(f"  managed policies:        {_list(r.managed_policies)}")
        out.append(f"  used:                    {_list(r.used_actions)}")
        out.append(f"  allowed, never used:     {_list(r.unused_allowed)}")
        for x in r.refused:
            out.append(f"  REFUSED {x['action']} on {x['resource']} {x['reason']} (x{x['count']})")
        out.append("")
    refusals = refused_lines(reports)
    out.append(f"{len(refusals)} refused request(s)" + (":" if refusals else ""))
    out.extend(f"  {line}" for line in refusals)
    return "\n".join(out)


def _code(items: list[str]) -> str:
    return ", ".join(f"`{i}`" for i in items) or "-"


def format_markdown(reports: list[FunctionReport]) -> str:
    out = ["# Least privilege: the functions' roles against their use", "",
           "| function | role | allowed | used | allowed, never used | refused |",
           "|---|---|---:|---:|---:|---:|"]
    for r in reports:
        out.append(f"| {r.function or r.name + ' (other)'} | `{r.role}` | {len(r.allowed_actions)} | "
                   f"{len(r.used_actions)} | {len(r.unused_allowed)} | {sum(x['count'] for x in r.refused)} |")
    for r in reports:
        out += ["", f"## {r.function or r.name}", "", f"- role: `{r.role}`"]
        if r.function and not r.principals:
            out.append("- made no request in this run")
        out.append(f"- allowed by its policies: {_code(r.allowed_actions)}")
        if r.managed_policies:
            out.append(f"- managed policies: {_code(r.managed_policies)}")
        out.append(f"- used: {_code(r.used_actions)}")
        out.append(f"- allowed, never used: {_code(r.unused_allowed)}")
        if r.refused:
            out += ["", "| refused action | resource | reason | count |", "|---|---|---|---:|"]
            out += [f"| `{x['action']}` | `{x['resource']}` | {x['reason']} | {x['count']} |" for x in r.refused]
    refusals = refused_lines(reports)
    out += ["", f"**{len(refusals)} refused request(s)**"]
    out += [f"- {line}" for line in refusals]
    return "\n".join(out)


# -- a runtime's home -------------------------------------------------------------------------

def access_log_path(home: Path) -> Path:
    from infra.local.state import StateDir

    return StateDir.at(home).workdir("templates") / "iam-access.jsonl"  # template_runtime.access_log's file


def _ours(handler: str) -> bool:
    """A handler of this repository (as template_runtime.ours: the CDK's own are not run locally)."""
    return handler.startswith(("lambdas.", "stepfunctions."))


def load_roles(home: Path, cdk_out: str | None = None) -> tuple[list[Any], dict[str, str]]:
    """The role specs and {function name: role name} of the assembly the runtime at `home`
    was started from (or `cdk_out`): the functions of this repository's handlers only."""
    from infra.local.state import StateDir
    from infra.local.templates import CloudAssembly, Deployment, LocalSettings

    record = StateDir.at(home).read_runtime()
    folder = cdk_out or record.get("from_templates")
    if not folder:
        raise ReportError(f"the runtime in {home} was not started from the templates (no \"from_templates\" in "
                          f"{StateDir.at(home).runtime_file}): start it with `skyfn local up --detach "
                          "--from-templates`, or give --cdk-out")
    try:
        dep = Deployment.from_assembly(CloudAssembly.load(Path(folder).expanduser().resolve()),
                                       LocalSettings(aws_endpoint_url=record.get("aws_endpoint")))
    except Exception as exc:  # noqa: BLE001 - one line for the user
        raise ReportError(f"cannot read the cloud assembly {folder}: {type(exc).__name__}: {exc}") from None
    specs = [iam_roles.role_spec(r) for r in dep.roles.values()]
    functions = {}
    for name, fn in dep.functions.items():
        if not _ours(fn.handler):
            continue
        role = dep.role_by_arn(fn.role_arn)
        functions[name] = role.name if role else fn.role_arn.rsplit("/", 1)[-1]
    return specs, functions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.local.standins.iam.report_cli", description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", default=None, help="the runtime's SKYFN_HOME (default: $SKYFN_HOME or ~/.skyfn)")
    parser.add_argument("--markdown", action="store_true", help="print Markdown instead of plain text")
    parser.add_argument("--cdk-out", default=None, help="the cloud assembly (default: the one the runtime ran)")
    parser.add_argument("--log", default=None, help="the access log (default: <home>/local/templates/iam-access.jsonl)")
    args = parser.parse_args(argv)
    from infra.local.state import StateDir

    home = StateDir.at(args.home).home
    try:
        specs, functions = load_roles(home, args.cdk_out)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    log = Path(args.log) if args.log else access_log_path(home)
    if not log.exists():
        print(f"error: no access log at {log}: the runtime has not made an IAM-checked request yet", file=sys.stderr)
        return 2
    reports = build(iam_report.read_log(log), specs, functions)
    print(format_markdown(reports) if args.markdown else format_text(reports))
    return 1 if any(r.refused for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
