"""Supervising the user agents stopped with a lane (issue 39): their lanes' queues are at the
service, and a supervision round runs every 0.5 s. A lane found empty is looked at again only
once the lane reader (multiuser/lane_routes.py) saw a task arrive in it: 200 stopped lanes
cost the service's Redis one XLEN each once, then nothing per round, counted on a real
redis-server (`INFO commandstats`); a task sent to one lane wakes that lane alone. Idle
rounds of the lane reader write no seen mark."""
from __future__ import annotations

import json
from pathlib import Path

import redis

from endpoint_agent.multiuser.accounts import Account
from endpoint_agent.multiuser.lane_routes import LaneRoutes
from endpoint_agent.multiuser.user_agents import UserAgent, UserAgents
from skyfn.protocol.queues.redis_streams import RedisStreamQueue

LANES = 200


def calls(r: redis.Redis, command: str) -> int:
    return r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def stopped_lane_agents(r: redis.Redis, url: str, tmp_path: Path) -> UserAgents:
    agents = UserAgents(router=None, state_dir=tmp_path, runtime_dir=tmp_path / "run", endpoint_id="ep",
                        name="mu", python="python3", environment={}, working_directory="/tmp", idle_timeout=60,
                        lease_seconds=30, deny=[], min_uid=1000, fail_tasks=lambda ua, why: None)
    account = Account(name="someone", uid=4242, gid=4242, groups=(4242,), home="/tmp", shell="/bin/sh")
    for i in range(LANES):
        name = f"tasks:ep:l:lane{i}"
        queue = RedisStreamQueue(name, url=url, consumer="endpoint")
        queue.ensure()
        ua = UserAgent(key=f"someone-{i:012d}", account=account, digest=f"{i:064d}", config={}, acl_user=f"u{i}",
                       password="x", endpoint_id="ep", lane={"lane": f"lane{i}", "task_queue": {"name": name}},
                       lane_queue=queue, started=1.0)
        agents.agents[ua.key] = ua
    return agents


def test_stopped_lane_agents_cost_the_service_nothing_per_round_until_a_task_arrives(redis_url, tmp_path):
    r = redis.Redis.from_url(redis_url)
    agents = stopped_lane_agents(r, redis_url, tmp_path)
    routes = LaneRoutes(agents, lanes_client=r, router_client=r)
    agents.may_hold = routes.may_hold
    restarted: list[str] = []
    agents._restart = lambda ua: restarted.append(ua.key)  # what supervise does for a lane that holds a task
    routes.catch_up()

    before = calls(r, "xlen")
    agents.supervise()
    assert calls(r, "xlen") - before == LANES  # each stopped lane looked at once
    before, sets = calls(r, "xlen"), calls(r, "set")
    for _ in range(20):  # ten seconds of rounds
        routes.catch_up()
        agents.supervise()
    assert calls(r, "xlen") == before and calls(r, "set") == sets and restarted == []

    RedisStreamQueue("tasks:ep:l:lane7", url=redis_url, consumer="svc").send([json.dumps({"tasks": []}).encode()])
    routes.catch_up()
    agents.supervise()
    assert calls(r, "xlen") - before == 1 and restarted == ["someone-000000000007"]


def test_an_agent_stopped_again_has_its_lane_looked_at_once_more(redis_url, tmp_path):
    r = redis.Redis.from_url(redis_url)
    agents = stopped_lane_agents(r, redis_url, tmp_path)
    routes = LaneRoutes(agents, lanes_client=r, router_client=r)
    ua = agents.agents["someone-000000000003"]
    assert routes.may_hold(ua) and not routes.may_hold(ua)
    ua.started = 2.0  # it ran again and stopped: what it left is looked at
    assert routes.may_hold(ua) and not routes.may_hold(ua)
    no_lane = UserAgent(key="k", account=ua.account, digest="0" * 64, config={}, acl_user="u", password="x",
                        endpoint_id="ep")
    assert routes.may_hold(no_lane) and routes.may_hold(no_lane)  # its stream is the router's own


def test_an_idle_round_of_the_lane_reader_is_one_xread(redis_url, tmp_path):
    r = redis.Redis.from_url(redis_url)
    agents = stopped_lane_agents(r, redis_url, tmp_path)
    routes = LaneRoutes(agents, lanes_client=r, router_client=r)
    arrived = routes._round(True)  # the first round reads everything up to now
    assert arrived is False
    before = calls(r, "xread")
    for _ in range(4):
        arrived = routes._round(arrived)
    assert calls(r, "xread") - before == 4 and arrived is False
    RedisStreamQueue("tasks:ep:l:lane9", url=redis_url, consumer="svc").send([json.dumps({"tasks": []}).encode()])
    assert routes._round(False) is True  # the wait saw it: the next round reads it
    recorded_before = routes._positions(["tasks:ep:l:lane9"])["tasks:ep:l:lane9"]
    routes._round(True)
    assert routes._positions(["tasks:ep:l:lane9"])["tasks:ep:l:lane9"] != recorded_before
