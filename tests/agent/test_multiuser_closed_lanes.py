"""Closed lanes watched without a read per lane per supervision round (issue 39): a lane is looked
at when closed, then at doubling gaps until the watch ends (eight looks in a minute, not 120);
a lane bound again leaves the watch at once."""
from __future__ import annotations

from endpoint_agent.multiuser.closed_lanes import ClosedLanes


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_closed_lane_is_looked_at_when_closed_then_at_doubling_gaps_until_the_watch_ends():
    clock = Clock()
    lanes = ClosedLanes(watch_s=60.0, clock=clock)
    lanes.add("a", "queue-a")
    looks = []
    for _ in range(int(70 / 0.5)):  # supervision rounds every 0.5 s for 70 s
        if lanes.due():
            looks.append(clock.now - 1000.0)
        clock.now += 0.5
    assert looks == [0.0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5, 60.0]
    assert "a" not in lanes and len(lanes) == 0


def test_two_hundred_lanes_closed_at_once_are_not_read_every_round():
    clock = Clock()
    lanes = ClosedLanes(clock=clock)
    for i in range(200):
        lanes.add(f"l{i}", f"q{i}")
    reads = 0
    for _ in range(int(61 / 0.5) + 1):
        reads += len(lanes.due())
        clock.now += 0.5
    assert reads == 200 * 8 and len(lanes) == 0


def test_a_lane_bound_again_leaves_the_watch_with_its_queue():
    clock = Clock()
    lanes = ClosedLanes(clock=clock)
    lanes.add("a", "queue-a")
    lanes.add("b", "queue-b")
    assert lanes.take("a") == "queue-a" and lanes.take("a") is None
    assert lanes.due() == ["queue-b"] and "a" not in lanes and "b" in lanes
