"""WarmPool and choose_manager: deterministic, with explicit times (a fake clock)."""
from __future__ import annotations

import pytest

from endpoint_agent.containers.warm_pool import (BUSY, COLD, EMPTY, EVICT, IDLE, WARM, ManagerView, WarmPool,
                                                 choose_manager)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def tick(self, dt=1.0):
        self.t += dt
        return self.t


def test_cold_then_warm_reuse():
    c = Clock()
    p = WarmPool(2, idle_timeout=60)
    d = p.place("a", c())
    assert (d.action, d.slot) == (COLD, 0)
    p.release(0, c.tick())
    d = p.place("a", c.tick())
    assert (d.action, d.slot) == (WARM, 0)  # warm reuse: no second cold start
    assert p.stats.cold_starts == 1 and p.stats.warm_hits == 1


def test_empty_slot_before_eviction():
    c = Clock()
    p = WarmPool(2)
    p.place("a", c()); p.release(0, c.tick())
    d = p.place("b", c.tick())
    assert (d.action, d.slot, d.evicted) == (COLD, 1, None)
    assert p.stats.evictions == 0


def test_lru_idle_worker_of_other_type_evicted():
    c = Clock()
    p = WarmPool(3)
    for t in ("a", "b", "c"):
        p.place(t, c.tick())
    p.release(1, c.tick())   # b idle first (least recently used)
    p.release(0, c.tick())   # then a
    p.release(2, c.tick())   # then c
    d = p.place("d", c.tick())
    assert (d.action, d.slot, d.evicted) == (EVICT, 1, "b")
    assert p.slots[1].ctype == "d" and p.slots[1].state == BUSY
    assert p.stats.evictions == 1 and p.stats.cold_starts == 4


def test_never_evicts_busy_worker():
    c = Clock()
    p = WarmPool(2)
    p.place("a", c.tick()); p.place("b", c.tick())
    assert p.place("c", c.tick()) is None          # both busy: wait
    assert p.place("a", c.tick()) is None          # the a worker is busy too
    p.release(1, c.tick())
    d = p.place("c", c.tick())
    assert (d.action, d.slot, d.evicted) == (EVICT, 1, "b")
    assert p.slots[0].ctype == "a" and p.slots[0].state == BUSY


def test_warm_prefers_most_recently_used_and_skips_busy():
    c = Clock()
    p = WarmPool(3)
    for _ in range(3):
        p.place("a", c.tick())
    p.release(2, c.tick()); p.release(0, c.tick())
    assert p.place("a", c.tick()).slot == 0   # most recently released
    assert p.place("a", c.tick()).slot == 2
    assert p.place("a", c.tick()) is None


def test_idle_timeout_expiry():
    c = Clock()
    p = WarmPool(2, idle_timeout=30, half_life=1)
    p.place("a", c()); p.place("b", c())
    p.release(0, c.tick(1)); p.release(1, c.tick(20))
    assert p.expire(c.tick(20)) == [0]         # a idle 40 s > 30; b idle 20 s
    assert p.slots[0].state == EMPTY and p.slots[1].state == IDLE
    assert p.expire(c.tick(11)) == [1]
    assert p.stats.expirations == 2
    d = p.place("a", c.tick())
    assert d.action == COLD                     # expired: a cold start again


def test_busy_never_expires():
    c = Clock()
    p = WarmPool(1, idle_timeout=1)
    p.place("a", c())
    assert p.expire(c.tick(100)) == []
    assert p.slots[0].state == BUSY


def test_proportional_targets_and_decay():
    c = Clock()
    p = WarmPool(4, half_life=10)
    p.observe("a", c(), 30); p.observe("b", c(), 10)
    assert p.targets(c()) == {"a": 3, "b": 1}
    p.observe("c", c(), 40)
    assert p.targets(c()) == {"c": 2, "a": 2}   # a 1.5, b 0.5, c 2.0: the tie goes to more demand
    c.tick(100)  # 10 half-lives: old demand decays away, new demand dominates
    p.observe("d", c(), 5)
    assert p.targets(c()) == {"d": 4}


def test_max_per_type_caps_targets_and_placement():
    c = Clock()
    p = WarmPool(4, max_per_type=2)
    p.observe("a", c(), 100); p.observe("b", c(), 1)
    t = p.targets(c())
    assert t["a"] == 2 and t["b"] == 1
    p.place("a", c()); p.place("a", c())
    assert p.place("a", c()) is None           # at the cap: wait rather than a third a
    assert p.place("b", c()).action == COLD


def test_eviction_prefers_type_over_its_share():
    c = Clock()
    p = WarmPool(4, half_life=1e6)
    p.observe("a", c(), 10); p.observe("b", c(), 90)   # targets a:1 (ish), b:3
    p.place("a", c.tick()); p.place("a", c.tick()); p.place("b", c.tick()); p.place("b", c.tick())
    p.release(2, c.tick())   # b idle first: the LRU one
    p.release(0, c.tick())   # a idle
    d = p.place("c", c.tick())
    assert d.action == EVICT and d.evicted == "a"   # a holds 2 > its share; b is under its share


def test_expire_then_prewarm_restores_share():
    c = Clock()
    p = WarmPool(2, idle_timeout=5, half_life=1e6)
    p.observe("a", c(), 10)
    p.place("a", c()); p.place("a", c())
    p.release(0, c()); p.release(1, c())
    assert p.expire(c.tick(10)) == [0, 1]       # idle timeout is absolute
    assert p.prewarm(c()) == [(0, "a"), (1, "a")]   # demand says: a deserves both slots


def test_prewarm_proportional():
    c = Clock()
    p = WarmPool(4)
    p.observe("a", c(), 3); p.observe("b", c(), 1)
    plan = p.prewarm(c())
    assert sorted(t for _s, t in plan) == ["a", "a", "a", "b"]
    for slot, t in plan:
        p.start_idle(slot, t, c())
    assert p.warm_idle() == {"a": 3, "b": 1}
    assert p.prewarm(c()) == []
    assert p.place("b", c()).action == WARM
    assert p.stats.prewarms == 4 and p.stats.cold_starts == 4


def test_schedule_warm_first_then_lru():
    c = Clock()
    p = WarmPool(2, max_wait=1e9)
    p.place("a", c.tick()); p.place("b", c.tick())
    p.release(0, c.tick())   # a idle
    q = [("c", c()), ("b", c()), ("a", c())]
    got = p.schedule(q, c())
    assert [(i, d.action, d.slot) for i, d in got] == [(2, WARM, 0)]   # a jumps ahead; c waits
    p.release(1, c.tick())   # b idle; queue now [c, b]
    got = p.schedule([("c", c()), ("b", c())], c())
    assert [(i, d.action) for i, d in got] == [(1, WARM)]


def test_schedule_starving_task_goes_first():
    c = Clock()
    p = WarmPool(1, max_wait=5)
    p.place("a", c()); p.release(0, c())
    t0 = c()
    q = [("b", t0 - 10), ("a", t0)]
    got = p.schedule(q, t0)
    assert [(i, d.action, d.evicted) for i, d in got] == [(0, EVICT, "a")]


def test_advertise():
    c = Clock()
    p = WarmPool(3)
    p.place("a", c()); p.place(None, c()); p.release(1, c())
    assert p.advertise() == {"free": 2, "warm": {"": 1}}
    p.release(0, c())
    assert p.advertise() == {"free": 3, "warm": {"a": 1, "": 1}}


def test_choose_manager_warm_with_most_free():
    ms = {"m1": ManagerView(5, {"b": 1}), "m2": ManagerView(1, {"a": 1}), "m3": ManagerView(3, {"a": 2})}
    assert choose_manager(ms, "a") == "m3"          # warm a, and more free than m2
    assert choose_manager(ms, "c") == "m1"          # nobody warm for c: most free
    assert choose_manager(ms, "a", exclude=["m3"]) == "m2"


def test_choose_manager_ties_and_none():
    ms = {"x": ManagerView(2), "w": ManagerView(2)}
    assert choose_manager(ms, "a") == "w"            # deterministic tie-break
    assert choose_manager({"x": ManagerView(0, {"a": 1})}, "a") is None
    assert choose_manager({}, "a") is None
    assert choose_manager({"p": ManagerView(1, {"": 1}), "q": ManagerView(4)}, None) == "p"


def test_rejects_zero_slots():
    with pytest.raises(ValueError):
        WarmPool(0)


def test_schedule_no_extra_cold_start_for_short_tasks():
    c = Clock()
    p = WarmPool(3, max_wait=1e9, cold_start_s=0.3)
    p.note_task("a", 0.001)
    p.place("a", c())                       # a busy; two empty slots
    q = [("a", c())] * 10 + [("b", c())]
    got = p.schedule(q, c())
    # 10 short a tasks are not worth a second a container: b gets a slot, the a's wait
    assert [(i, d.action, d.ctype) for i, d in got] == [(10, COLD, "b")]


def test_schedule_extra_workers_for_long_tasks():
    c = Clock()
    p = WarmPool(3, max_wait=1e9, cold_start_s=0.3)
    p.note_task("a", 0.5)
    p.place("a", c())
    got = p.schedule([("a", c())] * 10, c())
    assert [d.action for _i, d in got] == [COLD, COLD]   # 10 x 0.5 s of work: parallelism pays
    p2 = WarmPool(2, max_wait=1e9)
    p2.place("a", c())
    assert len(p2.schedule([("a", c())] * 3, c())) == 1  # run time unknown: optimistic


def test_note_estimates():
    p = WarmPool(1, cold_start_s=1.0)
    p.note_cold_start(0.2)
    assert p.est_cold == 0.2
    p.note_cold_start(0.4)
    assert abs(p.est_cold - 0.26) < 1e-9
    p.note_task("a", 1.0); p.note_task("a", 0.0)
    assert abs(p.est_task["a"] - 0.8) < 1e-9
