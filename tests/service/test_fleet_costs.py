"""What an idle endpoint costs the service's periodic work and its heartbeat (issue 39):
counted on a real redis-server as `INFO commandstats` deltas (every command, those run inside
Lua scripts included), with endpoints registered and heartbeating through the real API
handler. A reaper tick over 500 idle endpoints sends the same commands as over 10; a
heartbeat costs the same at 500 as at 10; what a tick does grows with the endpoints that
went silent or were sent work, not with the fleet (docs/fleet.md)."""
from __future__ import annotations

import pytest

from lambdas.adapters.redis_store.connection import redis_client
from skyfn.protocol import pack_args, serialize_function
from tests.service.liveness import heard_long_ago


def noop():
    return None


def commands() -> dict[str, int]:
    """Calls per command so far, INFO itself left out."""
    stats = redis_client().info("commandstats")
    return {k[len("cmdstat_"):]: v["calls"] for k, v in stats.items() if k != "cmdstat_info"}


def cost(fn) -> dict[str, int]:
    """The commands `fn` sends to the store (name -> calls)."""
    before = commands()
    fn()
    after = commands()
    return {k: n - before.get(k, 0) for k, n in after.items() if n - before.get(k, 0)}


def grow(api, endpoints: list[str], to: int) -> None:
    """Register endpoints through the API until there are `to`; each heartbeats once."""
    for i in range(len(endpoints), to):
        status, e = api.call("POST", "/endpoints", {"name": f"idle-{i}"})
        assert status in (200, 201), e
        endpoints.append(e["endpoint_id"])
        assert api.call("POST", f"/endpoints/{e['endpoint_id']}/heartbeat", {})[0] == 200


def reap_cost() -> dict[str, int]:
    from lambdas.reaper import reap

    return cost(reap)


@pytest.fixture
def fleet(api, monkeypatch):
    from lambdas.core import deps
    from lambdas.reaper import reap

    # registering hundreds takes a while on a shared machine: none goes silent meanwhile
    monkeypatch.setenv("SKYFN_HEARTBEAT_TIMEOUT", "3600")
    deps.reset()
    endpoints: list[str] = []
    grow(api, endpoints, 10)
    reap()  # a first tick on a new store builds its indexes once
    return endpoints


def test_a_reaper_tick_and_a_heartbeat_cost_the_same_at_500_idle_endpoints_as_at_10(api, fleet):
    def beat():
        assert api.call("POST", f"/endpoints/{fleet[0]}/heartbeat", {})[0] == 200

    tick_10, beat_10 = reap_cost(), cost(beat)
    grow(api, fleet, 500)
    tick_500, beat_500 = reap_cost(), cost(beat)
    assert tick_500 == tick_10 and beat_500 == beat_10
    assert sum(tick_10.values()) <= 12, tick_10
    # the rate limit (5), its record read once, written (HSET, ZADD): no backlog read, no
    # withdrawal of a channel never published
    assert sum(beat_10.values()) <= 8, beat_10


def test_a_tick_grows_with_the_endpoints_gone_silent_not_with_the_fleet(api, fleet):
    from lambdas.reaper import reap

    grow(api, fleet, 200)
    quiet = reap_cost()
    for ep in fleet[:3]:
        heard_long_ago(ep, 7200)
    before = cost(lambda: None)
    assert before == {}
    got = {}
    spent = cost(lambda: got.update(reap()))
    assert got["offline"] == 3
    extra = sum(spent.values()) - sum(quiet.values())
    assert 0 < extra <= 3 * 4 + 2, spent  # a few commands per silent endpoint, none per idle one
    for ep in fleet[:3]:
        assert api.call("GET", f"/endpoints/{ep}")[1]["status"] == "offline"
    assert api.call("GET", f"/endpoints/{fleet[3]}")[1]["status"] == "online"


def test_dead_letters_are_looked_at_where_work_was_sent_and_then_no_more(api, fleet):
    from lambdas.core import deps
    from lambdas.core.tasks import dead_letters

    grow(api, fleet, 100)
    quiet = reap_cost()
    _, f = api.call("POST", "/functions", {"function": serialize_function(noop)})
    busy = fleet[5]
    status, s = api.call("POST", "/tasks", {"endpoint_id": busy, "tasks": [{"function_id": f["function_id"],
                                                                            "payload": pack_args((), {})}]})
    assert status == 202, s
    assert deps.dead_letter_watch().due() == [busy]
    with_work = reap_cost()
    assert sum(quiet.values()) < sum(with_work.values()) <= sum(quiet.values()) + 12, with_work
    # its queue drained (the agent took and finished the task): the endpoint leaves the watch
    queue, _ = deps.task_queue(busy)
    queue.delete([m.receipt for m in queue.receive(max_messages=10)])
    assert dead_letters.sweep() == 0 and deps.dead_letter_watch().due() == [busy]  # sent within the grace
    deps.dead_letter_watch().touch([busy], 0.0)  # as if sent long ago
    dead_letters.sweep()
    assert deps.dead_letter_watch().due() == []
    assert reap_cost() == quiet


def test_listing_reads_the_callers_endpoint_records_in_one_round_trip(api, monkeypatch):
    import functools
    import os

    from lambdas.adapters.redis_store import connection
    from lambdas.core import deps
    from tests.recording_redis import RecordingRedis

    endpoints: list[str] = []
    grow(api, endpoints, 5)
    recorder = RecordingRedis.from_url(os.environ["SKYFN_REDIS_URL"])
    deps.reset()
    monkeypatch.setattr(connection, "redis_client", functools.lru_cache(maxsize=1)(lambda: recorder))
    status, body = api.call("GET", "/endpoints")
    assert status == 200 and sorted(e["endpoint_id"] for e in body["endpoints"]) == sorted(endpoints)
    assert ("HGETALL",) * 5 in recorder.sent and "HGETALL" not in recorder.sent


def test_an_agents_steady_heartbeat_reads_its_record_once_and_writes_once(api):
    """The agent's own heartbeat as it repeats while idle (its credential, its allowlist as
    it stands, no direct channel): no backlog read, no allowlist read or write beyond its
    record's, no withdrawal of a channel it never published. Its channel, once published,
    is still withdrawn by the next heartbeat without one."""
    from skyfn.protocol.direct import new_session_key
    from tests.service.conftest import Api

    _, reg = api.call("POST", "/endpoints", {"name": "steady"})
    ep, agent = reg["endpoint_id"], Api(reg["agent_credential"])
    body = {"stats": {"workers": 2}, "allowed_functions": [{"owner": "alice", "name": "noop"}]}

    def beat(b=body):
        status, ack = agent.call("POST", f"/endpoints/{ep}/heartbeat", b)
        assert status == 200 and ack["endpoint_id"] == ep and ack["status"] == "online", ack

    beat()  # the first reports the allowlist: written once
    steady = cost(beat)
    assert not {"xlen", "del", "hdel", "hget", "set"} & set(steady), steady
    assert steady.get("hgetall") == 1 and steady.get("hset", 0) <= 2 and steady.get("zadd") == 1, steady

    beat({**body, "direct": {"address": "tcp://10.0.0.7:5999", "server_key": "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7",
                             "session_key": new_session_key()}})
    assert redis_client().get(f"epdirect:{ep}") is not None
    withdrawn = cost(beat)
    assert withdrawn.get("del") == 1 and redis_client().get(f"epdirect:{ep}") is None, withdrawn
    assert "del" not in cost(beat)  # withdrawn once
