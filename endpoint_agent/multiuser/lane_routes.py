"""The routing record of the tasks the service sends straight to lanes (skyfn.protocol.lanes).

The privileged process does not route a lane's tasks itself: the service adds them to the
lane's task queue, which the lane's own login may read and delete from but never add to
(lambdas/core/identity/queue_acl.py), and the endpoint's login may read. So the record of who
submitted which task to which user agent comes from those messages, written by the service
(or by the privileged process itself: the first pack of a binding). `LaneRoutes` reads every
open lane's task stream with XREAD -- it takes nothing: the agent's consumer group is
untouched -- from the last entry it saw (kept in the router's Redis, so a restart goes on
from there), and writes each task's route (user agent, identity, function id and name) and
its submitter's claims into the router's Redis (multiuser/routes.py), as the router does for
the packs it routes.

It also tells supervision when a stopped user agent's lane may hold a task (`may_hold`): a
lane found empty is not looked at again until this reader sees an entry arrive in it, so
the user agents stopped with a lane cost the service's Redis nothing per supervision round
(one XREAD over all lanes here, whatever their number), not a command per lane every 0.5 s.
A task arriving in such a lane wakes supervision at once (`wake`), so the agent starts
without waiting for the next round. A lane closed (unbound) is forgotten here (`forget`).

After each read it sets each agent's *seen mark* (`<agent prefix>seen`: the last entry id it
has read of the lane; the agent's login may GET it), and an honest agent deletes a lane
message only once the mark has passed it (multiuser/lane.py, SeenMark): no message is gone
before its route is kept. `catch_up()` reads up to now at once: the router calls it before
judging an audit copy of a task it has no route for.

A compromised agent that deletes its lane's messages at once can hide tasks of its own users
from the audit log (its copies of them are then disagreements; the service still records the
tasks); it cannot make a route: it cannot add to its lane.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Callable, Optional

import orjson
import redis

from endpoint_agent.multiuser.routes import AUDITED, IDENTITIES, ROUTES, route_value

log = logging.getLogger("skyfn.multiuser.lane_routes")

POSITIONS = "mu:lanetail"  # hash: lane task stream -> the last entry id read
WAIT_MS = 500              # how long one idle XREAD waits for a new entry
BATCH = 500                # entries one read takes per stream
MARKS_AGAIN_S = 30.0       # every seen mark is written again this often (a router Redis started empty)


def routes_of_pack(body: bytes) -> Optional[tuple[dict, dict]]:
    """({task id: (function id, name)}, identity claims) of a TaskPack body, reading only its
    envelope; None when it is not one."""
    try:
        pack = orjson.loads(body)
        identity = pack.get("identity")
        if not isinstance(identity, dict) or not isinstance(identity.get("id"), str) or not identity["id"]:
            return None
        meta = pack.get("function_meta") or {}
        tasks = {}
        for t in pack["tasks"]:
            name = (meta.get(t["function_id"]) or {}).get("name") if isinstance(meta, dict) else None
            tasks[str(t["task_id"])] = (str(t["function_id"]), name if isinstance(name, str) else None)
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None
    claims = {k: identity.get(k) for k in ("id", "username", "email", "identity_provider")}
    return tasks, claims


class LaneRoutes:
    """Keeps the routes of the tasks in the lanes of `agents` (see the module docstring)."""

    def __init__(self, agents, lanes_client: redis.Redis, router_client: redis.Redis):
        self.agents = agents          # UserAgents: which agents have a lane, and its task stream
        self.q = lanes_client         # the service's Redis, as the endpoint's queue login
        self.r = router_client        # the router's Redis, as its admin
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.recorded = 0
        self._quiet: dict[str, float] = {}   # lane stream -> its agent's start when found empty since
        self._marked: dict[str, str] = {}    # lane stream -> the seen mark last written
        self._marks_again = 0.0              # monotonic: when every mark is written again
        self.wake: Callable[[], None] = lambda: None  # a task arrived in a lane of a stopped agent

    def _lanes(self) -> dict[str, object]:
        """lane task stream -> its user agent, for the agents with a lane."""
        with self.agents.lock:
            return {ua.lane["task_queue"]["name"]: ua for ua in self.agents.agents.values() if ua.lane is not None}

    def _positions(self, streams: list[str]) -> dict[str, str]:
        raws = self.r.hmget(POSITIONS, streams)
        return {s: (raw.decode() if isinstance(raw, bytes) else raw) or "0-0" for s, raw in zip(streams, raws)}

    def catch_up(self) -> int:
        """Read every lane up to now and keep the routes of what is there; how many tasks."""
        everyone = self._lanes()  # before our lock: the agents' lock is taken first, as forget() is called
        with self._lock:
            lanes = {stream: ua for stream, ua in everyone.items() if ua.lane is not None}  # not closed meanwhile
            if not lanes:
                return 0
            positions = self._positions(list(lanes))
            total = 0
            while True:
                got = self.q.xread(positions, count=BATCH)
                if not got:
                    break
                for stream, entries in got:
                    stream = stream.decode() if isinstance(stream, bytes) else stream
                    if self._quiet.pop(stream, None) is not None:  # a task arrived: supervision looks again
                        self.wake()
                    total += self._record(lanes[stream], entries)
                    last = entries[-1][0]
                    positions[stream] = last.decode() if isinstance(last, bytes) else last
                self.r.hset(POSITIONS, mapping={s: positions[s] for s in positions})
            self._mark_seen(lanes, positions)
            self.recorded += total
            return total

    def _record(self, ua, entries: list) -> int:
        routes, claims = {}, {}
        for _, fields in entries:
            body = fields.get(b"b") if isinstance(fields, dict) else None
            parsed = routes_of_pack(body) if body is not None else None
            if parsed is None:
                continue
            tasks, identity = parsed
            claims[identity["id"]] = json.dumps(identity)
            for tid, (fid, name) in tasks.items():
                routes[tid] = route_value(ua.key, identity["id"], fid, name)
        if not routes:
            return 0
        ids = list(routes)
        pipe = self.r.pipeline(transaction=False)
        for tid in ids:
            pipe.exists(AUDITED + tid)
        done = {tid for tid, seen in zip(ids, pipe.execute()) if seen}
        fresh = {tid: v for tid, v in routes.items() if tid not in done}  # read again: its line is written
        pipe = self.r.pipeline(transaction=False)
        if fresh:
            pipe.hset(ROUTES, mapping=fresh)
        pipe.hset(IDENTITIES, mapping=claims)
        pipe.execute()
        return len(fresh)

    def _mark_seen(self, lanes: dict, positions: dict[str, str]) -> None:
        """Each agent's seen mark, where it moved (an idle round writes nothing)."""
        if time.monotonic() >= self._marks_again:
            self._marked.clear()
            self._marks_again = time.monotonic() + MARKS_AGAIN_S
        moved = {stream: ua for stream, ua in lanes.items() if self._marked.get(stream) != positions[stream]}
        if not moved:
            return
        pipe = self.r.pipeline(transaction=False)
        for stream, ua in moved.items():
            pipe.set(ua.stream("seen"), positions[stream])
        pipe.execute()
        self._marked.update({stream: positions[stream] for stream in moved})

    def may_hold(self, ua) -> bool:
        """Whether supervision should look at a stopped user agent's task queue: always for one
        without a lane (its stream is in the router's Redis); for a lane, once after the agent
        stopped, and then only after an entry arrived in it (see the module docstring). Marks
        the lane looked at: the caller looks now."""
        if ua.lane is None or ua.lane_queue is None:
            return True
        stream = ua.lane["task_queue"]["name"]
        with self._lock:
            if self._quiet.get(stream) == ua.started:
                return False
            self._quiet[stream] = ua.started
            return True

    def forget(self, stream: str) -> None:
        """A lane closed: no longer read, its position and marks dropped (bound again, it is
        read from its start: only messages not yet deleted are there)."""
        with self._lock:
            self._quiet.pop(stream, None)
            self._marked.pop(stream, None)
            self.r.hdel(POSITIONS, stream)

    # --- the thread ------------------------------------------------------------------------
    def start(self) -> "LaneRoutes":
        self._thread = threading.Thread(target=self._run, name="skyfn-mu-lane-routes", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        delay, arrived = 0.2, True
        while not self._halt.is_set():
            try:
                arrived = self._round(arrived)
                delay = 0.2
            except Exception as exc:  # noqa: BLE001 - a Redis restarting: again, backing off
                log.warning("cannot read the lanes' task streams (%s); retrying in %.1f s", exc, delay)
                self._halt.wait(delay)
                delay, arrived = min(5.0, delay * 2), True

    def _round(self, arrived: bool) -> bool:
        """One round of the thread: read what arrived (after a wait that saw an entry, or a new
        lane), then wait (taking nothing) for an entry past what was read. An idle round is
        that one blocking XREAD at the service. Returns whether the wait saw an entry."""
        if arrived:
            self.catch_up()
        lanes = self._lanes()
        if not lanes:
            self._halt.wait(WAIT_MS / 1000)
            return True
        # a lane new since the last read starts at 0-0 here: the wait returns at once with its entries
        return bool(self.q.xread(self._positions(list(lanes)), count=1, block=WAIT_MS))

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(WAIT_MS / 1000 + 5)
