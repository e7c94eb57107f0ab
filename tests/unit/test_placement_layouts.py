"""Issue 15: the aAPP paper's YAML layout — a tag's `followup` written beside the tag in
its list item — loads like every other accepted layout; misplaced followups are rejected
with a fix; YAML syntax errors name the line where the open construct started."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from skyfn.placement import PolicyError, load_policy

# The example, as the paper's grammar writes it: tag ::= id: (- block)* [followup: ...]
PAPER_LAYOUT = """\
- f_tag:
  - workers: [local_w1, local_w2]
    strategy: best_first
  - workers: [public_w1]
  followup: fail
"""

# The same policy in every layout accepted before issue 15 (canonical first).
OTHER_LAYOUTS = {
    "canonical (followup item)": """\
        f_tag:
          - workers: [local_w1, local_w2]
            strategy: best_first
          - workers: [public_w1]
          - followup: fail
        """,
    "list of one-key maps with a followup item": """\
        - f_tag:
          - workers: [local_w1, local_w2]
            strategy: best_first
          - workers: [public_w1]
          - followup: fail
        """,
    "blocks and followup beside each other": """\
        f_tag:
          blocks:
            - workers: [local_w1, local_w2]
              strategy: best_first
            - workers: [public_w1]
          followup: fail
        """,
    "followup inside the last block": """\
        f_tag:
          - workers: [local_w1, local_w2]
            strategy: best_first
          - workers: [public_w1]
            followup: fail
        """,
}


def shape(policy):
    """A policy without its line numbers: tag -> (blocks, followup)."""
    return {name: ([(b.workers, b.strategy, b.invalidate, b.require, b.forbid) for b in tp.blocks], tp.followup)
            for name, tp in policy.tags.items()}


def rejected(text: str) -> list[tuple[int, str, str]]:
    with pytest.raises(PolicyError) as info:
        load_policy(textwrap.dedent(text), source="p.yaml")
    return [(p.line, p.key, p.reason) for p in info.value.problems]


# --- the paper's layout ----------------------------------------------------------------
def test_followup_beside_the_tag_in_its_list_item():
    p = load_policy(PAPER_LAYOUT)
    tp = p.tags["f_tag"]
    assert list(p.tags) == ["f_tag"] and tp.followup == "fail" and tp.line == 1
    b1, b2 = tp.blocks
    assert (b1.workers, b1.strategy, b1.line) == (("local_w1", "local_w2"), "best_first", 2)
    assert (b2.workers, b2.strategy, b2.line) == (("public_w1",), "any", 4)


@pytest.mark.parametrize("layout", sorted(OTHER_LAYOUTS))
def test_every_earlier_layout_still_loads_to_the_same_policy(layout):
    assert shape(load_policy(textwrap.dedent(OTHER_LAYOUTS[layout]))) == shape(load_policy(PAPER_LAYOUT))


def test_paper_layout_with_several_tags_default_followup_and_the_default_tag():
    p = load_policy(textwrap.dedent("""\
        - divide:
          - workers: *
            affinity: impera, !heavy
          followup: default
        - impera:
          - workers: [w1, w2]
            strategy: best_first
            invalidate: max_concurrent_invocations 2
        - default:
          - workers: *
          followup: fail
        """))
    assert {n: tp.followup for n, tp in p.tags.items()} == {"divide": "default", "impera": "default",
                                                            "default": "fail"}
    assert (p.tags["divide"].blocks[0].require, p.tags["divide"].blocks[0].forbid) == (("impera",), ("heavy",))


def test_paper_layout_with_indented_blocks():
    p = load_policy("- f:\n    - workers: [a]\n    - workers: [b]\n  followup: fail\n")
    assert p.tags["f"].followup == "fail" and [b.workers for b in p.tags["f"].blocks] == [("a",), ("b",)]


def test_a_tag_named_followup_holding_blocks_is_still_a_tag():
    p = load_policy("- followup:\n  - workers: [a]\n- g:\n  - workers: [b]\n  followup: fail\n")
    assert p.tags["followup"].followup == "default" and p.tags["followup"].blocks[0].workers == ("a",)
    assert p.tags["g"].followup == "fail"


# --- misplaced followups: rejected with the fix ----------------------------------------
def test_bad_followup_value_beside_the_tag_names_its_line():
    assert rejected("""\
        - f:
          - workers: [a]
          followup: retry
        """) == [(3, "f.followup", "bad followup 'retry': use 'default' or 'fail'")]


def test_followup_beside_the_tag_and_in_its_blocks_is_given_twice():
    assert rejected("""\
        - f:
          - workers: [a]
          - followup: fail
          followup: fail
        """) == [(4, "f.followup", "followup given twice (also on line 3): keep one")]
    assert rejected("""\
        - f:
          - workers: [a]
            followup: default
          followup: fail
        """) == [(4, "f.followup", "followup given twice (also on line 3): keep one")]


def test_followup_in_an_item_of_its_own_belongs_to_no_tag():
    ((line, key, reason),) = rejected("""\
        - f:
          - workers: [a]
        - followup: fail
        """)
    assert (line, key) == (3, "followup")
    assert reason.startswith("followup beside no tag: put it in the tag's own list item, indented like the tag name")


def test_followup_beside_two_tags_in_one_item_is_ambiguous():
    assert rejected("""\
        - f:
          - workers: [a]
          g:
          - workers: [b]
          followup: fail
        """) == [(5, "followup", "followup beside 2 tags (f, g) in one list item: give each tag its own "
                                 "`- tag:` item with its followup")]


def test_followup_at_the_top_level_of_a_map_belongs_to_no_tag():
    ((line, key, reason),) = rejected("""\
        f:
        - workers: [a]
        followup: fail
        """)
    assert (line, key) == (3, "followup")
    assert reason.startswith("followup at the top level belongs to no tag: put it after the tag's last block")


# --- YAML syntax errors: the line where the construct started, and where parsing stopped ---
@pytest.mark.parametrize("text, line, reason", [
    ("t:\n  - workers: [a, b\n    strategy: best_first\n  - workers: [c]\nu:\n  - workers: [d]\n", 2,
     "not valid YAML: the '[' opened on line 2 is never closed (parsing stopped on line 3: expected ',' or ']', "
     "but got ':'): close it with ']' on line 2"),
    ("- t:\n  - workers: *\n    affinity: [u, !v\n  followup: fail\n", 3,       # the paper's !tag, unclosed
     "not valid YAML: the '[' opened on line 3 is never closed (parsing stopped on line 4: expected ',' or ']', "
     "but got ':'): close it with ']' on line 3"),
    ("t:\n  - workers: [a]\n    invalidate: {capacity_used: 50%\n  - workers: [b]\n", 3,
     "not valid YAML: the '{' opened on line 3 is never closed (parsing stopped on line 4: expected ',' or '}', "
     "but got ':'): close it with '}' on line 3"),
    ("t:\n  - workers: \"a\n  - workers: [b]\n", 2,
     "not valid YAML: the quoted text opened on line 2 is never closed (parsing stopped on line 4: found "
     "unexpected end of stream): end it with the same quote on line 2"),
    ("t:\n  - workers: [a]\n  strategy\n  x: 1\n", 3,
     "not valid YAML: the key on line 3 has no ':' (parsing stopped on line 4: could not find expected ':'): "
     "write `key: value` on line 3"),
    ("t:\n  - workers: [a]\n    strategy: any\n   bad: 1\n", 4,
     "not valid YAML: expected <block end>, but found '<block mapping start>' on line 4 (while parsing a block "
     "collection that starts on line 2; check the indentation between lines 2 and 4)"),
    ("t:\n\t- workers: [a]\n", 2,
     "not valid YAML: found character '\\t' that cannot start any token (while scanning for the next token): "
     "indent with spaces, not tabs"),
])
def test_yaml_syntax_errors(text, line, reason):
    with pytest.raises(PolicyError) as info:
        load_policy(text, source="p.yaml")
    ((problem),) = info.value.problems
    assert (problem.line, problem.key, problem.reason) == (line, "", reason)


def test_cli_names_line_2_for_an_unclosed_bracket_on_line_2(tmp_path):
    f = tmp_path / "policy.yaml"
    f.write_text("- f_tag:\n  - workers: [local_w1, local_w2\n    strategy: best_first\n  followup: fail\n")
    out = subprocess.run([sys.executable, "-m", "skyfn.cli", "policy", "check", str(f)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1, out
    assert out.stderr.splitlines() == [
        f"{f}:2: not valid YAML: the '[' opened on line 2 is never closed (parsing stopped on line 3: "
        "expected ',' or ']', but got ':'): close it with ']' on line 2",
        f"{f}: rejected (1 problem); nothing was loaded"]


def test_cli_checks_the_paper_layout(tmp_path):
    f = tmp_path / "policy.yaml"
    f.write_text(PAPER_LAYOUT)
    out = subprocess.run([sys.executable, "-m", "skyfn.cli", "policy", "check", str(f), "--tag", "f_tag"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out
    assert out.stdout.splitlines()[0] == f"{f}: valid, 1 tag (f_tag)"
    assert "tag 'f_tag' -> worker 'local_w1' ('f_tag' block 1, line 2)" in out.stdout


def test_libyaml_and_pyyaml_parsers_load_the_same_policies(monkeypatch):
    """The loader parses with libyaml when PyYAML has it; PyYAML's own parser must give the
    same policy, lines included (it is the fallback, and the one errors are reported from)."""
    from pathlib import Path

    from skyfn.placement import loader

    texts = [PAPER_LAYOUT, *(textwrap.dedent(t) for t in OTHER_LAYOUTS.values()),
             Path(__file__).with_name("aapp_figure3.yaml").read_text()]

    def lines(policy):
        return {n: (tp.line, [b.line for b in tp.blocks]) for n, tp in policy.tags.items()}

    fast = [(shape(p), lines(p)) for p in map(load_policy, texts)]
    monkeypatch.setattr(loader, "_LIBYAML", None)
    assert [(shape(p), lines(p)) for p in map(load_policy, texts)] == fast
