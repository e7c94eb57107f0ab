"""Turn a PyYAML syntax error into one line number and a reason a user can act on.

PyYAML reports two places: `problem_mark`, where parsing failed, and `context_mark`,
where the construct it was inside started ("while parsing a flow sequence"). For a
construct left open — a `[` or `{` never closed, a quote never ended, a key without
its `:` — the mistake is where it started, and parsing may fail many lines later, so
the start is the line we report; the reason names both. Inside block collections
(indentation) the context is the whole enclosing list or map, possibly the top of the
file, so there the failing line is reported and the start is named in the reason.

    line, reason = describe(exc)
    # (2, "the '[' opened on line 2 is never closed (parsing stopped on line 3: expected ',' or ']',
    #      but got ':'): close it with ']' on line 2")
"""
from __future__ import annotations

from typing import Optional

import yaml

# context text of PyYAML -> (what was left open, how to fix it)
_OPEN = {
    "while parsing a flow sequence": ("the '[' opened on line {c} is never closed", "close it with ']' on line {c}"),
    "while parsing a flow mapping": ("the '{{' opened on line {c} is never closed", "close it with '}}' on line {c}"),
    "while scanning a quoted scalar": ("the quoted text opened on line {c} is never closed",
                                       "end it with the same quote on line {c}"),
    "while scanning a simple key": ("the key on line {c} has no ':'", "write `key: value` on line {c}"),
}
# problem text of PyYAML -> a fix, for errors without an open construct
_HINTS = {
    "'\\t' that cannot start any token": "indent with spaces, not tabs",
    "mapping values are not allowed here": "a value holding ': ' must be quoted, or a nested map must start "
                                           "on its own line",
}


def _hint(problem: str) -> str:
    for text, fix in _HINTS.items():
        if text in problem:
            return f": {fix}"
    return ""


def describe(exc: yaml.YAMLError) -> tuple[Optional[int], str]:
    """(1-based line to report, reason) for a PyYAML error; line is None when PyYAML gives none."""
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    pmark = getattr(exc, "problem_mark", None)
    cmark = getattr(exc, "context_mark", None)
    p = pmark.line + 1 if pmark is not None else None
    c = cmark.line + 1 if cmark is not None else None
    failed = f"parsing stopped on line {p}: {problem}" if p is not None else problem
    if c is None:
        return p, f"not valid YAML: {problem}" + (f" ({context})" if context else "") + _hint(problem)
    opened = _OPEN.get(context or "")
    if opened is not None:
        what, fix = opened
        return c, f"not valid YAML: {what.format(c=c)} ({failed}): {fix.format(c=c)}"
    if p is None:
        return c, f"not valid YAML: {problem} ({context} that starts on line {c})"
    return p, f"not valid YAML: {problem} on line {p} ({context} that starts on line {c}; " \
              f"check the indentation between lines {min(c, p)} and {max(c, p)})"
