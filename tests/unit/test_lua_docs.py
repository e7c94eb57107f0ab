"""docs/hot-store.md is what the Lua scripts' headers say (lambdas/adapters/redis_store/lua_docs.py)."""
from __future__ import annotations

from lambdas.adapters.redis_store import lua_docs, lua_files


def test_the_hot_store_page_is_generated_from_the_headers():
    assert lua_docs.DOC.read_text() == lua_docs.render(), (
        "docs/hot-store.md is out of date: run `python -m lambdas.adapters.redis_store.lua_docs`")


def test_the_page_lists_every_script_with_its_keys():
    page = lua_docs.DOC.read_text()
    for name in lua_files.script_names():
        h = lua_files.read_header(name)
        assert f"### `{name}`" in page
        for i in h.keys:
            assert f"`KEYS[{i}" in page
