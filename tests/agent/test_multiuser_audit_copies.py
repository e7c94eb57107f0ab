"""endpoint_agent.multiuser.audit_copies, audit_confirm and lane_routes (issue 36), against a real
redis-server: audit lines come from the routing record and the service's final state (a stand-in
for POST /endpoints/<id>/task-states); a user agent's copy only reports the outcome, and a copy
that does not fit the record or the service's state is a disagreement that changes no task's
line; after the wait, an UNCONFIRMED line that blocks nothing. The routes of a
lane's tasks are read from the lane's stream (taking nothing), and the seen mark follows."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import redis

from endpoint_agent.multiuser import audit_confirm
from endpoint_agent.multiuser.audit import AuditLog
from endpoint_agent.multiuser.audit_confirm import PENDING, WAITING
from endpoint_agent.multiuser.audit_copies import CopyJudge, parse
from endpoint_agent.multiuser.lane import SeenMark
from endpoint_agent.multiuser.lane_routes import LaneRoutes
from endpoint_agent.multiuser.routes import AUDITED, IDENTITIES, ROUTES, route_value
from skyfn.protocol.task_states import UNKNOWN, TaskStateOf


@dataclass
class _Account:
    name: str
    uid: int


@dataclass
class _Agent:  # the fields of a UserAgent the judge and the lane reader use
    key: str
    account: _Account
    lane: dict | None = None
    prefix: str = ""

    def stream(self, kind: str) -> str:
        return self.prefix + kind


@dataclass
class _Agents:
    agents: dict = field(default_factory=dict)
    lock: object = field(default_factory=lambda: __import__("threading").RLock())


def _copy(tid, state="SUCCEEDED", **kw):
    return {"task_id": tid, "state": state, "events": [["RUNNING", 1.7e9], [state, 1.7e9 + 2]], **kw}


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


class _Service:
    """The service's answers to POST /endpoints/<id>/task-states, as the test sets them."""

    def __init__(self):
        self.states: dict[str, TaskStateOf] = {}
        self.asked: list[list[str]] = []
        self.down = False

    def ask(self, ids):
        self.asked.append(list(ids))
        if self.down:
            raise ConnectionError("service unreachable")
        return {tid: self.states.get(tid, TaskStateOf(state=UNKNOWN)) for tid in ids}


def test_lines_from_the_record_and_the_services_state_disagreements_for_the_rest(redis_url, unique, tmp_path,
                                                                                 monkeypatch):
    monkeypatch.setattr(audit_confirm, "ASK_AGAIN_S", 0.0)
    r = redis.Redis.from_url(redis_url)
    for key in (ROUTES, IDENTITIES, PENDING, WAITING):
        r.delete(key)
    alice = _Agent(f"alice-{unique}", _Account("alice", 1001))
    bob = _Agent(f"bob-{unique}", _Account("bob", 1002))
    ta, tb, ghost = f"ta-{unique}", f"tb-{unique}", f"ghost-{unique}"
    r.hset(ROUTES, mapping={ta: route_value(alice.key, "alice-id", "f-sim", "simulate"),
                            tb: route_value(bob.key, "bob-id", "f-run", "run")})
    r.hset(IDENTITIES, mapping={"alice-id": json.dumps({"id": "alice-id", "email": "alice@x.org"}),
                                "bob-id": json.dumps({"id": "bob-id", "email": "bob@x.org"})})
    service = _Service()
    path = tmp_path / "audit.log"
    with AuditLog(path) as log:
        judge = CopyJudge(r, log, ask=service.ask)
        waiting = judge.take(bob, [
            _copy(ghost, identity_id="alice-id", function_id="f-innocent"),      # never existed
            _copy(ta, "FAILED"),                                                  # alice's task
            _copy(tb, "FAILED", function_id="f-innocent", function_name="innocent"),  # his own, rewritten
            {"task_id": 7, "state": "SUCCEEDED"}])                                # not even an id
        assert waiting == 0
        assert judge.take(bob, [_copy(tb, "FAILED", reason="forged")]) == 1  # his own, only the outcome wrong
        assert judge.take(alice, [_copy(ta, identity_id="alice-id", function_id="f-sim")]) == 1
        assert judge.take(bob, [_copy(tb, reason="done")]) == 1
        assert judge.confirmer.waiting() == 2
        service.states = {ta: TaskStateOf(state="SUCCEEDED", start=1.7e9, end=1.7e9 + 2),
                          tb: TaskStateOf(state="RUNNING", start=1.7e9)}
        assert judge.confirmer.round() == 1        # ta is final at the service; tb is not yet
        assert judge.written == 1 and r.hget(ROUTES, tb) is not None
        service.states[tb] = TaskStateOf(state="SUCCEEDED", start=1.7e9 + 1, end=1.7e9 + 5)
        assert judge.confirmer.round() == 1        # tb now: its line says SUCCEEDED; the FAILED copy disagrees
        assert judge.confirmer.round() == 0 and judge.confirmer.waiting() == 0
        assert [sorted(a) for a in service.asked] == [sorted([ta, tb]), [tb]]  # nothing waiting: not asked
        assert judge.take(bob, [_copy(tb)]) == 0        # the same again: a task run again, quietly
        assert judge.take(bob, [_copy(tb, "FAILED")]) == 0  # another outcome after the line
        assert judge.take(alice, [_copy(tb)]) == 0       # bob's task, from alice's agent
    lines = _lines(path)
    tasks = [x for x in lines if "task_id" in x]
    assert [(x["task_id"], x["identity"]["id"], x["account"], x["uid"], x["function"], x["outcome"])
            for x in tasks] == [
        (ta, "alice-id", "alice", 1001, {"id": "f-sim", "name": "simulate"}, "SUCCEEDED"),
        (tb, "bob-id", "bob", 1002, {"id": "f-run", "name": "run"}, "SUCCEEDED")]
    assert tasks[0]["start"] == "2023-11-14T22:13:20.000Z" and tasks[1]["end"] == "2023-11-14T22:13:25.000Z"
    assert "reason" not in tasks[1]  # the service's (none), not the agent's
    disagreements = [(x["user_agent"]["account"], x["claimed"]["task_id"], x["disagreement"])
                     for x in lines if "disagreement" in x]
    assert [(who, tid) for who, tid, _ in disagreements] == [
        ("bob", 7), ("bob", ghost), ("bob", ta), ("bob", tb), ("bob", tb), ("bob", tb), ("alice", tb)]
    reasons = [why for _, _, why in disagreements]
    assert "without a valid task id" in reasons[0]
    assert "was not routed to user agent" in reasons[1]
    assert "routed to another user agent" in reasons[2]
    assert "function 'f-innocent' (the routing record says 'f-run')" in reasons[3]
    assert f"the service's final state of task {tb} is SUCCEEDED; this copy reports FAILED" in reasons[4]
    assert "already audited as SUCCEEDED" in reasons[5]
    assert "routed to another user agent" in reasons[6]
    assert r.hget(ROUTES, ta) is None and r.get(AUDITED + ta).decode() == f"{alice.key} SUCCEEDED"
    assert parse([b'{"audit": [{"task_id": "x"}]}', b"nope", b'{"audit": 3}']) == ([{"task_id": "x"}], 2)


def test_unconfirmed_after_the_wait_and_the_true_line_still_follows(redis_url, unique, tmp_path, monkeypatch):
    r = redis.Redis.from_url(redis_url)
    for key in (PENDING, WAITING):
        r.delete(key)
    bob = _Agent(f"bob-{unique}", _Account("bob", 1002))
    tc, td = f"tc-{unique}", f"td-{unique}"
    r.hset(ROUTES, mapping={t: route_value(bob.key, "bob-id", "f-run", "run") for t in (tc, td)})
    service = _Service()
    service.states = {tc: TaskStateOf(state="RUNNING", start=1.7e9)}
    path = tmp_path / "audit.log"
    monkeypatch.setattr(audit_confirm, "WAIT_S", 0.0)
    monkeypatch.setattr(audit_confirm, "ASK_AGAIN_S", 0.0)
    with AuditLog(path) as log:
        judge = CopyJudge(r, log, ask=service.ask)
        assert judge.take(bob, [_copy(tc, "FAILED"), _copy(td)]) == 2  # tc still running; td unknown
        assert judge.confirmer.round() == 2
        assert r.hget(ROUTES, tc) is not None and r.get(AUDITED + tc).decode() == f"{bob.key} UNCONFIRMED"
        assert judge.take(bob, [_copy(tc, "FAILED")]) == 1  # again, still running: no second UNCONFIRMED line
        assert judge.confirmer.round() == 1
        service.states[tc] = TaskStateOf(state="SUCCEEDED", start=1.7e9, end=1.7e9 + 9)
        assert judge.take(bob, [_copy(tc)]) == 1  # the honest copy, once it ended: the true line
        assert judge.confirmer.round() == 1
        service.down = True
        te = f"te-{unique}"
        r.hset(ROUTES, te, route_value(bob.key, "bob-id", "f-run", "run"))
        assert judge.take(bob, [_copy(te)]) == 1
        assert judge.confirmer.round() == 1
    lines = _lines(path)
    tasks = [(x["task_id"], x["outcome"], x.get("reason", "")) for x in lines if "task_id" in x]
    assert [t[:2] for t in tasks] == [(tc, "UNCONFIRMED"), (td, "UNCONFIRMED"), (tc, "SUCCEEDED"),
                                      (te, "UNCONFIRMED")]
    assert f"the service's state of task {tc} is RUNNING after 0 s; the user agent reported FAILED" in tasks[0][2]
    assert f"the service does not know task {td} as one of this endpoint's" in tasks[1][2]
    assert "the service could not be asked (service unreachable)" in tasks[3][2]
    (late,) = [x for x in lines if "disagreement" in x]
    assert late["claimed"]["task_id"] == tc and "is RUNNING after 0 s; this copy reports FAILED" in late["disagreement"]
    assert r.hget(ROUTES, tc) is None and r.get(AUDITED + tc).decode() == f"{bob.key} SUCCEEDED"


def test_lane_routes_are_read_from_the_stream_and_the_seen_mark_follows(redis_url, unique, tmp_path):
    r = redis.Redis.from_url(redis_url)
    stream = f"tasks:ep:l:{unique}"
    bob = _Agent(f"bob-{unique}", _Account("bob", 1002), lane={"task_queue": {"name": stream}},
                 prefix=f"mu:bob:{unique}:")
    agents = _Agents({bob.key: bob})
    pack = {"pack_id": "p", "owner": "bob-id", "identity": {"id": "bob-id", "email": "bob@x.org"},
            "function_meta": {"f-run": {"name": "run"}},
            "tasks": [{"task_id": f"t1-{unique}", "function_id": "f-run"},
                      {"task_id": f"t2-{unique}", "function_id": "f-run"}]}
    r.xgroup_create(stream, "agents", id="0", mkstream=True)
    entry = r.xadd(stream, {"b": json.dumps(pack)}).decode()
    r.xadd(stream, {"b": b"not a pack"})
    routes = LaneRoutes(agents, r, r)
    assert routes.catch_up() == 2
    got = json.loads(r.hget(ROUTES, f"t1-{unique}"))
    assert got == {"k": bob.key, "i": "bob-id", "f": "f-run", "n": "run"}
    assert json.loads(r.hget(IDENTITIES, "bob-id"))["email"] == "bob@x.org"
    assert r.xlen(stream) == 2 and r.xpending(stream, "agents")["pending"] == 0  # nothing taken
    mark = SeenMark(redis_url, bob.stream("seen"))
    try:
        assert mark.wait_past([entry], timeout=1)
        later = r.xadd(stream, {"b": json.dumps({**pack, "tasks": []})}).decode()
        t0 = time.monotonic()
        assert not mark.wait_past([later], timeout=0.3)  # not read yet: an honest agent waits
        assert time.monotonic() - t0 >= 0.3
        routes.start()
        try:
            assert mark.wait_past([later], timeout=10)
        finally:
            routes.stop()
    finally:
        mark.close()
    assert routes.catch_up() == 0  # nothing new; an audited task's route is not made again


def test_a_task_not_final_is_asked_again_later_and_holds_back_no_other(redis_url, unique, tmp_path):
    r = redis.Redis.from_url(redis_url)
    for key in (PENDING, WAITING):
        r.delete(key)
    bob = _Agent(f"bob-{unique}", _Account("bob", 1002))
    alice = _Agent(f"alice-{unique}", _Account("alice", 1001))
    long_ones = [f"long{i}-{unique}" for i in range(3)]
    ta = f"ta-{unique}"
    r.hset(ROUTES, mapping={**{t: route_value(bob.key, "bob-id", "f-run", "run") for t in long_ones},
                            ta: route_value(alice.key, "alice-id", "f-sim", "simulate")})
    service = _Service()
    service.states = {t: TaskStateOf(state="RUNNING", start=1.7e9) for t in long_ones}
    service.states[ta] = TaskStateOf(state="SUCCEEDED", start=1.7e9, end=1.7e9 + 1)
    with AuditLog(tmp_path / "audit.log") as log:
        judge = CopyJudge(r, log, ask=service.ask)
        assert judge.take(bob, [_copy(t) for t in long_ones]) == 3  # sent early, the tasks still run
        assert judge.confirmer.round() == 0
        assert judge.take(alice, [_copy(ta)]) == 1
        assert judge.confirmer.round() == 1 and service.asked[-1] == [ta]  # bob's are not due again yet
        assert judge.confirmer.waiting() == 3 and judge.confirmer.round() == 0 and len(service.asked) == 2


def test_a_task_comes_back_after_its_line_and_gets_no_second_one(redis_url, unique, tmp_path):
    """What a SIGKILL of the privileged process can leave (the CI run of stop 42 saw one task
    audited twice): its route made again after the line (a lane read again from its seen mark
    while the confirmer wrote the line), and the agent's copy read again from a stream not yet
    trimmed, or the task run again from a pack sent again. One line per task all the same."""
    from endpoint_agent.multiuser.routes import write_lines

    r = redis.Redis.from_url(redis_url)
    for key in (PENDING, WAITING):
        r.delete(key)
    bob = _Agent(f"bob-{unique}", _Account("bob", 1002))
    tf, tg = f"tf-{unique}", f"tg-{unique}"
    route = route_value(bob.key, "bob-id", "f-run", "run")
    service = _Service()
    service.states = {tf: TaskStateOf(state="SUCCEEDED", start=1.7e9, end=1.7e9 + 1)}
    path = tmp_path / "audit.log"
    with AuditLog(path) as log:
        judge = CopyJudge(r, log, ask=service.ask)
        r.hset(ROUTES, tf, route)
        assert judge.take(bob, [_copy(tf)]) == 1 and judge.confirmer.round() == 1
        r.hset(ROUTES, tf, route)  # the stale route
        assert judge.take(bob, [_copy(tf)]) == 1  # fits the record, so it waits ...
        assert judge.confirmer.round() == 1  # ... and is settled without a line
        assert r.hget(ROUTES, tf) is None and judge.confirmer.waiting() == 0
        # the router's own path: the result of a task run again from a pack sent again
        r.hset(ROUTES, tg, route)
        item = (tg, json.loads(route), 1.7e9, 1.7e9 + 1, "SUCCEEDED", None)
        assert write_lines(r, log, bob, [item]) == 1
        r.hset(ROUTES, tg, route)
        assert write_lines(r, log, bob, [item]) == 0
        assert write_lines(r, log, bob, [item[:4] + ("FAILED", "ran again")]) == 0
        assert r.hget(ROUTES, tg) is None
    assert [(x["task_id"], x["outcome"]) for x in _lines(path)] == [(tf, "SUCCEEDED"), (tg, "SUCCEEDED")]
    assert judge.confirmer.confirmed == 1


def test_a_refused_pack_sent_again_is_refused_again_and_audited_once(redis_url, unique, tmp_path):
    """The router's lines without a route (a refusal, the tasks of an agent that cannot start)
    are once per task too: a pack whose acknowledgement a kill lost comes back and is refused
    again, with no second line; a copy claiming a refused task is a disagreement."""
    from endpoint_agent.multiuser.routes import REFUSED_BY, write_unrouted

    r = redis.Redis.from_url(redis_url)
    bob = _Agent(f"bob-{unique}", _Account("bob", 1002))
    tr, tq = f"tr-{unique}", f"tq-{unique}"

    def refusal(tid, outcome="REFUSED", account=None, uid=None):
        return dict(identity={"id": "bob-id"}, account=account, uid=uid, function_id="f-run", function_name="run",
                    task_id=tid, start=None, end=1.7e9, outcome=outcome, reason="no mapping for bob-id")

    path = tmp_path / "audit.log"
    with AuditLog(path) as log:
        assert write_unrouted(r, log, REFUSED_BY, [refusal(tr)]) == 1
        assert write_unrouted(r, log, REFUSED_BY, [refusal(tr)]) == 0  # the pack again, after a kill
        assert write_unrouted(r, log, bob.key, [refusal(tq, "FAILED", "bob", 1002)]) == 1
        assert write_unrouted(r, log, bob.key, [refusal(tq, "FAILED", "bob", 1002), refusal(tr)]) == 0
        assert write_unrouted(r, log, bob.key, []) == 0
        judge = CopyJudge(r, log, ask=_Service().ask)
        assert judge.take(bob, [_copy(tr)]) == 0
    lines = _lines(path)
    assert [(x["task_id"], x["outcome"], x["account"]) for x in lines if "task_id" in x] == [
        (tr, "REFUSED", None), (tq, "FAILED", "bob")]
    (claim,) = [x for x in lines if "disagreement" in x]
    assert claim["disagreement"] == f"task {tr} was refused by the endpoint and never ran"
    assert r.get(AUDITED + tr).decode() == f"{REFUSED_BY} REFUSED"
