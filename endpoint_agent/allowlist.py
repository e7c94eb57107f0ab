"""`allowed_functions` in an endpoint's config.yaml: parsing (errors name the line and the
reason) and the agent's check of each task before anything of it is deserialized.

    allowed_functions:
      - 0f8fad5b-d9cb-469f-a165-70867728950e      # a function id (Client.register_function)
      - {owner: alice, name: simulate}            # any function alice registered as "simulate"

The wire shape and the matching rule are skyfn.protocol.allowlist's, shared with the service.
An entry of owner and name is matched against the owner and name the service states in the
task pack (`function_meta`); a pack that does not state them matches id entries only.
"""
from __future__ import annotations

from typing import Any, Optional

import yaml
from pydantic import ValidationError

from skyfn.protocol.allowlist import MAX_ALLOWED_FUNCTIONS, AllowedFunction, permits, refusal

KEY = "allowed_functions"
EXAMPLE = "0f8fad5b-d9cb-469f-a165-70867728950e"


class AllowlistError(ValueError):
    """A bad entry: `index` is its position in the list (None: the key itself)."""

    def __init__(self, index: Optional[int], reason: str):
        super().__init__(reason)
        self.index = index
        self.reason = reason


def _entry(index: int, raw: Any) -> AllowedFunction:
    if isinstance(raw, str):
        data: Any = {"function_id": raw.strip()}
    elif isinstance(raw, dict):
        unknown = sorted(str(k) for k in raw if k not in ("function_id", "owner", "name"))
        if unknown:
            raise AllowlistError(index, f"unknown key {unknown[0]!r}; an entry is a function id or a mapping "
                                        "{owner: USER, name: FUNCTION_NAME}")
        bad = [k for k, v in raw.items() if not isinstance(v, str)]
        if bad:
            raise AllowlistError(index, f"{bad[0]} must be a string, got {type(raw[bad[0]]).__name__} "
                                        f"{raw[bad[0]]!r}")
        data = raw
    else:
        raise AllowlistError(index, f"expected a function id (a UUID such as {EXAMPLE}) or a mapping "
                                    f"{{owner: USER, name: FUNCTION_NAME}}, got {type(raw).__name__} {raw!r}")
    try:
        return AllowedFunction.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err.get("loc", ()))
        if field == "function_id" and err.get("type") == "string_pattern_mismatch":
            raise AllowlistError(index, f"{raw!r} is not a function id: function ids are UUIDs such as {EXAMPLE} "
                                        "(Client.register_function returns them); to allow a function by name "
                                        "write {owner: USER, name: FUNCTION_NAME}") from None
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        raise AllowlistError(index, f"{field + ': ' if field else ''}{msg}") from None


def parse_entries(value: Any) -> Optional[list[AllowedFunction]]:
    """The entries of `allowed_functions` (None: the key is absent or null: no restriction)."""
    if value is None:
        return None
    if isinstance(value, (str, dict)) or not isinstance(value, (list, tuple)):
        raise AllowlistError(None, f"expected a list of entries (function ids or {{owner, name}} mappings), got "
                                   f"{type(value).__name__} {value!r}")
    if len(value) > MAX_ALLOWED_FUNCTIONS:
        raise AllowlistError(None, f"{len(value)} entries; at most {MAX_ALLOWED_FUNCTIONS}")
    out: list[AllowedFunction] = []
    for i, raw in enumerate(value):
        entry = raw if isinstance(raw, AllowedFunction) else _entry(i, raw)
        if entry not in out:
            out.append(entry)
    return out


def entry_lines(text: str) -> tuple[Optional[int], list[int]]:
    """(line of the key, line of each entry), 1-based, of `allowed_functions` in YAML text."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return None, []
    if not isinstance(root, yaml.MappingNode):
        return None, []
    for key, node in root.value:
        if isinstance(key, yaml.ScalarNode) and key.value == KEY:
            items = node.value if isinstance(node, yaml.SequenceNode) else []
            return key.start_mark.line + 1, [item.start_mark.line + 1 for item in items]
    return None, []


def describe_error(exc: AllowlistError, source: str, text: Optional[str] = None) -> str:
    """'<source> line N: allowed_functions entry i: <reason>' (the line when the text is known)."""
    key_line, lines = entry_lines(text) if text is not None else (None, [])
    line = key_line
    if exc.index is not None and exc.index < len(lines):
        line = lines[exc.index]
    where = f"{source} line {line}" if line else source
    what = f"{KEY} entry {exc.index + 1}" if exc.index is not None else KEY
    return f"invalid endpoint configuration: {where}: {what}: {exc.reason}"


class FunctionGate:
    """The agent's check: may this task's function run here? (None: yes; else the reason)."""

    def __init__(self, entries: Optional[list[AllowedFunction]], endpoint: str):
        self.entries = entries
        self.endpoint = endpoint
        self.logged: set[str] = set()  # functions whose refusal was logged (once each)

    @property
    def active(self) -> bool:
        return self.entries is not None

    def refuse(self, function_id: str, meta: Optional[dict[str, Any]] = None) -> Optional[str]:
        owner = meta.get("owner") if meta else None
        name = meta.get("name") if meta else None
        if permits(self.entries, function_id, owner, name):
            return None
        return refusal(self.endpoint, function_id, owner, name)

    def report(self) -> Optional[list[dict[str, str]]]:
        """What the agent tells the service (registration, heartbeats)."""
        if self.entries is None:
            return None
        return [e.model_dump(exclude_none=True) for e in self.entries]
