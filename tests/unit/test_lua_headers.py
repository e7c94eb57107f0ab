"""Every Lua script of the service (lambdas/adapters/redis_store/lua) declares what it touches:
each KEYS and ARGV argument it reads, each key it builds inside Lua (with why), each row it
decodes; and reads rows by field name. A key built in Lua that its header (or an included
piece's) does not list fails here, as does a literal key name that is neither in KEYS nor
listed: a cluster-mode Redis needs every key in KEYS."""
from __future__ import annotations

import re

import pytest

from lambdas.adapters.redis_store import lua_files, lua_rows
from lambdas.adapters.redis_store.lua_files import ScriptFileError

# 'done:' .. owner -- a key made in Lua from a prefix
_BUILT = re.compile(r"""(['"])([a-z][a-z0-9_]*:)\1\s*\.\.""")
# redis.call('ZREM', 'leases', ...) -- a literal key name; bulk() takes (cmd, key, ...)
_LITERAL_KEY = re.compile(r"""(?:redis\.p?call|bulk)\(\s*(['"])([A-Za-z]+)\1\s*,\s*(['"])([^'"]+)\3""")
# commands whose first argument is not a key
_NOT_A_KEY = {"TIME", "PING", "ECHO", "SCRIPT", "FUNCTION", "INFO", "CLIENT", "PUBLISH"}
_USE = re.compile(r"\b(KEYS|ARGV)\[(\d+)\]")
_INDEXED = re.compile(r"\b(KEYS|ARGV)\[(?!\d+\])")
_DECODED = re.compile(r"local\s+(\w+)\s*=\s*cjson\.decode\(\s*ARGV\[\d+\]\s*\)")


def _code(body: str) -> str:
    """The body without comments (a comment may mention a key it does not touch)."""
    return re.sub(r"--[^\n]*", "", body)


def _covered(declared: dict[int, tuple[bool, str]], n: int) -> bool:
    return n in declared or any(rest and i <= n for i, (rest, _) in declared.items())


def problems(name: str, piece: bool = False) -> list[str]:
    headers = lua_files.closure(name, piece)
    top = headers[-1]
    out: list[str] = []
    prefixes = set().union(*(h.built_prefixes() for h in headers))
    rows = {r for h in headers for r in h.rows}
    for h in headers:
        code = _code(h.body)
        where = f"{'_' if h.piece else ''}{h.name}.lua"
        for _, prefix in _BUILT.findall(code):
            if prefix not in prefixes:
                out.append(f"{where} builds a key {prefix}... in Lua that no header lists: pass it in KEYS, "
                           f"or add '-- built: {prefix}<...>  why' to the header")
        for _, cmd, _, key in _LITERAL_KEY.findall(code):
            if cmd.upper() not in _NOT_A_KEY and key not in prefixes and key.rstrip(":") + ":" not in prefixes:
                out.append(f"{where} names the key {key!r} in Lua: pass it in KEYS (or list it as built, with why)")
        for row in rows:
            for fld in re.findall(rf"\b{row}\.(\w+)", code):
                if fld not in lua_rows.ROWS[row]._fields:
                    out.append(f"{where} reads {row}.{fld}, a field {row} does not have "
                               f"({', '.join(lua_rows.ROWS[row]._fields)})")
        if h.piece:
            if _USE.search(code) or _INDEXED.search(code):
                out.append(f"{where} is a piece: it takes its keys and values as arguments, not from KEYS/ARGV")
            continue
        for kind, n in _USE.findall(code):
            if not _covered(top.keys if kind == "KEYS" else top.argv, int(n)):
                out.append(f"{where} reads {kind}[{n}], which its header does not declare")
        for m in _INDEXED.finditer(code):
            declared = top.keys if m[1] == "KEYS" else top.argv
            if not any(rest for rest, _ in declared.values()):
                out.append(f"{where} indexes {m[1]} by a variable: declare '{m[1]}[n..]' in its header")
        for var in _DECODED.findall(code):
            loops = re.findall(rf"for\s+\w+\s*,\s*(\w+)\s+in\s+ipairs\(\s*{var}\s*\)", code)
            for loop_var in loops + [f"{var}\\[\\w+\\]"]:
                if re.search(rf"\b{loop_var}\[\d+\]", code):
                    out.append(f"{where} reads a decoded row by position ({loop_var.replace(chr(92), '')}[n]): "
                               f"declare its row (-- row: <Name>) and read it by field name")
            if loops and not rows:
                out.append(f"{where} decodes rows from ARGV without declaring their row (-- row: <Name>)")
    return out


def test_the_scripts_are_files_with_headers():
    assert lua_files.script_names(), "no Lua scripts found in lambdas/adapters/redis_store/lua"


@pytest.mark.parametrize("name", lua_files.script_names())
def test_a_script_declares_every_key_argument_and_row_it_uses(name):
    assert problems(name) == []


@pytest.mark.parametrize("name", lua_files.piece_names())
def test_a_piece_declares_the_keys_it_builds(name):
    assert problems(name, piece=True) == []


@pytest.mark.parametrize("name", lua_files.script_names())
def test_a_script_compiles_in_redis(name, redis_url):
    """Redis compiles each script as the include step assembles it (SCRIPT LOAD)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    sha = client.script_load(lua_files.source(name))
    assert client.script_exists(sha) == [True]


def test_an_undeclared_key_fails_the_check(tmp_path, monkeypatch):
    (tmp_path / "probe.lua").write_text(
        "-- probe: a script that builds a key it does not declare\n"
        "-- ARGV[1]  owner\n"
        "redis.call('INCR', 'seen:' .. ARGV[1])\n"
        "redis.call('RPUSH', 'outbox', ARGV[1])\n")
    monkeypatch.setattr(lua_files, "LUA_DIR", tmp_path)
    lua_files.read_header.cache_clear()
    try:
        found = problems("probe")
    finally:
        lua_files.read_header.cache_clear()
    assert any("builds a key seen:" in p for p in found), found
    assert any("names the key 'outbox'" in p for p in found), found


def test_a_row_read_by_position_or_by_an_unknown_field_fails(tmp_path, monkeypatch):
    (tmp_path / "probe.lua").write_text(
        "-- probe: reads rows\n"
        "-- KEYS[1..]  t:<task>  the rows' records\n"
        "-- ARGV[1]  rows  JSON list of Probe\n"
        "-- row: Probe\n"
        "local rows = cjson.decode(ARGV[1])\n"
        "for i, r in ipairs(rows) do redis.call('HSET', KEYS[i], 's', r[2], 'x', r[Probe.nope]) end\n")

    class Probe(lua_rows.NamedTuple):
        task_id: str
        state: str

    monkeypatch.setattr(lua_files, "LUA_DIR", tmp_path)
    monkeypatch.setitem(lua_rows.ROWS, "Probe", Probe)
    lua_files.read_header.cache_clear()
    try:
        found = problems("probe")
        assert "local Probe = {task_id = 1, state = 2}\n" in lua_files.source.__wrapped__("probe")
    finally:
        lua_files.read_header.cache_clear()
    assert any("by position (r[n])" in p for p in found), found
    assert any("reads Probe.nope" in p for p in found), found


def test_a_header_that_names_no_script_is_refused(tmp_path, monkeypatch):
    (tmp_path / "probe.lua").write_text("-- something else\nreturn 1\n")
    monkeypatch.setattr(lua_files, "LUA_DIR", tmp_path)
    lua_files.read_header.cache_clear()
    try:
        with pytest.raises(ScriptFileError, match="first line must be '-- probe: <what it does>'"):
            lua_files.read_header("probe")
    finally:
        lua_files.read_header.cache_clear()
