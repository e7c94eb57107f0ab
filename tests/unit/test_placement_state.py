"""The live placement state: bookkeeping of starts and finishes per tag, the state-file
format, and consistency under concurrent placements from many threads."""
from __future__ import annotations

import random
import sys
import textwrap
import threading

import pytest

from skyfn.placement import LiveState, Scheduler, load_policy


def test_started_and_finished_track_running_and_tags():
    s = LiveState()
    s.upsert("w", capacity=4)
    s.started("w", "a")
    s.started("w", "a")
    s.started("w", "b")
    s.started("w")  # untagged
    assert s.snapshot()["w"] == {"capacity": 4, "running": 4, "queued": 0, "tags": {"a": 2, "b": 1},
                                 "warm": {}, "online": True}
    assert s.finished("w", "a") and s.finished("w", "b") and s.finished("w")
    assert s.snapshot()["w"]["tags"] == {"a": 1} and s.snapshot()["w"]["running"] == 1
    assert s.workers["w"].capacity_used() == 25.0


def test_duplicate_or_unknown_finishes_change_nothing():
    s = LiveState()
    s.started("w", "a")
    assert s.finished("w", "a")
    assert not s.finished("w", "a")       # duplicate completion
    assert not s.finished("w", "b")       # never started
    assert not s.finished("nope", "a")    # unknown worker
    assert s.snapshot()["w"]["running"] == 0


def test_started_on_an_unknown_worker_adds_it():
    s = LiveState()
    s.started("late", "t")
    assert s.names() == ["late"] and s.workers["late"].tags == {"t": 1}


def test_membership_order_and_version():
    s = LiveState()
    for n in ("b", "a", "c"):
        s.upsert(n)
    v = s.version
    s.upsert("a", capacity=2)            # no membership change
    assert s.version == v and s.names() == ["b", "a", "c"]
    assert s.remove("a") and not s.remove("a")
    assert s.version == v + 1 and s.names() == ["b", "c"] and len(s) == 2


def test_set_running_queued_and_warm():
    s = LiveState()
    s.set_running("w", {"a": 2, "b": 0}, untagged=1)
    s.set_queued("w", 5)
    s.set_warm("w", {"img": 2, "cold": 0})
    assert s.snapshot()["w"] == {"capacity": 0, "running": 3, "queued": 5, "tags": {"a": 2}, "warm": {"img": 2},
                                 "online": True}
    assert s.workers["w"].backlog == 8 and s.workers["w"].capacity_used() is None
    with pytest.raises(ValueError, match="capacity must be >= 0"):
        s.upsert("w", capacity=-1)


def test_from_mapping_forms():
    text = {"workers": {"w1": {"capacity": 4, "tags": {"init": 1}, "queued": 2, "warm": {"img": 1}},
                        "w2": {"tags": ["q", "q", "init"], "running": 5, "online": False},
                        "w3": None}}
    s = LiveState.from_mapping(text)
    snap = s.snapshot()
    assert snap["w1"] == {"capacity": 4, "running": 1, "queued": 2, "tags": {"init": 1}, "warm": {"img": 1},
                          "online": True}
    assert snap["w2"]["running"] == 5 and snap["w2"]["tags"] == {"q": 2, "init": 1} and not snap["w2"]["online"]
    assert snap["w3"]["running"] == 0
    listed = LiveState.from_mapping([{"name": "a", "capacity": 2}, {"name": "b"}])
    assert listed.names() == ["a", "b"]


@pytest.mark.parametrize("data, message", [
    ({"w": {"capcity": 4}}, "worker 'w': unknown field(s) capcity"),
    ({"w": {"capacity": -1}}, "worker 'w': capacity must be a whole number >= 0, got -1"),
    ({"w": {"running": 1, "tags": {"a": 2}}}, "running=1 is less than the 2 tagged invocations"),
    ({"w": {"online": "yes"}}, "online must be true or false"),
    ({"w": {"tags": "a"}}, "tags must map names to counts"),
    ({"w": {"tags": {"a": 1.5}}}, "tags.a must be a whole number"),
    ({"w": 3}, "worker 'w': expected a map of fields"),
    ([{"capacity": 1}], "worker #1 needs a 'name'"),
    ("text", "expected a map of workers"),
])
def test_from_mapping_errors_name_the_worker_and_field(data, message):
    with pytest.raises(ValueError, match="^st: .*" + message.replace("(", r"\(").replace(")", r"\)")):
        LiveState.from_mapping(data, source="st")


def test_concurrent_placements_never_exceed_the_limit_and_balance_to_zero():
    """8 threads place and finish; max_concurrent_invocations is never exceeded at any
    worker (place() decides and records atomically) and every count returns to zero."""
    p = load_policy(textwrap.dedent("""
        t:
          - workers: "*"
            invalidate: max_concurrent_invocations 2
            affinity: "!blocker"
          - followup: fail
        """))
    s = LiveState()
    for n in ("a", "b", "c"):
        s.upsert(n, capacity=4)
    sch = Scheduler(p, s, seed=1)
    violations, placed, refused = [], [0], [0]
    count_lock = threading.Lock()
    start = threading.Barrier(8)

    def run(seed: int) -> None:
        rng = random.Random(seed)
        mine = []
        start.wait()
        for _ in range(1500):
            if mine and (rng.random() < 0.3 or len(mine) > 2):
                assert s.finished(mine.pop(rng.randrange(len(mine))), "t")
                continue
            d = sch.place("t")
            with s.lock:
                over = {w.name: w.running for w in s.order if w.running > 2}
            if over:
                violations.append(over)
            with count_lock:
                if d.ok:
                    placed[0] += 1
                else:
                    refused[0] += 1
            if d.ok:
                mine.append(d.worker)
        for w in mine:
            assert s.finished(w, "t")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so placements really interleave
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert violations == []
    assert placed[0] > 0 and refused[0] > 0  # the limit was reached and enforced
    assert all(v["running"] == 0 and v["tags"] == {} for v in s.snapshot().values())


def test_concurrent_starts_and_finishes_from_many_threads_add_up():
    s = LiveState()
    tags = ["x", "y", None]

    def run(seed: int) -> None:
        rng = random.Random(seed)
        for i in range(3000):
            w, t = f"w{rng.randrange(4)}", tags[i % 3]
            s.started(w, t)
            if i % 3:  # finish two of every three
                assert s.finished(w, t)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = s.snapshot()
    assert sum(v["running"] for v in snap.values()) == 6 * 1000
    assert sum(v["tags"].get("x", 0) for v in snap.values()) == 6 * 1000
    assert sum(v["tags"].get("y", 0) for v in snap.values()) == 0
