"""What an endpoint's queue login may do (lambdas/adapters/queue_logins.py), on a real
redis-server, from the attacker's side: mallory registers an endpoint of her own
(`POST /endpoints`, as `ServiceLink.register` does) and attacks alice's endpoint and tasks
with nothing but the queue login that registration hands her.

Each attack of issue 36 is refused by Redis itself (NOPERM), alice's task then finishes
normally through her own agent's login and the service's results reader, and the table
of commands is exactly what the queue client sends (checked with MONITOR while the real
adapter runs a receive, extend, dead-letter and delete).
"""
from __future__ import annotations

import json
import threading
import time

import pytest
import redis

from lambdas.adapters import queue_logins
from skyfn.protocol import pack_args, serialize_function
from skyfn.protocol.messages import ResultPack, TaskResult
from skyfn.protocol.queues import open_queue
from skyfn.protocol.queues import redis_lib
from lambdas.adapters.redis_store.connection import redis_client

MAX_ID = "18446744073709551615-18446744073709551615"


def inc(x):
    return x + 1


@pytest.fixture
def victim_and_attacker(api, other_api):
    """alice's endpoint with one queued task and one result already on the results stream
    (another of her tasks, finished by her agent); mallory's own endpoint."""
    _, fn = api.call("POST", "/functions", {"function": serialize_function(inc)})
    _, alice = api.call("POST", "/endpoints", {"name": "alice-site"})
    status, mallory = other_api.call("POST", "/endpoints", {"name": "mallory-site"})
    assert status == 201 and mallory["agent_credential"]
    ids = []
    for i in range(2):
        status, sub = api.call("POST", "/tasks", {"endpoint_id": alice["endpoint_id"], "tasks": [
            {"function_id": fn["function_id"], "payload": pack_args((i,), {})}]})
        assert status == 202
        ids += sub["task_ids"]
        if i == 0:  # alice's agent runs the first task; its result waits on the results stream
            _finish_as_agent(alice, ids[0], 1, apply=False)
    first, second = ids
    return alice, mallory, first, second


def _results_reader():
    """The service's own reader of the results stream (as the embedded runtime's event source)."""
    from lambdas.config import settings

    return open_queue({"kind": "redis", "name": "results", "url": settings().redis_url}, consumer="gateway")


def _finish_as_agent(reg: dict, task_id: str, value: int, apply: bool = True) -> None:
    """The endpoint's agent, with its own login: take the task, send its result, ack it;
    with `apply`, the service's reader then applies every result waiting."""
    queue = open_queue(reg["task_queue"], consumer="agent", visibility_timeout=30)
    got = queue.receive(max_messages=10, wait_seconds=1)
    assert [t["task_id"] for m in got for t in json.loads(m.body)["tasks"]] == [task_id]
    pack = ResultPack(endpoint_id=reg["endpoint_id"],
                      results=[TaskResult(task_id=task_id, state="SUCCEEDED", result=f"json 3.11\n{value}")])
    open_queue(reg["results_queue"], consumer="agent").send([pack.model_dump_json().encode()])
    queue.delete([m.receipt for m in got])
    if apply:
        _apply_results()


def _apply_results() -> int:
    from lambdas.results import apply_pack

    reader = _results_reader()
    applied = 0
    while True:
        messages = reader.receive(max_messages=10, wait_seconds=0)
        if not messages:
            return applied
        for m in messages:
            stored, _, _ = apply_pack(ResultPack.model_validate_json(m.body))
            applied += stored
        reader.delete([m.receipt for m in messages])


def _dry_run(reg: dict, *command: str) -> None:
    """What Redis would say to the login about `command` (ACL DRYRUN, asked as the service)."""

    answer = redis_client().execute_command("ACL", "DRYRUN", f"ep-{reg['endpoint_id']}", *command)
    if answer not in (b"OK", "OK"):
        raise redis.exceptions.NoPermissionError(answer)


def _login(reg: dict) -> redis.Redis:
    return redis.Redis.from_url(reg["task_queue"]["url"])


def test_every_attack_on_shared_keys_is_refused_and_the_victims_tasks_finish(victim_and_attacker, api):
    alice, mallory, first, second = victim_and_attacker
    r = _login(mallory)
    assert r.ping()
    alice_q = alice["task_queue"]["name"]
    attacks = {
        "read others' results (XAUTOCLAIM)": lambda: r.xautoclaim("results", "agents", "x", 0, "0-0"),
        "read others' results (XCLAIM)": lambda: r.xclaim("results", "agents", "x", 0, ["0-1"]),
        "read others' results (XREADGROUP)": lambda: r.xreadgroup("agents", "x", {"results": "0"}),
        "read others' results (XRANGE)": lambda: r.xrange("results"),
        "read others' results (XPENDING)": lambda: r.xpending("results", "agents"),
        "move the group past every result": lambda: r.xgroup_setid("results", "agents", MAX_ID),
        "destroy the group": lambda: r.xgroup_destroy("results", "agents"),
        "trim every result": lambda: r.xtrim("results", maxlen=0),
        "raise the stream's last id": lambda: r.execute_command("XSETID", "results", MAX_ID),
        "delete a result": lambda: r.xdel("results", "0-1"),
        "delete the stream": lambda: r.delete("results"),
        "stall Redis (EVAL)": lambda: r.eval("while true do end", 0),
        "stall Redis (EVAL_RO)": lambda: r.execute_command("EVAL_RO", "while true do end", 0),
        "run a cached script (EVALSHA)": lambda: r.evalsha("0" * 40, 0),
        "load a script": lambda: r.script_load("while true do end"),
        "flush the scripts": lambda: r.script_flush(),
        "load a function": lambda: r.execute_command(
            "FUNCTION", "LOAD", "#!lua name=evil\nredis.register_function('evil', function() while true do end end)"),
        "flush the functions": lambda: r.execute_command("FUNCTION", "FLUSH"),
        "list the functions": lambda: r.execute_command("FUNCTION", "LIST"),
        "read alice's queue": lambda: r.xrange(alice_q),
        "take alice's task": lambda: r.xreadgroup("agents", "thief", {alice_q: ">"}),
        "claim alice's task": lambda: r.xautoclaim(alice_q, "agents", "thief", 0, "0-0"),
        "alice's queue through the queue function": lambda: r.execute_command(
            "FCALL", redis_lib.RECEIVE, 3, alice_q, f"{alice_q}:leases", f"{alice_q}:dlq", "agents", "thief", 10,
            30000, 5),
        "block alice's queue": lambda: r.xadd(alice_q, {"b": "x"}, id=MAX_ID),
        "alice's task record": lambda: r.hgetall(f"t:{second}"),
        "list keys (KEYS)": lambda: r.keys("*"),
        "list keys (SCAN)": lambda: r.scan(),
        "flush everything": lambda: r.flushall(),
        "reconfigure": lambda: r.config_set("maxmemory", "1mb"),
        "debug (the server refuses it to everyone first; ACL DRYRUN: to this login too)":
            lambda: _dry_run(mallory, "DEBUG", "SLEEP", "10"),
        "read the users": lambda: r.execute_command("ACL", "LIST"),
        "kill clients": lambda: r.client_kill_filter(skipme=True),
        "subscribe": lambda: r.publish("x", "y"),
    }
    outcomes = {}
    for what, attack in attacks.items():
        try:
            attack()
            outcomes[what] = "ALLOWED"
        except redis.exceptions.NoPermissionError:
            outcomes[what] = "NOPERM"
    assert outcomes == {what: "NOPERM" for what in attacks}
    # the result waiting on the stream is applied, and alice's next task finishes normally
    assert _apply_results() == 1
    _finish_as_agent(alice, second, 7)
    assert api.call("GET", f"/tasks/{first}")[1]["result"] == "json 3.11\n1"
    done = api.call("GET", f"/tasks/{second}")[1]
    assert (done["state"], done["result"]) == ("SUCCEEDED", "json 3.11\n7")


def test_a_queue_function_cannot_reach_what_its_caller_may_not(victim_and_attacker):
    """The queue functions run under the caller's rules: mallory naming alice's queue keys
    (or mixing them with her own) gets nothing, and alice's task stays queued."""
    alice, mallory, _, second = victim_and_attacker
    r, own, victim = _login(mallory), mallory["task_queue"]["name"], alice["task_queue"]["name"]
    for keys in ([own, f"{own}:leases", f"{victim}:dlq"], [victim, f"{own}:leases", f"{own}:dlq"]):
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.execute_command("FCALL", redis_lib.RECEIVE, 3, *keys, "agents", "thief", 10, 30000, 5)
    # her own dead letters are the service's to take
    with pytest.raises(redis.exceptions.ResponseError, match="can't access"):
        r.execute_command("FCALL", redis_lib.TAKE_DEAD, 1, f"{own}:dlq", 10)

    assert [t["task_id"] for _, f in redis_client().xrange(victim) for t in json.loads(f[b"b"])["tasks"]] == \
        [second]


def test_a_receive_cannot_hold_redis_for_long(victim_and_attacker):
    """A receive asking for a billion messages gets at most redis_lib.MAX_RECEIVE, at once."""
    _, mallory, _, _ = victim_and_attacker
    r, own = _login(mallory), mallory["task_queue"]["name"]
    started = time.monotonic()
    out, _, _, _ = r.execute_command("FCALL", redis_lib.RECEIVE, 3, own, f"{own}:leases", f"{own}:dlq", "agents",
                                     "me", 10 ** 9, 30000, 5)
    assert out == [] and time.monotonic() - started < 1.0
    with pytest.raises(redis.exceptions.ResponseError, match="at most 1000 leases"):
        r.execute_command("FCALL", redis_lib.EXTEND, 2, own, f"{own}:leases", "agents", "me", 30000,
                          *(f"{i}-0" for i in range(redis_lib.MAX_EXTEND + 1)))


def _monitored(run) -> set[str]:
    """The commands (as ACL names them) Redis ran while `run()` ran, commands inside
    functions included, as MONITOR shows them; nothing but `run` may talk to Redis meanwhile."""

    seen: set[str] = set()
    ready, done = threading.Event(), threading.Event()

    def watch():
        with redis_client().monitor() as m:
            ready.set()
            for event in m.listen():
                if event["command"] == "ECHO monitor-end":
                    done.set()
                    return
                seen.add(_acl_name(event["command"]))

    threading.Thread(target=watch, daemon=True).start()
    assert ready.wait(5)
    run()
    redis_client().echo("monitor-end")
    assert done.wait(5)
    return seen


def _acl_name(command_line: str) -> str:
    words = [w.strip('"').lower() for w in command_line.split()[:2]]
    return f"{words[0]}|{words[1]}" if words[0] in ("xgroup", "xinfo", "client") and len(words) > 1 else words[0]


def test_the_table_is_what_the_queue_client_sends(victim_and_attacker):
    """Every command the queue client sends with an endpoint's login -- ensure, receive (new,
    redelivered and dead-lettered), extend, delete, depth, a long poll, a result -- is in
    QUEUE_LOGIN_COMMANDS (besides logging in), and every
    command of the table is sent by one of them."""

    alice, _, _, _ = victim_and_attacker
    name = alice["task_queue"]["name"]
    redis_client().xadd(name, {"b": b'{"pack_id": "p2", "tasks": []}'})  # a second message
    q = open_queue(alice["task_queue"], consumer="agent", visibility_timeout=0.05, max_deliveries=2)
    login = _login(alice)

    def client_work():
        q.ensure()
        [a], [b] = q.receive(max_messages=1, wait_seconds=1), q.receive(max_messages=1, wait_seconds=1)
        q.extend([a.receipt, b.receipt], 0.05)
        time.sleep(0.1)
        again = {m.receipt: m.delivery_count for m in q.receive(max_messages=2, wait_seconds=1)}
        assert again == {a.receipt: 2, b.receipt: 2}
        q.delete([a.receipt])
        time.sleep(0.1)
        assert q.receive(max_messages=5, wait_seconds=0.2) == []  # b dead-lettered, then a long poll
        assert q.depth() == 0
        open_queue(alice["results_queue"], consumer="agent").send([b"{}"])
        assert login.ping()

    sent = _monitored(client_work) - {"hello", "auth"}  # logging in: Redis lets every user
    table = {g.command for g in queue_logins.QUEUE_LOGIN_COMMANDS}
    assert sent - table == set(), sorted(sent - table)
    assert table - sent == {"discard"}  # only when a MULTI is given up
    assert redis_client().xlen(f"{name}:dlq") == 1


def test_logins_an_older_service_made_get_todays_rules(victim_and_attacker, api):
    """A login kept in the ACL file with the rules of before (`+@all` minus a few categories on
    top of write access to the results stream) is rewritten when the service starts: same
    password, today's rules."""
    from lambdas.bootstrap import ensure_resources

    alice, mallory, first, second = victim_and_attacker
    user, own = f"ep-{mallory['endpoint_id']}", mallory["task_queue"]["name"]
    old_hash = redis_client().acl_getuser(user)["passwords"][0]
    redis_client().execute_command(
        "ACL", "SETUSER", user, "reset", "on", f"#{old_hash}", "resetchannels",
        *(f"~{own}{suffix}" for suffix in ("", ":leases", ":dlq")), "%W~results",
        "+@all", "-@admin", "-@dangerous", "-@keyspace", "-@pubsub")
    r = _login(mallory)
    assert r.xtrim("results", maxlen=1000) == 0  # the old rules let it trim the shared stream
    ensure_resources()
    r = _login(mallory)
    with pytest.raises(redis.exceptions.NoPermissionError):
        r.xtrim("results", maxlen=0)
    with pytest.raises(redis.exceptions.NoPermissionError):
        r.eval("return 1", 0)
    assert open_queue(mallory["task_queue"], consumer="agent").receive(max_messages=1) == []
    _finish_as_agent(alice, second, 3)
    assert api.call("GET", f"/tasks/{second}")[1]["state"] == "SUCCEEDED"



def test_a_result_added_with_an_id_in_the_future_is_undone_by_the_service(victim_and_attacker):
    """Redis's ACL cannot keep a login that may XADD from choosing the id: mallory adds an
    entry with the maximal id, and every agent's next `XADD *` fails. The service's reader
    (the embedded runtime's event source) notices within a quiet second, deletes the entry
    and sets the stream's clock back, and alice's results flow again, none skipped."""
    from infra.local.standins.event_source import EventSourceMapping

    alice, mallory, first, second = victim_and_attacker
    _login(mallory).xadd("results", {"b": b"forged"}, id=MAX_ID)
    alice_results = open_queue(alice["results_queue"], consumer="agent")
    pack = ResultPack(endpoint_id=alice["endpoint_id"],
                      results=[TaskResult(task_id=second, state="SUCCEEDED", result="json 3.11\n7")])
    with pytest.raises(redis.ResponseError, match="exhausted the last possible ID"):
        alice_results.send([pack.model_dump_json().encode()])
    seen: list[bytes] = []

    def handler(event, context):
        seen.extend(r["body"].encode() if isinstance(r["body"], str) else r["body"] for r in event["Records"])
        return {"batchItemFailures": []}

    esm = EventSourceMapping(_results_reader, handler, wait_seconds=0.2, declare=False).start()
    try:
        deadline = time.monotonic() + 30
        while esm.stats["repaired"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert esm.stats["repaired"] == 1
        alice_results.send([pack.model_dump_json().encode()])   # the agent's outbox retries: it goes now
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        esm.stop()
    bodies = [b.decode(errors="replace") for b in seen]
    # alice's waiting result, the forged entry (read before it was undone: applied, if at
    # all, as what its own sender may do) and alice's result sent after the repair
    assert len(bodies) == 3 and sum(second in b for b in bodies) == 1 and sum(first in b for b in bodies) == 1

    ids = [e[0].decode() for e in redis_client().xrange("results")]
    assert MAX_ID not in ids and all(int(i.split("-")[0]) < 10**13 for i in ids)


def test_the_repair_deletes_a_future_entry_not_yet_read_and_leaves_a_sound_stream_alone(victim_and_attacker):

    alice, mallory, first, _ = victim_and_attacker
    reader = _results_reader()
    reader.ensure()
    assert reader.repair_future_ids() is False                # nothing to undo: nothing touched
    before = [e[0] for e in redis_client().xrange("results")]
    _login(mallory).xadd("results", {"b": b"forged"}, id=MAX_ID)
    assert reader.repair_future_ids() is True
    assert [e[0] for e in redis_client().xrange("results")] == before   # only the forged entry went
    open_queue(alice["results_queue"], consumer="agent").send([b"{}"])        # adding works again
    got = reader.receive(max_messages=10)
    assert [m.body for m in got][-1] == b"{}" and any(first.encode() in m.body for m in got)
