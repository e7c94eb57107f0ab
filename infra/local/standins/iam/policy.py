"""AWS IAM policy evaluation, as the IAM User Guide describes it, for the embedded
runtime's enforced moto (infra.local.standins.iam.moto_resources) and the least-privilege report.

A request is (action, resource, context); a policy document applies to it through its
statements: Action/NotAction (case-insensitive, wildcards * and ?), Resource/NotResource
(case-sensitive wildcards; a statement without either -- a trust policy -- applies to any
resource), Principal/NotPrincipal when a caller is given (trust policies), and Condition.
A condition key absent from the request context makes its condition false, except for the
negated operators (true), ...IfExists (true) and Null (tests presence): a condition that
cannot be evaluated only keeps its own statement from applying, never turns into a deny of
anything else. `evaluate` answers ALLOW, DENY (an explicit Deny applies) or IMPLICIT
(nothing allows it)."""
from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, Iterable

ALLOW, DENY, IMPLICIT = "allow", "explicit-deny", "implicit-deny"


def as_list(value: Any) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple, set)) else [value]


def load(document: Any) -> dict:
    """A policy document from JSON text (URL-encoded as IAM returns it, or not) or a dict."""
    if isinstance(document, dict):
        return document
    text = str(document)
    if text.lstrip().startswith("%7B") or text.lstrip().startswith("%7b"):
        from urllib.parse import unquote

        text = unquote(text)
    return json.loads(text)


@lru_cache(maxsize=4096)
def _glob(pattern: str, ignore_case: bool) -> re.Pattern:
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(f"^{body}$", re.IGNORECASE | re.DOTALL if ignore_case else re.DOTALL)


def wildcard_match(pattern: str, value: str, ignore_case: bool = False) -> bool:
    return _glob(str(pattern), ignore_case).match(str(value)) is not None


def action_matches(pattern: str, action: str) -> bool:
    return wildcard_match(pattern, action, ignore_case=True)


def resource_matches(pattern: str, resource: str) -> bool:
    return pattern == "*" or wildcard_match(pattern, resource)


@dataclass(frozen=True)
class Caller:
    """Who makes a request, as a trust policy's Principal sees it: `arn` (an IAM user's
    ARN or an assumed-role session's), `role_arn` (a session's role: a Principal naming the
    role matches its sessions), `account`, and `services` the caller stands in for (an AWS
    service principal such as lambda.amazonaws.com assuming a role)."""
    arn: str
    account: str
    role_arn: str | None = None
    services: frozenset = field(default_factory=frozenset)


NO_MATCH, ACCOUNT_MATCH, SPECIFIC_MATCH = 0, 1, 2


def principal_match(principal: Any, caller: Caller) -> int:
    """How a statement's Principal names `caller`: SPECIFIC_MATCH (its ARN, its role's ARN,
    a service it stands in for), ACCOUNT_MATCH ("*", its account, the account's root: the
    caller's own policies must allow too), else NO_MATCH."""
    if principal == "*":
        return ACCOUNT_MATCH
    if not isinstance(principal, dict):
        return NO_MATCH
    best = NO_MATCH
    for value in as_list(principal.get("AWS")):
        value = str(value)
        if value == "*" or value == caller.account or value.endswith(f":iam::{caller.account}:root"):
            best = max(best, ACCOUNT_MATCH)
        elif value in (caller.arn, caller.role_arn):
            best = SPECIFIC_MATCH
    for value in as_list(principal.get("Service")):
        if value in caller.services or "*" in caller.services:
            best = SPECIFIC_MATCH
    return best


def statement_applies(statement: dict, action: str, resource: str, context: dict | None = None,
                      caller: Caller | None = None) -> int:
    """0 if `statement` does not apply to the request, else the principal match level
    (SPECIFIC_MATCH when no caller is checked)."""
    if "NotAction" in statement:
        if any(action_matches(p, action) for p in as_list(statement["NotAction"])):
            return 0
    elif not any(action_matches(p, action) for p in as_list(statement.get("Action"))):
        return 0
    if "NotResource" in statement:
        if any(resource_matches(p, resource) for p in as_list(statement["NotResource"])):
            return 0
    elif "Resource" in statement:
        if not any(resource_matches(p, resource) for p in as_list(statement["Resource"])):
            return 0
    level = SPECIFIC_MATCH
    if caller is not None:
        if "NotPrincipal" in statement:
            level = NO_MATCH if principal_match(statement["NotPrincipal"], caller) else ACCOUNT_MATCH
        else:
            level = principal_match(statement.get("Principal"), caller)
        if level == NO_MATCH:
            return 0
    if not conditions_hold(statement.get("Condition") or {}, context or {}):
        return 0
    return level


def statements(document: Any) -> list[dict]:
    return [s for s in as_list(load(document).get("Statement")) if isinstance(s, dict)]


def evaluate(documents: Iterable[Any], action: str, resource: str, context: dict | None = None,
             caller: Caller | None = None) -> tuple[str, int]:
    """(decision, principal match level of the best Allow) over the documents together."""
    allowed = 0
    for document in documents:
        for statement in statements(document):
            level = statement_applies(statement, action, resource, context, caller)
            if not level:
                continue
            if statement.get("Effect") == "Deny":
                return DENY, 0
            if statement.get("Effect") == "Allow":
                allowed = max(allowed, level)
    return (ALLOW if allowed else IMPLICIT), allowed


def allowed_actions(documents: Iterable[Any]) -> list[str]:
    """The actions of the documents' Allow statements as written (wildcards kept)."""
    found: dict[str, None] = {}
    for document in documents:
        for statement in statements(document):
            if statement.get("Effect") == "Allow":
                for action in as_list(statement.get("Action")):
                    found[str(action)] = None
                for action in as_list(statement.get("NotAction")):
                    found[f"NotAction:{action}"] = None
    return list(found)


# -- conditions ---------------------------------------------------------------------------

def _str_eq(policy: str, value: str) -> bool:
    return policy == value


def _str_eq_ic(policy: str, value: str) -> bool:
    return policy.lower() == value.lower()


def _str_like(policy: str, value: str) -> bool:
    return wildcard_match(policy, value)


def _num(op):
    def compare(policy: str, value: str) -> bool:
        try:
            return op(float(value), float(policy))
        except ValueError:
            return False
    return compare


def _when(text: str) -> datetime:
    text = str(text)
    if re.fullmatch(r"-?\d+(\.\d+)?", text):
        return datetime.fromtimestamp(float(text), timezone.utc)
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _date(op):
    def compare(policy: str, value: str) -> bool:
        try:
            return op(_when(value), _when(policy))
        except ValueError:
            return False
    return compare


def _bool(policy: str, value: str) -> bool:
    return str(policy).lower() == str(value).lower()


def _ip(policy: str, value: str) -> bool:
    try:
        return ipaddress.ip_address(value) in ipaddress.ip_network(policy, strict=False)
    except ValueError:
        return False


def _arn_like(policy: str, value: str) -> bool:
    # ARNs compare segment by segment: a wildcard does not cross the first five colons.
    p_parts, v_parts = policy.split(":", 5), value.split(":", 5)
    if len(p_parts) != len(v_parts):
        return False
    return all(wildcard_match(p, v) for p, v in zip(p_parts, v_parts))


# operator -> (per-value match, negated)
_OPERATORS = {
    "StringEquals": (_str_eq, False), "StringNotEquals": (_str_eq, True),
    "StringEqualsIgnoreCase": (_str_eq_ic, False), "StringNotEqualsIgnoreCase": (_str_eq_ic, True),
    "StringLike": (_str_like, False), "StringNotLike": (_str_like, True),
    "NumericEquals": (_num(lambda a, b: a == b), False), "NumericNotEquals": (_num(lambda a, b: a == b), True),
    "NumericLessThan": (_num(lambda a, b: a < b), False),
    "NumericLessThanEquals": (_num(lambda a, b: a <= b), False),
    "NumericGreaterThan": (_num(lambda a, b: a > b), False),
    "NumericGreaterThanEquals": (_num(lambda a, b: a >= b), False),
    "DateEquals": (_date(lambda a, b: a == b), False), "DateNotEquals": (_date(lambda a, b: a == b), True),
    "DateLessThan": (_date(lambda a, b: a < b), False), "DateLessThanEquals": (_date(lambda a, b: a <= b), False),
    "DateGreaterThan": (_date(lambda a, b: a > b), False),
    "DateGreaterThanEquals": (_date(lambda a, b: a >= b), False),
    "Bool": (_bool, False),
    "IpAddress": (_ip, False), "NotIpAddress": (_ip, True),
    "ArnEquals": (_arn_like, False), "ArnLike": (_arn_like, False),
    "ArnNotEquals": (_arn_like, True), "ArnNotLike": (_arn_like, True),
}


def _context_values(context: dict, key: str) -> list[str] | None:
    for k, v in context.items():
        if k.lower() == key.lower():  # condition keys are case-insensitive
            return [str(x).lower() if isinstance(x, bool) else str(x) for x in as_list(v)]
    return None


def condition_holds(operator: str, key: str, policy_values: Any, context: dict) -> bool:
    qualifier, _, op = operator.rpartition(":")
    values = _context_values(context, key)
    if op == "Null":
        wanted = str(as_list(policy_values)[0]).lower() == "true"
        return (not values) == wanted
    if_exists = op.endswith("IfExists")
    op = op[:-len("IfExists")] if if_exists else op
    if op not in _OPERATORS:
        return False  # IAM rejects unknown operators when a policy is stored
    match, negated = _OPERATORS[op]
    wanted = [str(p).lower() if isinstance(p, bool) else str(p) for p in as_list(policy_values)]

    def one(value: str) -> bool:
        hit = any(match(p, value) for p in wanted)
        return not hit if negated else hit

    if not values:
        if qualifier == "ForAllValues":
            return True
        if qualifier == "ForAnyValue":
            return False
        return if_exists or negated
    if qualifier == "ForAllValues":
        return all(one(v) for v in values)
    if qualifier == "ForAnyValue" or not negated:
        return any(one(v) for v in values)
    return all(one(v) for v in values)  # negated on a multivalued key: none may match


def conditions_hold(condition: dict, context: dict) -> bool:
    return all(condition_holds(operator, key, values, context)
               for operator, keys in condition.items() for key, values in (keys or {}).items())
