"""The two example scripts of the aAPP paper ("Affinity-aware Serverless Function
Scheduling"), written in the paper's notation, parse and behave as the paper describes."""
from __future__ import annotations

from skyfn.placement import LiveState, Scheduler, load_policy

# APP's example: functions tagged f_tag prefer the two local workers, in order, while
# each is under half its capacity; then the public worker; otherwise they are not scheduled.
F_TAG = """
- f_tag:
  - workers:
    - wrk: local_w1
    - wrk: local_w2
    strategy: best_first
    invalidate: capacity_used 50%
  - workers:
    - wrk: public_w1
  - followup: fail
"""

# aAPP's divide-et-impera example: `divide` wants to share a worker with `impera` (they
# exchange data) and must never share one with the CPU-hungry `heavy`; `impera` avoids
# `heavy`; `heavy` keeps away from both.
DIVIDE_IMPERA = """
divide:
  - workers: *
    affinity: impera, !heavy
  - workers: *
    affinity: !heavy
  - followup: fail
impera:
  - workers: *
    affinity: !heavy
  - followup: fail
heavy:
  - workers: *
    affinity: !divide, !impera
  - followup: fail
"""


def workers(*names, capacity=4) -> LiveState:
    s = LiveState()
    for n in names:
        s.upsert(n, capacity=capacity)
    return s


def test_f_tag_parses_as_written():
    p = load_policy(F_TAG)
    tp = p.tags["f_tag"]
    assert tp.followup == "fail" and len(tp.blocks) == 2
    b1, b2 = tp.blocks
    assert b1.workers == ("local_w1", "local_w2") and b1.strategy == "best_first"
    assert b1.invalidate.capacity_used == 50.0
    assert b2.workers == ("public_w1",) and b2.strategy == "any" and b2.invalidate is None


def test_f_tag_fills_local_workers_in_order_to_half_capacity_then_public_then_fails():
    s = workers("local_w1", "local_w2", "public_w1")
    sch = Scheduler(load_policy(F_TAG), s)
    assert [sch.place("f_tag").worker for _ in range(6)] == \
        ["local_w1", "local_w1", "local_w2", "local_w2", "public_w1", "public_w1"]
    # a local worker back under 50% takes priority again
    s.finished("local_w1", "f_tag")
    assert sch.place("f_tag").worker == "local_w1"
    # the public worker gone: nothing valid, followup fail
    s.upsert("public_w1", online=False)
    d = sch.place("f_tag")
    assert d.worker is None
    assert "local_w1 capacity used 50% reaches the 50% threshold" in d.reason
    assert "public_w1 offline" in d.reason and d.reason.endswith("(followup: fail)")


def test_f_tag_other_functions_are_unaffected():
    s = workers("local_w1", "local_w2", "public_w1")
    for _ in range(2):
        s.started("local_w1", "f_tag")
    d = Scheduler(load_policy(F_TAG), s, seed=0).decide("g")
    assert d.via == "default" and d.worker in {"local_w1", "local_w2", "public_w1"}


def test_divide_impera_parses_as_written():
    p = load_policy(DIVIDE_IMPERA)
    assert p.warnings == ()
    d1, d2 = p.tags["divide"].blocks
    assert (d1.workers, d1.require, d1.forbid) == (None, ("impera",), ("heavy",))
    assert (d2.require, d2.forbid) == ((), ("heavy",))
    assert p.tags["heavy"].blocks[0].forbid == ("divide", "impera")


def test_divide_joins_impera_and_everyone_avoids_heavy():
    s = workers("w1", "w2", "w3")
    sch = Scheduler(load_policy(DIVIDE_IMPERA), s, seed=5)
    s.started("w1", "heavy")
    s.started("w2", "impera")
    # divide: w2 runs impera and no heavy
    assert {sch.decide("divide").worker for _ in range(20)} == {"w2"}
    # impera: anything but w1
    assert {sch.decide("impera").worker for _ in range(40)} == {"w2", "w3"}
    # heavy: not where divide or impera run
    s.started("w3", "divide")
    d = sch.decide("heavy", explain=True)
    assert d.worker == "w1"
    assert dict(d.trace[0].rejected) == {"w2": "runs 1 'impera' function(s) (anti-affinity !impera)",
                                         "w3": "runs 1 'divide' function(s) (anti-affinity !divide)"}


def test_divide_without_an_impera_partner_falls_to_its_second_block():
    s = workers("w1", "w2")
    s.started("w1", "heavy")
    d = Scheduler(load_policy(DIVIDE_IMPERA), s).decide("divide", explain=True)
    assert (d.worker, d.block) == ("w2", 2)
    assert d.trace[0].rejected == [("w1", "runs 1 'heavy' function(s) (anti-affinity !heavy)"),
                                   ("w2", "runs no 'impera' function (affinity impera)")]


def test_heavy_everywhere_fails_divide_with_the_reason():
    s = workers("w1", "w2")
    s.started("w1", "heavy")
    s.started("w2", "heavy")
    d = Scheduler(load_policy(DIVIDE_IMPERA), s).decide("divide")
    assert d.worker is None and d.transient
    assert d.reason.startswith("no valid worker for tag 'divide': 'divide' block 1 (line 3): ")
    assert "'divide' block 2 (line 5): w1 runs 1 'heavy' function(s) (anti-affinity !heavy)" in d.reason
