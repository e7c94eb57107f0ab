"""The two example scripts of the aAPP paper ("Affinity-aware Serverless Function
Scheduling"), written in the paper's notation, parse and behave as the paper describes —
also in the paper's own layout (followup beside the tag; Figure 3 in aapp_figure3.yaml)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from skyfn.placement import LiveState, Scheduler, load_policy, load_policy_file

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


# --- issue 15: the scripts in the paper's own layout (followup beside the tag) ----------
FIGURE_3 = Path(__file__).with_name("aapp_figure3.yaml")

F_TAG_PAPER_LAYOUT = """
- f_tag:
  - workers:
    - wrk: local_w1
    - wrk: local_w2
    strategy: best_first
    invalidate: capacity_used 50%
  - workers:
    - wrk: public_w1
  followup: fail
"""


def shape(policy):
    return {n: ([(b.workers, b.strategy, b.invalidate, b.require, b.forbid) for b in tp.blocks], tp.followup)
            for n, tp in policy.tags.items()}


def test_figure_3_loads_as_written_and_equals_the_canonical_script():
    p = load_policy_file(FIGURE_3)
    assert p.warnings == () and shape(p) == shape(load_policy(DIVIDE_IMPERA))
    assert [(n, tp.line, [b.line for b in tp.blocks]) for n, tp in p.tags.items()] == \
        [("divide", 5, [6, 8]), ("impera", 11, [12]), ("heavy", 15, [16])]


def test_f_tag_in_the_paper_layout_schedules_like_the_app_paper():
    s = workers("local_w1", "local_w2", "public_w1")
    sch = Scheduler(load_policy(F_TAG_PAPER_LAYOUT), s)
    assert [sch.place("f_tag").worker for _ in range(6)] == \
        ["local_w1", "local_w1", "local_w2", "local_w2", "public_w1", "public_w1"]
    s.upsert("public_w1", online=False)
    assert sch.place("f_tag").reason.endswith("(followup: fail)")


def test_figure_3_schedules_as_the_paper_describes():
    s = workers("w1", "w2", "w3")
    sch = Scheduler(load_policy_file(FIGURE_3), s, seed=3)
    s.started("w1", "heavy")
    # impera: anywhere but beside heavy
    assert {sch.decide("impera").worker for _ in range(40)} == {"w2", "w3"}
    # divide without an impera partner: its second block (no heavy)
    d = sch.decide("divide", explain=True)
    assert (d.block, d.line) == (2, 8) and d.worker in {"w2", "w3"}
    # with impera on w2: divide joins it, every time
    s.started("w2", "impera")
    assert {sch.decide("divide").worker for _ in range(20)} == {"w2"}
    # heavy keeps away from divide and impera: only w1 (itself heavy) and w3 remain
    s.started("w3", "divide")
    d = sch.decide("heavy", explain=True)
    assert d.worker == "w1"
    assert dict(d.trace[0].rejected) == {"w2": "runs 1 'impera' function(s) (anti-affinity !impera)",
                                         "w3": "runs 1 'divide' function(s) (anti-affinity !divide)"}
    # heavy everywhere: divide fails (followup fail), naming both blocks and their lines
    s.started("w2", "heavy")
    s.started("w3", "heavy")
    d = sch.decide("divide")
    assert d.worker is None and d.transient
    assert d.reason.startswith("no valid worker for tag 'divide': 'divide' block 1 (line 6): w1 runs 1 'heavy' ")
    assert "'divide' block 2 (line 8): " in d.reason and d.reason.endswith("(followup: fail)")


def test_figure_3_through_the_cli(tmp_path):
    state = tmp_path / "state.yaml"
    state.write_text("workers:\n  w1: {capacity: 4, tags: {heavy: 1}}\n  w2: {capacity: 4, tags: {impera: 1}}\n"
                     "  w3: {capacity: 4}\n")
    out = subprocess.run([sys.executable, "-m", "skyfn.cli", "policy", "check", str(FIGURE_3), "--tag", "divide",
                          "--state", str(state)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"{FIGURE_3}: valid, 3 tags (divide, impera, heavy)",
        "",
        "tag 'divide' -> worker 'w2' ('divide' block 1, line 6)",
        "  'divide' block 1 (line 6): workers *; strategy any; affinity impera, !heavy",
        "    w1: rejected, runs 1 'heavy' function(s) (anti-affinity !heavy)",
        "    w2: valid  <- chosen",
        "    w3: rejected, runs no 'impera' function (affinity impera)"]
    state.write_text("workers:\n  w1: {capacity: 4, tags: {heavy: 1}}\n  w2: {capacity: 4, tags: {heavy: 2}}\n")
    out = subprocess.run([sys.executable, "-m", "skyfn.cli", "policy", "check", str(FIGURE_3), "--tag", "divide",
                          "--state", str(state)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "tag 'divide' -> no worker: no valid worker for tag 'divide': " in out.stdout
    assert out.stdout.rstrip().endswith("w2: rejected, runs 2 'heavy' function(s) (anti-affinity !heavy)")
