"""The service's Lua scripts as files (lambdas/adapters/redis_store/lua/*.lua): their headers,
the include step that puts shared pieces in front of a script, and their registration.

A script is `lua/<name>.lua`; a shared piece is `lua/_<name>.lua` (local functions only, never
run alone). Each file opens with a header of `--` lines, after the flags line Redis wants
first (`#!lua flags=allow-oom`) where there is one:

    -- <name>: what the script does, in a line or more
    -- KEYS[1]      leases                     the lease deadlines (zset)
    -- KEYS[2..]    t:<task>                   a task record per row, in the rows' order
    -- ARGV[1]      rows                       JSON list of FinishRow
    -- built: done:<owner>                     the owner is read from the record
    -- include: bulk, prev
    -- row: FinishRow

`KEYS[n]` / `ARGV[n]` name one argument, `KEYS[n..]` all from n on. `built:` lists a key the
script makes inside Lua (a prefix and what follows it) and says why it cannot be passed in
KEYS; a cluster-mode Redis needs every other key in KEYS. `include:` names pieces, put in
front of the body in the order given (a piece's own includes first, each piece once).
`row:` names a row of lua_rows.py: the include step defines `local <Row> = {field = index,
...}` from its field order, and the script reads the row's fields by name (`r[FinishRow.state]`).
tests/unit/test_lua_headers.py checks every header against its body; docs/hot-store.md is
generated from the headers (`python -m lambdas.adapters.redis_store.lua_docs`).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lambdas.adapters.redis_store import lua_rows

LUA_DIR = Path(__file__).parent / "lua"
_FLAGS = re.compile(r"^#!lua flags=[\w,-]+$")
_ARG = re.compile(r"^--\s+(KEYS|ARGV)\[(\d+)(\.\.)?\]\s+(.*)$")


class ScriptFileError(ValueError):
    """A script file or its header that cannot be used as written."""


@dataclass(frozen=True)
class Header:
    name: str
    piece: bool                          # a shared piece (lua/_<name>.lua), not a script
    summary: str
    flags: str | None                    # the script's first line, if it has flags
    keys: dict[int, tuple[bool, str]] = field(default_factory=dict)   # index -> (from here on, what)
    argv: dict[int, tuple[bool, str]] = field(default_factory=dict)
    built: tuple[str, ...] = ()          # 'prefix:<...>  why' lines
    includes: tuple[str, ...] = ()
    rows: tuple[str, ...] = ()
    body: str = ""                       # the file after its header

    def built_prefixes(self) -> set[str]:
        """What each `built:` line names, up to its first `<` or space: `done:` of `done:<owner>`."""
        return {re.split(r"[<\s]", b, maxsplit=1)[0] for b in self.built}


def path_of(name: str, piece: bool = False) -> Path:
    return LUA_DIR / (f"_{name}.lua" if piece else f"{name}.lua")


def script_names() -> list[str]:
    return sorted(p.stem for p in LUA_DIR.glob("*.lua") if not p.name.startswith("_"))


def piece_names() -> list[str]:
    return sorted(p.stem[1:] for p in LUA_DIR.glob("_*.lua"))


def _listed(value: str) -> tuple[str, ...]:
    return tuple(v for v in re.split(r"[,\s]+", value.strip()) if v)


@functools.lru_cache(maxsize=None)
def read_header(name: str, piece: bool = False) -> Header:
    path = path_of(name, piece)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise ScriptFileError(f"no Lua {'piece' if piece else 'script'} {name!r}: {path} does not exist") from None
    flags = lines.pop(0) if lines and _FLAGS.match(lines[0]) else None
    summary: list[str] = []
    keys: dict[int, tuple[bool, str]] = {}
    argv: dict[int, tuple[bool, str]] = {}
    built: list[str] = []
    includes: list[str] = []
    rows: list[str] = []
    n = 0
    for n, line in enumerate(lines):  # noqa: B007 - n is where the body starts
        if not line.startswith("--"):
            break
        text = line[2:].strip()
        m = _ARG.match(line)
        if m:
            (keys if m[1] == "KEYS" else argv)[int(m[2])] = (bool(m[3]), m[4].strip())
        elif text.startswith("built:"):
            built.append(text[len("built:"):].strip())
        elif text.startswith("include:"):
            includes.extend(_listed(text[len("include:"):]))
        elif text.startswith("row:"):
            rows.extend(_listed(text[len("row:"):]))
        else:
            summary.append(text)
    else:
        n = len(lines)
    if not summary or not summary[0].startswith(f"{name}:"):
        raise ScriptFileError(f"{path}: the header's first line must be '-- {name}: <what it does>'")
    for row in rows:
        if row not in lua_rows.ROWS:
            raise ScriptFileError(f"{path}: row {row!r} is not defined in lua_rows.py (one of {sorted(lua_rows.ROWS)})")
    return Header(name=name, piece=piece, summary=" ".join(summary)[len(name) + 1:].strip(), flags=flags,
                  keys=keys, argv=argv, built=tuple(built), includes=tuple(includes), rows=tuple(rows),
                  body="\n".join(lines[n:]).strip("\n") + "\n")


def closure(name: str, piece: bool = False) -> list[Header]:
    """The script's header and those of every piece it includes, pieces first (each once, a
    piece's own includes before it)."""
    seen: dict[str, Header] = {}

    def visit(h: Header, trail: tuple[str, ...]) -> None:
        for inc in h.includes:
            if inc in trail:
                raise ScriptFileError(f"Lua pieces include each other in a circle: {' -> '.join(trail + (inc,))}")
            if inc not in seen:
                child = read_header(inc, piece=True)
                visit(child, trail + (inc,))
                seen[inc] = child

    top = read_header(name, piece)
    visit(top, (name,))
    return [*seen.values(), top]


def _row_constants(rows: list[str]) -> str:
    return "".join(f"local {r} = {{{', '.join(f'{f} = {i}' for i, f in enumerate(lua_rows.ROWS[r]._fields, 1))}}}\n"
                   for r in rows)


@functools.lru_cache(maxsize=None)
def source(name: str) -> str:
    """The script as Redis runs it: its flags line, its rows' constants, its pieces, its body."""
    headers = closure(name)
    top = headers[-1]
    rows = list(dict.fromkeys(r for h in headers for r in h.rows))
    parts = [top.flags + "\n" if top.flags else "", _row_constants(rows)]
    parts += [h.body for h in headers]
    return "".join(parts)


def register(client: Any, name: str) -> Any:
    """The script registered with `client` (redis-py's Script: EVALSHA, the body resent only
    once after a SCRIPT FLUSH)."""
    return client.register_script(source(name))
