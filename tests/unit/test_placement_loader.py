"""The aAPP grammar: every accepted shape, every rejection (line, key, reason), warnings."""
from __future__ import annotations

import textwrap

import pytest

from skyfn.placement import DEFAULT_TAG, Invalidate, PolicyError, load_policy, load_policy_file


def load(text: str):
    return load_policy(textwrap.dedent(text), source="p.yaml")


def rejected(text: str) -> list[tuple[int, str, str]]:
    with pytest.raises(PolicyError) as info:
        load(text)
    assert str(info.value).startswith("policy p.yaml rejected: ")
    return [(p.line, p.key, p.reason) for p in info.value.problems]


# --- accepted shapes -------------------------------------------------------------------
def test_minimal_tag_with_star_workers_and_defaults():
    p = load("""
        t:
          - workers: "*"
        """)
    (b,) = p.tags["t"].blocks
    assert b.workers is None and b.strategy == "any" and b.invalidate is None
    assert b.require == () and b.forbid == () and b.line == 3
    assert p.tags["t"].followup == "default" and p.tags["t"].line == 2
    assert p.warnings == ()


def test_bare_star_and_bare_bang_tags_as_in_the_paper():
    p = load("""
        a:
          - workers: *
            affinity: b, !c
        b:
          - workers: *   # every worker
            affinity: [!a, c]
        c:
          - workers:
              - w1
            affinity:
              - !a
              - b
        """)
    assert p.tags["a"].blocks[0].workers is None
    assert (p.tags["a"].blocks[0].require, p.tags["a"].blocks[0].forbid) == (("b",), ("c",))
    assert (p.tags["b"].blocks[0].require, p.tags["b"].blocks[0].forbid) == (("c",), ("a",))
    assert (p.tags["c"].blocks[0].require, p.tags["c"].blocks[0].forbid) == (("b",), ("a",))
    assert p.tags["c"].blocks[0].workers == ("w1",)


def test_top_level_list_form_and_app_wrk_entries_and_followup_item():
    p = load("""
        - f:
          - workers:
              - wrk: a
              - wrk: b
            strategy: best_first
          - workers: [c]
          - followup: fail
        - g:
          - workers: "*"
        """)
    assert [b.workers for b in p.tags["f"].blocks] == [("a", "b"), ("c",)]
    assert p.tags["f"].followup == "fail" and p.tags["g"].followup == "default"


def test_blocks_and_followup_map_form():
    p = load("""
        f:
          blocks:
            - workers: [a]
          followup: fail
        """)
    assert p.tags["f"].followup == "fail" and p.tags["f"].blocks[0].workers == ("a",)


def test_followup_inside_the_last_block_belongs_to_the_tag():
    p = load("""
        f:
          - workers: [a]
          - workers: [b]
            followup: fail
        """)
    assert p.tags["f"].followup == "fail" and len(p.tags["f"].blocks) == 2


@pytest.mark.parametrize("strategy", ["any", "best_first", "warm_first", "shortest_backlog", "round_robin"])
def test_every_strategy(strategy):
    p = load(f"""
        t:
          - workers: "*"
            strategy: {strategy}
        """)
    assert p.tags["t"].blocks[0].strategy == strategy


@pytest.mark.parametrize("text, expected", [
    ("capacity_used 50%", Invalidate(capacity_used=50.0)),
    ("capacity_used: 50%", Invalidate(capacity_used=50.0)),
    ("{capacity_used: 12.5%}", Invalidate(capacity_used=12.5)),
    ("{capacity_used: 80}", Invalidate(capacity_used=80.0)),
    ("max_concurrent_invocations 3", Invalidate(max_concurrent_invocations=3)),
    ("{max_concurrent_invocations: 7}", Invalidate(max_concurrent_invocations=7)),
    ("overload", Invalidate(capacity_used=100.0)),
    ("[capacity_used 50%, max_concurrent_invocations 2]",
     Invalidate(capacity_used=50.0, max_concurrent_invocations=2)),
    ("{capacity_used: 90%, max_concurrent_invocations: 4}",
     Invalidate(capacity_used=90.0, max_concurrent_invocations=4)),
])
def test_invalidate_forms(text, expected):
    p = load(f"""
        t:
          - workers: "*"
            invalidate: {text}
        """)
    assert p.tags["t"].blocks[0].invalidate == expected


def test_invalidate_as_block_list():
    p = load("""
        t:
          - workers: "*"
            invalidate:
              - capacity_used 60%
              - max_concurrent_invocations: 5
        """)
    assert p.tags["t"].blocks[0].invalidate == Invalidate(capacity_used=60.0, max_concurrent_invocations=5)


def test_default_tag_followup_defaults_to_fail_and_other_tags_to_default():
    p = load("""
        default:
          - workers: [a]
        t:
          - workers: [b]
        """)
    assert p.tags[DEFAULT_TAG].followup == "fail" and p.tags["t"].followup == "default"
    assert p.default is p.tags[DEFAULT_TAG]
    assert p.for_tag("nope") is p.default and p.for_tag(None) is p.default and p.for_tag("t") is p.tags["t"]


def test_worker_names_and_check_against_known_workers():
    p = load("""
        t:
          - workers: [a, b]
          - workers: [c]
        """)
    assert p.worker_names() == {"a": 3, "b": 3, "c": 4}
    (problem,) = p.check_workers(["a", "b"])
    assert (problem.line, problem.key) == (4, "workers") and "'c' is not one of the known workers (a, b)" in problem.reason


def test_load_policy_file(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("t:\n  - workers: [a]\n")
    assert load_policy_file(f).source == str(f)
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy_file(tmp_path / "missing.yaml")


# --- warnings --------------------------------------------------------------------------
def test_affinity_on_undefined_tag_is_a_warning_not_an_error():
    p = load("""
        t:
          - workers: "*"
            affinity: [ghost, "!t"]
        """)
    (w,) = p.warnings
    assert (w.line, w.key) == (4, "t[1].affinity") and "'ghost', which this policy does not define" in w.reason


# --- rejections: line, key, reason -----------------------------------------------------
def test_unknown_block_key_with_suggestion():
    assert rejected("""
        t:
          - workers: "*"
            stratgy: any
        """) == [(4, "t[1].stratgy", "unknown key (expected one of: workers, strategy, invalidate, affinity); "
                                     "did you mean 'strategy'?")]


def test_unknown_tag_level_key():
    ((line, key, reason),) = rejected("""
        t:
          blocks:
            - workers: [a]
          folowup: fail
        """)
    assert (line, key) == (5, "t.folowup") and "did you mean 'followup'" in reason


@pytest.mark.parametrize("value", ["150%", "0%", "-5%", "half", "100.5"])
def test_bad_percentage(value):
    ((line, key, reason),) = rejected(f"""
        t:
          - workers: "*"
            invalidate: capacity_used {value}
        """)
    assert (line, key) == (4, "t[1].invalidate.capacity_used")
    assert reason.startswith(f"bad percentage {value!r}")


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_bad_max_concurrent_invocations(value):
    ((line, key, reason),) = rejected(f"""
        t:
          - workers: "*"
            invalidate: max_concurrent_invocations {value}
        """)
    assert (line, key) == (4, "t[1].invalidate.max_concurrent_invocations") and reason.startswith("bad count")


def test_unknown_invalidation_and_duplicates():
    problems = rejected("""
        t:
          - workers: "*"
            invalidate: [capacity_usd 50%, max_concurrent_invocations 2, max_concurrent_invocations 3]
        """)
    assert problems[0][:2] == (4, "t[1].invalidate.capacity_usd") and "did you mean 'capacity_used'" in problems[0][2]
    assert problems[1] == (4, "t[1].invalidate.max_concurrent_invocations", "given twice")


def test_unknown_strategy():
    assert rejected("""
        t:
          - workers: "*"
            strategy: best_frst
        """) == [(4, "t[1].strategy", "unknown strategy 'best_frst' (expected one of: any, best_first, warm_first, "
                                      "shortest_backlog, round_robin, data_local); did you mean 'best_first'?")]


def test_missing_workers():
    assert rejected("""
        t:
          - strategy: any
        """) == [(3, "t[1]", "missing workers: give `workers: *` or a list of worker names")]


@pytest.mark.parametrize("workers, reason", [
    ("[]", "empty worker list"),
    ("[a, a]", "worker 'a' listed twice"),
    ("[a, '*']", "'*' stands alone"),
    ("just_one", "expected '*' or a list of worker names, got 'just_one' (write `workers: [just_one]`"),
    ("{a: 1}", "expected '*' or a list of worker names"),
    ("[{host: a}]", "a worker is a name or `wrk: name`"),
])
def test_bad_workers(workers, reason):
    ((line, key, got),) = rejected(f"""
        t:
          - workers: {workers}
        """)
    assert line == 3 and key == "t[1].workers" and got.startswith(reason)


@pytest.mark.parametrize("value", ["maybe", "retry", "Default"])
def test_bad_followup(value):
    ((line, key, reason),) = rejected(f"""
        t:
          - workers: [a]
          - followup: {value}
        """)
    assert (line, key) == (4, "t.followup") and reason.startswith(f"bad followup {value!r}: use 'default' or 'fail'")


def test_followup_must_follow_the_blocks():
    problems = rejected("""
        t:
          - followup: fail
          - workers: [a]
        """)
    assert problems == [(3, "t.followup", "followup comes after the last block")]


def test_followup_inside_a_middle_block_is_an_error():
    assert rejected("""
        t:
          - workers: [a]
            followup: fail
          - workers: [b]
        """) == [(4, "t[1].followup", "followup belongs to the tag: put it after the last block")]


def test_default_cannot_follow_up_to_itself():
    ((line, key, reason),) = rejected("""
        default:
          - workers: "*"
          - followup: default
        """)
    assert (line, key) == (4, "default.followup") and "cannot follow up to itself" in reason


def test_affinity_contradiction_and_bad_entries():
    problems = rejected("""
        a:
          - workers: "*"
            affinity: [b, "!b"]
        b:
          - workers: "*"
            affinity: ["!!x"]
        """)
    assert (4, "a[1].affinity", "affinity both requires and forbids 'b'") in problems
    assert any(line == 7 and key == "b[1].affinity" and "bad affinity entry '!!x'" in r for line, key, r in problems)


def test_tag_without_blocks_and_block_keys_directly_under_tag():
    problems = rejected("""
        a: []
        b:
          workers: "*"
        c: 3
        """)
    assert (2, "a", "the tag has no blocks: give at least one `- workers: ...`") in problems
    assert any(k == "b.workers" and "a dash before the first key" in r for _, k, r in problems)
    assert (5, "c", "expected a list of blocks under the tag") in problems


def test_duplicate_tags_and_duplicate_block_keys():
    problems = rejected("""
        a:
          - workers: [x]
            workers: [y]
        a:
          - workers: [z]
        """)
    assert (4, "a[1].workers", "duplicate key (first on line 3)") in problems
    assert (5, "a", "duplicate key (first on line 2)") in problems


def test_bad_tag_name():
    ((line, key, reason),) = rejected("""
        "bad tag":
          - workers: [a]
        """)
    assert (line, key) == (2, "bad tag") and "a tag name is letters" in reason


@pytest.mark.parametrize("text, reason", [
    ("", "empty policy"),
    ("# only a comment\n", "empty policy"),
    ("[1, 2]", "each list item must be `tag: [blocks]`"),
    ("just text", "a policy maps tags to their blocks"),
])
def test_not_a_policy(text, reason):
    problems = rejected(text)
    assert any(reason in r for _, _, r in problems)


def test_yaml_syntax_error_names_the_line_where_the_bracket_was_opened():
    ((line, key, reason),) = rejected("""
        t:
          - workers: [a
          - strategy: any
        """)
    assert (line, key) == (3, "")
    assert reason == ("not valid YAML: the '[' opened on line 3 is never closed (parsing stopped on line 4: "
                      "expected ',' or ']', but got ':'): close it with ']' on line 3")


def test_every_problem_is_reported_and_nothing_is_half_loaded():
    with pytest.raises(PolicyError) as info:
        load("""
            good:
              - workers: [a]
            bad:
              - workers: [a]
                strategy: nope
              - invalidate: capacity_used 500%
            """)
    lines = sorted(p.line for p in info.value.problems)
    assert lines == [6, 7, 7]  # unknown strategy; bad percentage and missing workers in block 2
    assert [d["key"] for d in info.value.details()] == ["bad[1].strategy", "bad[2].invalidate.capacity_used", "bad[2]"]


def test_oversized_policy_is_rejected():
    with pytest.raises(PolicyError, match="exceeds"):
        load_policy("t:\n  - workers: [a]\n" + "#" * (300 << 10))
