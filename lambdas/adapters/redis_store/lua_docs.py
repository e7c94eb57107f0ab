"""docs/hot-store.md from the Lua scripts' headers (lua_files.py): the hot store's key layout
as the package docstring gives it, then each script with what it reads and writes (its KEYS,
its ARGV, the keys it builds in Lua and why, its pieces and rows). tests/unit/test_lua_docs.py
fails when the page and the headers disagree; `python -m lambdas.adapters.redis_store.lua_docs`
writes it again."""
from __future__ import annotations

import sys
from pathlib import Path

from lambdas.adapters import redis_store
from lambdas.adapters.redis_store import lua_files, lua_rows

DOC = Path(__file__).resolve().parents[3] / "docs" / "hot-store.md"


def _named(text: str) -> str:
    """`name` and what follows it: the first word of a header's entry is a key or a value's name."""
    name, _, what = text.strip().partition(" ")
    return f"`{name}` {what.strip()}".replace("|", "/").rstrip()


def _args(kind: str, declared: dict[int, tuple[bool, str]]) -> list[str]:
    return [f"| `{kind}[{i}{'..' if rest else ''}]` | {_named(what)} |" for i, (rest, what) in sorted(declared.items())]


def _script(h: lua_files.Header) -> list[str]:
    out = [f"### `{h.name}`" + (" (piece)" if h.piece else ""), "", h.summary, ""]
    if h.flags:
        out += [f"Flags: `{h.flags[len('#!lua flags='):]}`.", ""]
    rows = _args("KEYS", h.keys) + _args("ARGV", h.argv)
    if rows:
        out += ["| argument | what |", "|---|---|", *rows, ""]
    if h.built:
        out += ["Keys made inside the script (not passed in KEYS):", ""] + [f"- {_named(b)}" for b in h.built] + [""]
    if h.includes:
        out += ["Includes: " + ", ".join(f"`{i}`" for i in h.includes) + ".", ""]
    if h.rows:
        out += ["Rows: " + ", ".join(f"`{r}`" for r in h.rows) + ".", ""]
    return out


def render() -> str:
    out = ["# The hot store: keys and scripts", "",
           "Generated from the headers of `lambdas/adapters/redis_store/lua/*.lua` by",
           "`python -m lambdas.adapters.redis_store.lua_docs` (tests/unit/test_lua_docs.py checks it is current).",
           "Every Redis command and script of the service lives in `lambdas/adapters/redis_store`;",
           "`lambdas/core` calls its ports by meaning (an import-linter contract keeps `redis` out of it).", "",
           "## Key layout", "", "```", (redis_store.__doc__ or "").strip(), "```", "",
           "## Rows between Python and Lua", "",
           "Each is a NamedTuple of `lua_rows.py`; a script that declares it reads its fields by name.", ""]
    for name, cls in sorted(lua_rows.ROWS.items()):
        out.append(f"- `{name}`: " + ", ".join(f"`{f}`" for f in cls._fields))
    out += ["", "## Scripts", ""]
    for name in lua_files.script_names():
        out += _script(lua_files.read_header(name))
    out += ["## Pieces", "", "Shared local functions, put in front of the scripts that include them.", ""]
    for name in lua_files.piece_names():
        out += _script(lua_files.read_header(name, piece=True))
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    DOC.write_text(render())
    print(f"wrote {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
