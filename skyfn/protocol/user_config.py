"""The rules of a submission's `user_config`: the submitter's variables for a multi-user
endpoint's user config template (DESIGN.md section 12; TaskPack.user_config). The service
refuses a user_config that breaks them (400) and the SDK checks them before it sends one,
with the same message: what is wrong and how to fix it.

A user_config is a JSON object, at most MAX_USER_CONFIG_BYTES once encoded (compact UTF-8
JSON) and nested at most MAX_USER_CONFIG_DEPTH deep (the object itself is depth 1; every
object or list inside it adds one).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

MAX_USER_CONFIG_BYTES = 16 << 10
MAX_USER_CONFIG_DEPTH = 8
_FIX = "Executor(user_config={...}) / Client.run(..., user_config={...})"


def problem(value: Any) -> Optional[str]:
    """None when `value` is a valid user_config, else the message that says why and what to send."""
    if not isinstance(value, dict):
        return (f"user_config must be a JSON object of template variables (e.g. {{\"account\": \"proj1\", "
                f"\"cores\": 4}}), not {_json_type(value)}: pass a dict to {_FIX}")
    try:
        depth = _depth(value)
    except TypeError as exc:
        return f"user_config must be JSON data: {exc}"
    if depth > MAX_USER_CONFIG_DEPTH:
        return (f"user_config nests deeper than {MAX_USER_CONFIG_DEPTH} levels of objects and lists: flatten it "
                f"(template variables are usually plain values, or one level of objects)")
    try:
        encoded = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                             check_circular=False).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError) as exc:
        return (f"user_config must be JSON data (objects with string keys, lists, strings, numbers, booleans, "
                f"null): {exc}")
    if len(encoded) > MAX_USER_CONFIG_BYTES:
        return (f"user_config is {len(encoded)} bytes encoded, over the limit of {MAX_USER_CONFIG_BYTES} bytes: "
                "send only the template's variables, and pass data to the function as arguments instead")
    return None


def _depth(value: Any) -> int:
    """Nesting depth of objects and lists, counted no further than one past the limit
    (a hostile document may nest thousands deep). TypeError for a key that is not a string
    (JSON would turn it into one silently)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    raise TypeError(f"object keys must be strings, not {type(key).__name__} ({key!r:.40})")
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if level > MAX_USER_CONFIG_DEPTH:
            return level
        stack.extend((child, level + 1) for child in children)
    return deepest


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    return f"a {type(value).__name__}"


def config_key(value: Optional[dict]) -> str:
    """A short, stable name of a user_config, the same at the service and the endpoint: a
    multi-user endpoint's lanes are bound to (identity, config_key) (skyfn.protocol.lanes)."""
    if value is None:
        return "none"
    encoded = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(encoded.encode()).hexdigest()[:16]
