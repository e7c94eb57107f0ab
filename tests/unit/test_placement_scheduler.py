"""Scheduling semantics of the aAPP engine: blocks in order, strategies, invalidation,
affinity and anti-affinity (directional), followups, explanations."""
from __future__ import annotations

import random
import textwrap
from collections import Counter

import pytest

from skyfn.placement import LiveState, Scheduler, load_policy


def policy(text: str):
    return load_policy(textwrap.dedent(text), source="p.yaml")


def state(**workers) -> LiveState:
    """state(w1=dict(capacity=4, tags={"a": 1}), ...) in keyword order."""
    return LiveState.from_mapping({name: spec or {} for name, spec in workers.items()})


# --- blocks and strategies -------------------------------------------------------------
def test_first_block_with_a_valid_worker_wins():
    p = policy("""
        t:
          - workers: [a]
          - workers: [b]
        """)
    s = state(a={}, b={})
    sch = Scheduler(p, s)
    d = sch.decide("t")
    assert (d.worker, d.policy_tag, d.block, d.line, d.via) == ("a", "t", 1, 3, "tag")
    s.upsert("a", online=False)
    d = sch.decide("t")
    assert (d.worker, d.block, d.line) == ("b", 2, 4)


def test_best_first_follows_list_order_then_state_order_for_star():
    p = policy("""
        t:
          - workers: [c, a, b]
            strategy: best_first
        u:
          - workers: "*"
            strategy: best_first
        """)
    s = state(a={}, b={}, c={})
    sch = Scheduler(p, s)
    assert sch.decide("t").worker == "c"
    assert sch.decide("u").worker == "a"
    s.upsert("c", online=False)
    assert sch.decide("t").worker == "a"


def test_any_picks_uniformly_among_valid_workers_only():
    p = policy("""
        t:
          - workers: "*"
        """)
    s = state(a={}, b={}, c={}, d={"online": False})
    sch = Scheduler(p, s, seed=7)
    counts = Counter(sch.decide("t").worker for _ in range(3000))
    assert set(counts) == {"a", "b", "c"}
    assert all(800 < n < 1200 for n in counts.values())


def test_round_robin_cycles_and_skips_invalid_workers():
    p = policy("""
        t:
          - workers: [a, b, c]
            strategy: round_robin
        """)
    s = state(a={}, b={}, c={})
    sch = Scheduler(p, s)
    assert [sch.decide("t").worker for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]
    s.upsert("b", online=False)
    assert [sch.decide("t").worker for _ in range(4)] == ["a", "c", "a", "c"]
    s.upsert("b", online=True)
    assert [sch.decide("t").worker for _ in range(3)] == ["a", "b", "c"]


def test_round_robin_survives_workers_joining_and_leaving():
    p = policy("""
        t:
          - workers: "*"
            strategy: round_robin
        """)
    s = state(a={}, b={})
    sch = Scheduler(p, s)
    assert [sch.decide("t").worker for _ in range(3)] == ["a", "b", "a"]
    s.upsert("c")
    assert [sch.decide("t").worker for _ in range(3)] == ["b", "c", "a"]
    s.remove("a")
    assert sorted(sch.decide("t").worker for _ in range(4)) == ["b", "b", "c", "c"]


def test_shortest_backlog_weighs_queued_and_running_per_slot():
    p = policy("""
        t:
          - workers: "*"
            strategy: shortest_backlog
        """)
    s = state(a={"capacity": 4, "queued": 6, "running": 2},   # 8 / 4 = 2.0
              b={"capacity": 1, "queued": 1, "running": 1},   # 2 / 1 = 2.0
              c={"capacity": 2, "queued": 2, "running": 1})   # 3 / 2 = 1.5
    sch = Scheduler(p, s)
    assert sch.decide("t").worker == "c"
    s.set_queued("c", 5)
    assert sch.decide("t").worker == "a"  # tie with b at 2.0: the earlier worker


def test_shortest_backlog_spreads_a_stream_by_speed():
    """Balsam's point: the site that drains faster receives more of a steady stream."""
    p = policy("""
        t:
          - workers: "*"
            strategy: shortest_backlog
        """)
    s = state(fast={"capacity": 1}, slow={"capacity": 1})
    sch = Scheduler(p, s)
    sent = Counter()
    for step in range(1, 1201):
        # three tasks arrive every four steps; the fast site finishes one every 2 steps, the
        # slow one every 4: arrivals match the total drain rate, so backlogs stay short
        if step % 4:
            sent[sch.place("t").worker] += 1
        if step % 2 == 0:
            s.finished("fast", "t")
        if step % 4 == 0:
            s.finished("slow", "t")
    assert sent["fast"] + sent["slow"] == 900
    assert 1.8 < sent["fast"] / sent["slow"] < 2.2  # in proportion to the drain rates (2:1)


def test_warm_first_prefers_a_warm_container_then_free_slots():
    p = policy("""
        t:
          - workers: "*"
            strategy: warm_first
        """)
    s = state(a={"capacity": 8, "running": 1},
              b={"capacity": 4, "running": 3, "warm": {"img": 1}},
              c={"capacity": 4, "running": 1, "warm": {"img": 2, "other": 1}})
    sch = Scheduler(p, s)
    assert sch.decide("t", container="img").worker == "c"        # warm, and more free slots than b
    assert sch.decide("t", container="other").worker == "c"
    assert sch.decide("t", container="cold").worker == "a"       # none warm: most free slots
    assert sch.decide("t").worker == "a"                         # no container type: most free slots
    s.set_warm("c", {})
    assert sch.decide("t", container="img").worker == "b"


# --- invalidation ----------------------------------------------------------------------
def test_capacity_used_threshold_is_reached_at_exactly_n_percent():
    p = policy("""
        t:
          - workers: [a]
            invalidate: capacity_used 50%
          - workers: [b]
        """)
    s = state(a={"capacity": 4, "running": 1}, b={})
    sch = Scheduler(p, s)
    assert sch.decide("t").worker == "a"          # 25%
    s.started("a")
    d = sch.decide("t", explain=True)             # 50%: invalid
    assert d.worker == "b"
    assert d.trace[0].rejected == [("a", "capacity used 50% reaches the 50% threshold (2 of 4 slots busy)")]
    s.finished("a")
    assert sch.decide("t").worker == "a"


def test_capacity_used_does_not_apply_when_capacity_is_unknown():
    p = policy("""
        t:
          - workers: [a]
            invalidate: overload
          - followup: fail
        """)
    s = state(a={"running": 50})
    assert Scheduler(p, s).decide("t").worker == "a"
    s.upsert("a", capacity=50)
    assert Scheduler(p, s).decide("t").worker is None


def test_max_concurrent_invocations():
    p = policy("""
        t:
          - workers: [a, b]
            strategy: best_first
            invalidate: max_concurrent_invocations 2
          - followup: fail
        """)
    s = state(a={}, b={})
    sch = Scheduler(p, s)
    assert [sch.place("t").worker for _ in range(4)] == ["a", "a", "b", "b"]
    d = sch.place("t")
    assert d.worker is None and not d.ok and d.transient
    assert "a 2 concurrent invocations reach max_concurrent_invocations 2" in d.reason
    assert d.reason.endswith("(followup: fail)")
    s.finished("b", "t")
    assert sch.place("t").worker == "b"


def test_respect_capacity_rejects_full_workers_whatever_the_block_says():
    p = policy("""
        t:
          - workers: [a, b]
            strategy: best_first
        """)
    s = state(a={"capacity": 1, "running": 1}, b={"capacity": 2})
    assert Scheduler(p, s).decide("t").worker == "a"
    d = Scheduler(p, s, respect_capacity=True).decide("t", explain=True)
    assert d.worker == "b" and d.trace[0].rejected == [("a", "full (1 of 1 slots busy)")]


# --- affinity --------------------------------------------------------------------------
def test_affinity_requires_every_listed_tag():
    p = policy("""
        t:
          - workers: "*"
            affinity: [x, y]
          - followup: fail
        """)
    s = state(a={"tags": {"x": 1}}, b={"tags": {"x": 1, "y": 2}}, c={})
    d = Scheduler(p, s).decide("t", explain=True)
    assert d.worker == "b"
    assert dict(d.trace[0].rejected) == {"a": "runs no 'y' function (affinity y)",
                                         "c": "runs no 'x' function (affinity x)"}


def test_anti_affinity_excludes_workers_running_the_tag():
    p = policy("""
        t:
          - workers: "*"
            affinity: "!x, !y"
        """)
    s = state(a={"tags": {"x": 1}}, b={"tags": {"y": 3}}, c={"tags": {"z": 1}})
    d = Scheduler(p, s).decide("t", explain=True)
    assert d.worker == "c"
    assert dict(d.trace[0].rejected) == {"a": "runs 1 'x' function(s) (anti-affinity !x)",
                                         "b": "runs 3 'y' function(s) (anti-affinity !y)"}
    s.finished("a", "x")
    assert {Scheduler(p, s, seed=i).decide("t").worker for i in range(20)} == {"a", "c"}


def test_affinity_follows_starts_and_finishes():
    p = policy("""
        t:
          - workers: "*"
            affinity: [x]
          - followup: fail
        """)
    s = state(a={}, b={})
    sch = Scheduler(p, s)
    assert sch.decide("t").worker is None
    s.started("b", "x")
    assert sch.decide("t").worker == "b"
    s.finished("b", "x")
    assert sch.decide("t").worker is None


def test_directional_affinity_init_anti_affine_with_query_query_affine_with_init():
    """The paper's directional case: `init` must avoid workers running `query`, `query` must
    join a worker running `init`; neither constraint implies its converse."""
    p = policy("""
        init:
          - workers: "*"
            strategy: best_first
            affinity: "!query"
          - followup: fail
        query:
          - workers: "*"
            strategy: best_first
            affinity: init
          - followup: fail
        """)
    s = state(w1={}, w2={}, w3={})
    sch = Scheduler(p, s)
    # no init anywhere: query cannot run
    d = sch.place("query")
    assert d.worker is None and "runs no 'init' function (affinity init)" in d.reason
    # init goes anywhere; query joins it
    assert sch.place("init").worker == "w1"
    assert sch.place("query").worker == "w1"
    # query on w1 now repels init, but not the other way round: init on w1 keeps running
    d = sch.place("init", )
    assert d.worker == "w2"
    assert s.snapshot()["w1"]["tags"] == {"init": 1, "query": 1}
    # query may join either init worker; init keeps away from both once queries run there
    assert sch.place("query").worker == "w1"
    s.started("w2", "query")
    assert sch.place("init").worker == "w3"
    s.started("w3", "query")
    d = sch.place("init")
    assert d.worker is None
    assert d.reason.count("anti-affinity !query") == 3


def test_affinity_with_itself_co_locates_instances():
    p = policy("""
        shard:
          - workers: "*"
            affinity: shard
          - workers: "*"
            strategy: best_first
        """)
    s = state(a={}, b={}, c={})
    sch = Scheduler(p, s, seed=3)
    first = sch.place("shard").worker
    assert first == "a"
    assert {sch.place("shard").worker for _ in range(10)} == {"a"}


# --- followup and the default tag ------------------------------------------------------
FOLLOWUP = """
    default:
      - workers: [d]
    t:
      - workers: [a]
    f:
      - workers: [a]
      - followup: fail
    """


def test_followup_default_walks_the_default_tag():
    s = state(a={"online": False}, d={})
    d = Scheduler(policy(FOLLOWUP), s).decide("t")
    assert (d.worker, d.policy_tag, d.via, d.block) == ("d", "default", "followup", 1)


def test_followup_fail_fails_with_a_reason():
    s = state(a={"online": False}, d={})
    d = Scheduler(policy(FOLLOWUP), s).decide("f")
    assert d.worker is None and not d.transient
    assert d.reason == "no valid worker for tag 'f': 'f' block 1 (line 7): a offline (followup: fail)"


def test_followup_default_that_also_fails():
    s = state(a={"online": False}, d={"online": False})
    d = Scheduler(policy(FOLLOWUP), s).decide("t")
    assert d.worker is None
    assert d.reason == ("no valid worker for tag 't': 't' block 1 (line 5): a offline | 'default' block 1 "
                        "(line 3): d offline (followup: default, and the 'default' blocks had none either)")


def test_untagged_and_unknown_tags_use_the_default_tag():
    s = state(a={}, d={})
    sch = Scheduler(policy(FOLLOWUP), s)
    for tag in (None, "unlisted"):
        d = sch.decide(tag)
        assert (d.worker, d.policy_tag, d.via) == ("d", "default", "default")


def test_builtin_default_when_the_policy_has_no_default_tag():
    p = policy("""
        t:
          - workers: [a]
        """)
    s = state(a={"online": False}, b={}, c={"online": False})
    sch = Scheduler(p, s)
    d = sch.decide("t")
    assert (d.worker, d.policy_tag, d.via) == ("b", "(built-in default)", "followup")
    assert sch.decide("other").worker == "b"
    s.upsert("b", online=False)
    d = sch.decide("other")
    assert d.worker is None and "b offline" in d.reason


def test_unknown_workers_in_a_block_are_rejected_not_fatal():
    p = policy("""
        t:
          - workers: [ghost, a]
            strategy: best_first
        """)
    s = state(a={})
    d = Scheduler(p, s).decide("t", explain=True)
    assert d.worker == "a"
    assert d.trace[0].rejected == [("ghost", "unknown worker (not among the current workers)")]
    s.upsert("ghost")
    assert Scheduler(p, s).decide("t").worker == "ghost"


def test_no_workers_at_all():
    d = Scheduler(policy(FOLLOWUP), LiveState()).decide("t")
    assert d.worker is None and not d.transient
    assert "a unknown worker" in d.reason and "d unknown worker" in d.reason


# --- explanations ----------------------------------------------------------------------
def test_explain_names_every_block_worker_and_reason():
    p = policy("""
        t:
          - workers: [a, b]
            strategy: best_first
            invalidate: capacity_used 50%
            affinity: "!heavy"
          - workers: "*"
            strategy: shortest_backlog
        """)
    s = state(a={"capacity": 4, "tags": {"heavy": 1}}, b={"capacity": 2, "running": 1}, c={"queued": 3}, e={})
    d = Scheduler(p, s).decide("t", explain=True)
    assert d.worker == "e" and d.block == 2 and d.line == 7
    text = d.explain()
    assert text.splitlines() == [
        "tag 't' -> worker 'e' ('t' block 2, line 7)",
        "  't' block 1 (line 3): workers a, b; strategy best_first; invalidate capacity_used 50%; affinity !heavy",
        "    a: rejected, runs 1 'heavy' function(s) (anti-affinity !heavy)",
        "    b: rejected, capacity used 50% reaches the 50% threshold (1 of 2 slots busy)",
        "  't' block 2 (line 7): workers *; strategy shortest_backlog",
        "    a: valid",
        "    b: valid",
        "    c: valid",
        "    e: valid  <- chosen",
    ]
    as_dict = d.as_dict()
    assert as_dict["worker"] == "e" and as_dict["trace"][0]["rejected"][0]["worker"] == "a"


@pytest.mark.parametrize("strategy", ["any", "best_first", "shortest_backlog", "warm_first", "round_robin"])
def test_fast_path_and_explain_path_agree(strategy):
    """The hot path skips reason strings; on random states it must choose what explain chooses."""
    p = policy(f"""
        t:
          - workers: "*"
            strategy: {strategy}
            invalidate: [capacity_used 75%, max_concurrent_invocations 5]
            affinity: "x, !y"
          - workers: [w3, w1, w7]
            strategy: {strategy}
            affinity: "!y"
          - followup: fail
        """)
    rng = random.Random(11)
    for _ in range(300):
        spec = {}
        for i in range(10):
            tags = {t: rng.randint(0, 2) for t in ("x", "y") if rng.random() < 0.5}
            running = sum(tags.values()) + rng.randint(0, 3)
            spec[f"w{i}"] = {"capacity": rng.choice([0, 4, 8]), "running": running, "tags": tags,
                             "queued": rng.randint(0, 5), "warm": {"img": rng.randint(0, 1)},
                             "online": rng.random() > 0.1}
        fast_sch = Scheduler(p, LiveState.from_mapping(spec), seed=1)
        slow_sch = Scheduler(p, LiveState.from_mapping(spec), seed=1)
        for _ in range(3):  # several decisions: round-robin cursors and the rng move on
            fast = fast_sch.decide("t", container="img")
            slow = slow_sch.decide("t", container="img", explain=True)
            assert (fast.worker, fast.block) == (slow.worker, slow.block)
            if fast.worker is None:
                assert fast.reason == slow.reason
