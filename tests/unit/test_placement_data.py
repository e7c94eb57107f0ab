"""Data-aware placement (issue 12): the `data_local` strategy and the `data` affinity.

`decide(..., data={worker: bytes})` says where a task's refs live (the SDK reads it off the
refs; the service never opens them). data_local takes the valid worker holding the most of
them, else the shortest backlog; `affinity: data` keeps only holders, `!data` only the
others; a task without refs is not constrained. Reasons name the data."""
from __future__ import annotations

import textwrap

import pytest

from skyfn.placement import LiveState, PolicyError, Scheduler, load_policy


def state(**workers):
    s = LiveState()
    for name, (running, capacity) in workers.items():
        s.upsert(name, capacity=capacity, online=True)
        for _ in range(running):
            s._start(s.workers[name], None)
    return s


def sched(text, st):
    return Scheduler(load_policy(textwrap.dedent(text)), st, seed=1)


def test_data_local_prefers_the_endpoint_holding_the_most_bytes():
    s = sched("""
        default:
          - workers: "*"
            strategy: data_local
        """, state(a=(0, 4), b=(3, 4), c=(0, 4)))
    d = s.decide(data={"b": 100 << 20, "c": 1 << 10})
    assert d.worker == "b"  # busier, but it holds 100 MiB of the task's data
    assert "data local: b holds 104857600 bytes of the task's refs" in d.reason
    # without data: shortest backlog (a and c idle, a first)
    assert s.decide().worker == "a"
    # data on a worker outside the group: shortest backlog, and the reason says where the data is
    d = s.decide(data={"elsewhere": 5})
    assert d.worker == "a" and "the task's refs live on elsewhere, not on a" in d.reason


def test_data_local_skips_an_invalid_holder():
    s = sched("""
        default:
          - workers: "*"
            strategy: data_local
            invalidate: {max_concurrent_invocations: 2}
        """, state(a=(1, 4), b=(2, 4)))
    assert s.decide(data={"b": 10}).worker == "a"  # b holds the data but is at its limit


def test_data_affinity_keeps_only_holders_and_falls_through_blocks():
    policy = """
        sim:
          - workers: "*"
            affinity: data
          - workers: [c]
        """
    s = sched(policy, state(a=(0, 4), b=(0, 4), c=(0, 4)))
    assert {s.decide("sim", data={"b": 1}).worker for _ in range(20)} == {"b"}
    assert s.decide("sim").worker in {"a", "b", "c"}  # no refs: not constrained
    s2 = sched(policy, state(a=(0, 4), b=(0, 4), c=(0, 4)))
    s2.state.upsert("b", online=False)
    d = s2.decide("sim", data={"b": 1}, explain=True)
    assert d.worker == "c" and d.block == 2
    rejected = dict(d.trace[0].rejected)
    assert rejected["a"] == "holds none of the task's data (its refs live on b; affinity data)"
    assert rejected["b"] == "offline"


def test_anti_data_affinity_and_fail_names_the_data():
    s = sched("""
        copy:
          - workers: "*"
            affinity: "!data"
          - followup: fail
        """, state(a=(0, 4)))
    d = s.decide("copy", data={"a": 7})
    assert d.worker is None
    assert "a holds the task's data (anti-affinity !data)" in d.reason and "followup: fail" in d.reason


def test_data_affinity_is_not_an_undefined_tag_but_other_names_still_warn():
    p = load_policy("t:\n  - workers: '*'\n    affinity: data, ghost\n")
    assert [w.reason for w in p.warnings] == [
        "affinity on tag 'ghost', which this policy does not define (functions tagged 'ghost' use the default blocks)"]
    with pytest.raises(PolicyError, match="unknown strategy 'data_locl'.*data_local"):
        load_policy("t:\n  - workers: '*'\n    strategy: data_locl\n")
