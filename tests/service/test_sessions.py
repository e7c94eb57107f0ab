"""Direct sessions at the service (skyfn.protocol.direct), through the real handlers on a
real redis-server and moto: the agent's heartbeats publish its direct channel (and only
they can), POST /endpoints/{id}/sessions authorizes exactly as POST /tasks and answers a
token signed with the published key over the digests of the bodies the agent would
receive, and the results the agent reports with a session id are recorded as tasks of the
session's owner -- in the hot store, the owner's task list and the durable history --
without a push; results of unknown or foreign sessions are dropped."""
from __future__ import annotations

import json
import time
import uuid

import pytest

from lambdas.core import deps
from skyfn.protocol import pack_args, serialize_function
from skyfn.protocol.direct import body_digest, new_session_key, verify_token
from skyfn.protocol.messages import ResultPack, TaskPack, TaskResult
from tests.service.conftest import Api
from tests.service.liveness import heard_long_ago
from tests.service.test_final_state_push import Pushes
from lambdas.adapters.redis_store.connection import redis_client

SERVER_KEY = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"  # a Z85 public key (40 characters)


def inc(x):
    return x + 1


def dec(x):
    return x - 1


def channel(port: int = 5601) -> dict:
    return {"address": f"tcp://10.0.0.7:{port}", "server_key": SERVER_KEY, "session_key": new_session_key()}


@pytest.fixture
def world(api):
    """alice's two functions and endpoint, and the endpoint's agent (its own credential)."""
    fns = [api.call("POST", "/functions", {"function": serialize_function(f), "name": f.__name__})[1]["function_id"]
           for f in (inc, dec)]
    _, reg = api.call("POST", "/endpoints", {"name": "hpc"})
    return {"fns": fns, "ep": reg["endpoint_id"], "reg": reg, "agent": Api(reg["agent_credential"])}


def publish(world, direct: dict | None) -> dict:
    body = {"stats": {"workers": 2}}
    if direct is not None:
        body["direct"] = direct
    status, info = world["agent"].call("POST", f"/endpoints/{world['ep']}/heartbeat", body)
    assert status == 200, info
    return info


def stored_channel(ep: str):
    raw = redis_client().get(f"epdirect:{ep}")
    return json.loads(raw) if raw else None


def open_session(api, ep: str, fns: list[str]):
    return api.call("POST", f"/endpoints/{ep}/sessions", {"function_ids": fns})


def submit(api, ep: str, fid: str):
    return api.call("POST", "/tasks", {"endpoint_id": ep, "tasks": [{"function_id": fid, "payload": pack_args((1,), {})}]})


# --- the published channel ------------------------------------------------------------
def test_only_the_agent_and_its_owner_publish_the_channel_and_it_lives_three_timeouts(api, other_api, world):
    ep = world["ep"]
    # someone the endpoint is shared with (even to manage it) cannot point sessions elsewhere
    assert api.call("POST", f"/shares/endpoints/{ep}", {"principal": "user:mallory", "role": "manage"})[0] == 200
    assert other_api.call("POST", f"/endpoints/{ep}/heartbeat", {"stats": {}, "direct": channel()})[0] == 200
    assert stored_channel(ep) is None
    # the owner's heartbeat publishes (an agent signed in as its owner, as with Cognito)
    owners = channel(7)
    assert api.call("POST", f"/endpoints/{ep}/heartbeat", {"stats": {}, "direct": owners})[0] == 200
    assert stored_channel(ep) == owners
    mine = channel()
    publish(world, mine)
    assert stored_channel(ep) == mine
    ttl = redis_client().ttl(f"epdirect:{ep}")
    assert 80 < ttl <= 90  # 3 x SKYFN_HEARTBEAT_TIMEOUT (30 s)
    # a grantee's heartbeat neither replaces nor withdraws it; the owner's without one keeps it
    assert other_api.call("POST", f"/endpoints/{ep}/heartbeat", {"stats": {}, "direct": channel(9)})[0] == 200
    assert api.call("POST", f"/endpoints/{ep}/heartbeat", {"stats": {}})[0] == 200
    assert stored_channel(ep) == mine
    # each agent heartbeat renews it; one without it withdraws it
    redis_client().expire(f"epdirect:{ep}", 5)
    publish(world, mine)
    assert redis_client().ttl(f"epdirect:{ep}") > 80
    publish(world, None)
    assert stored_channel(ep) is None


def test_a_silent_agents_channel_is_withdrawn_when_it_goes_offline(api, world):
    from lambdas.core.tasks import registry

    publish(world, channel())
    heard_long_ago(world["ep"])
    assert world["ep"] in registry.mark_silent_endpoints_offline()
    assert stored_channel(world["ep"]) is None
    status, body = open_session(api, world["ep"], world["fns"][:1])
    assert status == 409 and body["error"] == "no_direct_channel"


def test_rotating_or_revoking_the_agents_credential_withdraws_its_channel(api, world):
    ep = world["ep"]
    publish(world, channel())
    status, rotated = api.call("POST", f"/endpoints/{ep}/credential")
    assert status == 201 and stored_channel(ep) is None
    world["agent"] = Api(rotated["agent_credential"])
    publish(world, channel())
    assert api.call("DELETE", f"/endpoints/{ep}/credential")[0] == 200
    assert stored_channel(ep) is None
    assert open_session(api, ep, world["fns"])[1]["error"] == "no_direct_channel"


def test_the_channel_ttl_follows_the_heartbeat_timeout(api, world, monkeypatch):
    monkeypatch.setenv("SKYFN_HEARTBEAT_TIMEOUT", "0.5")
    deps.reset()
    publish(world, channel())
    assert 0 < redis_client().pttl(f"epdirect:{world['ep']}") <= 2000  # 3 x 0.5 s, in whole seconds
    time.sleep(2.2)
    assert stored_channel(world["ep"]) is None


def test_malformed_channels_are_422_naming_the_field(world):
    for bad in ({**channel(), "session_key": "zz" * 32}, {**channel(), "server_key": "short"},
                {"address": "tcp://h:1", "server_key": SERVER_KEY}):
        status, body = world["agent"].call("POST", f"/endpoints/{world['ep']}/heartbeat", {"stats": {}, "direct": bad})
        assert status == 422 and "direct" in body["message"], body
    assert stored_channel(world["ep"]) is None


def test_the_session_key_is_never_answered(api, world):
    key = channel()
    info = publish(world, key)
    answers = [info, api.call("GET", f"/endpoints/{world['ep']}")[1], api.call("GET", "/endpoints")[1],
               api.call("POST", f"/endpoints/{world['ep']}/heartbeat", {"stats": {}})[1],
               world["agent"].call("POST", f"/endpoints/{world['ep']}/connect")[1],
               open_session(api, world["ep"], world["fns"])[1],
               api.call("POST", "/endpoints", {"name": "hpc"})[1]]  # last: registering again rotates the credential
    for answer in answers:
        assert key["session_key"] not in json.dumps(answer)


# --- opening a session -------------------------------------------------------------------
def test_a_session_token_verifies_with_the_published_key_over_the_bodies_the_agent_receives(api, world):
    key = channel()
    publish(world, key)
    before = time.time()
    status, opened = open_session(api, world["ep"], world["fns"])
    assert status == 201, opened
    assert set(opened) == {"session_id", "endpoint_id", "address", "server_key", "token", "expires_at", "rendezvous"}
    assert opened["rendezvous"] is None  # the agent does not listen at a rendezvous server
    assert opened["endpoint_id"] == world["ep"] and opened["address"] == key["address"]
    assert opened["server_key"] == SERVER_KEY and uuid.UUID(opened["session_id"]).version == 4
    assert before + 899 <= opened["expires_at"] <= time.time() + 901  # DEFAULT_SESSION_TTL_S
    claims = verify_token(key["session_key"], opened["token"], world["ep"])
    assert claims["sid"] == opened["session_id"] and claims["sub"] == "alice" and claims["ep"] == world["ep"]
    # the digests are of the very bodies a task pack carries to the agent
    for fid in world["fns"]:
        assert submit(api, world["ep"], fid)[0] == 202
    bodies, meta = {}, {}
    for _, fields in redis_client().xrange(world["reg"]["task_queue"]["name"]):
        pack = TaskPack.model_validate_json(fields[b"b"])
        bodies.update(pack.functions)
        meta.update(pack.function_meta)
    assert claims["fns"] == {fid: body_digest(bodies[fid]) for fid in world["fns"]}
    # and the owner and name the agent's allowlist matches, as a polled pack states them
    assert claims["fnm"] == {fid: [meta[fid]["owner"], meta[fid]["name"]] for fid in world["fns"]}
    assert claims["fnm"] == dict(zip(world["fns"], (["alice", "inc"], ["alice", "dec"])))
    # the session record: its owner, endpoint and functions, kept past the token for late results
    r = redis_client()
    rec = r.hgetall(f"ds:{opened['session_id']}")
    assert rec == {b"o": b"alice", b"e": world["ep"].encode(), **{f"f:{f}".encode(): b"1" for f in world["fns"]}}
    assert 900 + 6 * 3600 - 5 < r.ttl(f"ds:{opened['session_id']}") <= 900 + 6 * 3600


def test_the_session_ttl_is_configured(api, world, monkeypatch):
    monkeypatch.setenv("SKYFN_DIRECT_SESSION_TTL", "60")
    deps.reset()
    key = channel()
    publish(world, key)
    status, opened = open_session(api, world["ep"], world["fns"][:1])
    assert status == 201 and opened["expires_at"] <= time.time() + 60
    assert verify_token(key["session_key"], opened["token"], world["ep"])["exp"] == pytest.approx(opened["expires_at"],
                                                                                                  abs=0.01)


def test_no_published_channel_is_409_naming_the_fix(api, world):
    status, body = open_session(api, world["ep"], world["fns"])
    assert status == 409 and body["error"] == "no_direct_channel"
    assert body["message"] == (f"endpoint {world['ep']} takes no direct sessions: its agent is offline, has no "
                               "`direct:` section in its config.yaml, or opens no port (direct.reach: rendezvous) "
                               "while this deployment runs no rendezvous server; submit through POST /tasks")
    assert not list(redis_client().scan_iter(match="ds:*"))


def test_refusals_are_post_tasks_refusals(api, other_api, world):
    publish(world, channel())
    ep, fid = world["ep"], world["fns"][0]
    missing = str(uuid.uuid4())
    # another user's endpoint, an unknown function, another user's function: what POST /tasks answers
    _, theirs = other_api.call("POST", "/functions", {"function": serialize_function(inc)})
    _, their_ep = other_api.call("POST", "/endpoints", {"name": "theirs"})
    cases = [(other_api, ep, fid), (api, ep, missing), (api, ep, theirs["function_id"]),
             (api, missing, fid), (api, their_ep["endpoint_id"], fid)]
    for who, endpoint, function in cases:
        as_session = open_session(who, endpoint, [function])
        as_tasks = submit(who, endpoint, function)
        assert as_session[0] == as_tasks[0] == 404, (endpoint, function)
        assert as_session[1] == as_tasks[1]
    # a function the endpoint's allowlist refuses: 403, the same answer
    status, _ = world["agent"].call("POST", f"/endpoints/{ep}/heartbeat", {
        "stats": {}, "direct": channel(), "allowed_functions": [{"function_id": fid}]})
    assert status == 200
    other_fn = world["fns"][1]
    as_session, as_tasks = open_session(api, ep, [fid, other_fn]), submit(api, ep, other_fn)
    assert as_session[0] == as_tasks[0] == 403 and as_session[1] == as_tasks[1]
    assert open_session(api, ep, [fid])[0] == 201


def test_a_shared_endpoint_and_function_open_sessions_for_the_grantee(api, other_api, world):
    key = channel()
    publish(world, key)
    fid = world["fns"][0]
    assert open_session(other_api, world["ep"], [fid])[0] == 404
    for kind, obj in (("endpoints", world["ep"]), ("functions", fid)):
        assert api.call("POST", f"/shares/{kind}/{obj}", {"principal": "user:mallory", "role": "run"})[0] == 200
    status, opened = open_session(other_api, world["ep"], [fid])
    assert status == 201
    assert verify_token(key["session_key"], opened["token"], world["ep"])["sub"] == "mallory"


def test_an_agent_credential_cannot_open_sessions(world):
    publish(world, channel())
    status, body = open_session(world["agent"], world["ep"], world["fns"])
    assert status == 403 and "endpoint credential" in body["message"]


def test_bad_bodies_are_422_naming_the_field(api, world):
    publish(world, channel())
    path = f"/endpoints/{world['ep']}/sessions"
    for body, field in (({}, "function_ids"), ({"function_ids": []}, "function_ids"),
                        ({"function_ids": [""]}, "function_ids"), ({"function_ids": "x"}, "function_ids"),
                        ({"function_ids": [str(i) for i in range(257)]}, "function_ids"),
                        ({"function_ids": world["fns"], "extra": 1}, "extra")):
        status, answer = api.call("POST", path, body)
        assert status == 422 and answer["error"] == "invalid_request" and field in answer["message"], (body, answer)
    status, answer = api.call("POST", path, raw="{not json")
    assert status == 422, answer
    assert not list(redis_client().scan_iter(match="ds:*"))


def test_the_route_is_in_the_openapi_document(api):
    _, doc = api.call("GET", "/openapi.json", token=None)
    op = doc["paths"]["/endpoints/{endpoint_id}/sessions"]["post"]
    assert {"201", "401", "403", "404", "409", "422"} <= set(op["responses"])
    assert "SessionOpened" in doc["components"]["schemas"] and "OpenSession" in doc["components"]["schemas"]


# --- recording direct results ----------------------------------------------------------------
@pytest.fixture
def session(api, world):
    publish(world, channel())
    _, opened = open_session(api, world["ep"], world["fns"])
    return opened


def direct_result(session, fid, task_id=None, state="SUCCEEDED", **kw) -> TaskResult:
    t = time.time() - 0.05
    return TaskResult(task_id=task_id or str(uuid.uuid4()), state=state, session=session["session_id"], function_id=fid,
                      events=[("DISPATCHED", t), ("RUNNING", t + 0.01), ("DONE", t + 0.02)], **kw)


def apply(ep, *results):
    from lambdas.results import apply_pack

    return apply_pack(ResultPack(endpoint_id=ep, results=list(results)))


def test_direct_results_are_recorded_for_the_sessions_owner(api, other_api, world, session):
    ep, fid = world["ep"], world["fns"][0]
    ok = direct_result(session, fid, result="json 3.11\n2", stdout="hi\n")
    failed = direct_result(session, world["fns"][1], state="FAILED", error="remote ZeroDivisionError", reason="boom")
    assert apply(ep, ok, failed) == (2, 0, 0)
    status, info = api.call("GET", f"/tasks/{ok.task_id}")
    assert status == 200, info
    assert info["state"] == "SUCCEEDED" and info["result"] == "json 3.11\n2" and info["stdout"] == "hi\n"
    assert info["owner"] == "alice" and info["function_id"] == fid and info["endpoint_id"] == ep
    assert info["submission_id"] == session["session_id"] and info["retries"] == 0
    states = [e[0] for e in info["events"]]
    assert states == ["CREATED", "QUEUED", "DISPATCHED", "RUNNING", "DONE", "SUCCEEDED", "STORED"]
    stamps = [e[1] for e in info["events"]]
    assert stamps == sorted(stamps) and info["created"] == pytest.approx(ok.events[0][1], abs=1e-5)
    _, bad = api.call("GET", f"/tasks/{failed.task_id}")
    assert (bad["state"], bad["error"], bad["reason"]) == ("FAILED", "remote ZeroDivisionError", "boom")
    assert other_api.call("GET", f"/tasks/{ok.task_id}")[0] == 404
    status, st = api.call("POST", "/tasks/status", {"task_ids": [ok.task_id]})
    assert st["tasks"][ok.task_id]["state"] == "SUCCEEDED"
    # the owner's task list and the stage breakdown
    _, listed = api.call("GET", "/tasks")
    assert {ok.task_id, failed.task_id} <= {t["task_id"] for t in listed["tasks"]}
    assert other_api.call("GET", "/tasks")[1]["tasks"] == []
    from lambdas.core.tasks.stage_metrics import stage_means

    means, measured = stage_means([redis_client().hget(f"t:{ok.task_id}", "ev").decode()])
    assert measured == 1 and all(v >= 0 for v in means.values())
    assert means["StageServiceMs"] == means["StageQueueMs"] == 0 and means["StageRunMs"] == pytest.approx(10, abs=1)


def test_direct_tasks_reach_the_durable_history_and_expire_after_it(api, world, session):
    from lambdas import history

    ok = direct_result(session, world["fns"][0], result="json 3.11\n2")
    assert apply(world["ep"], ok) == (1, 0, 0)
    r = redis_client()
    assert r.hget(f"t:{ok.task_id}", "rt") is not None and r.ttl(f"t:{ok.task_id}") == -1  # read, not archived
    assert history.flush()["tasks"] >= 1
    # the SDK had the result: once archived, the record expires SKYFN_RESULT_TTL after it was stored
    assert 0 < r.ttl(f"t:{ok.task_id}") <= 600
    item = deps.dynamo().get_task("alice", ok.task_id)
    assert item["owner"] == "alice" and item["endpoint_id"] == world["ep"] and item["state"] == "SUCCEEDED"
    assert item["submission_id"] == session["session_id"] and item["function_id"] == world["fns"][0]
    assert deps.dynamo().get_task("mallory", ok.task_id) is None
    # once gone from the hot store, GET answers from the history
    r.delete(f"t:{ok.task_id}")
    status, info = api.call("GET", f"/tasks/{ok.task_id}")
    assert status == 200 and info["state"] == "SUCCEEDED" and info["result_expired"]["finished"] is not None


def test_a_redelivered_pack_counts_duplicates_and_overwrites_nothing(world, session):
    ok = direct_result(session, world["fns"][0], result="json 3.11\n2")
    assert apply(world["ep"], ok) == (1, 0, 0)
    r = redis_client()
    before = r.hgetall(f"t:{ok.task_id}")
    outbox = r.llen("outbox")
    changed = ok.model_copy(update={"result": "json 3.11\n99", "state": "FAILED"})
    assert apply(world["ep"], changed, ok) == (0, 2, 0)
    assert r.hgetall(f"t:{ok.task_id}") == before and r.llen("outbox") == outbox


def test_a_direct_task_id_that_exists_is_never_overwritten(api, world, session):
    _, sub = submit(api, world["ep"], world["fns"][0])
    tid = sub["task_ids"][0]
    assert apply(world["ep"], direct_result(session, world["fns"][0], task_id=tid, result="x")) == (0, 1, 0)
    assert api.call("GET", f"/tasks/{tid}")[1]["state"] == "QUEUED"


def test_unknown_and_foreign_sessions_and_functions_are_dropped(api, world, session):
    ep, fid = world["ep"], world["fns"][0]
    _, other = api.call("POST", "/endpoints", {"name": "other"})
    other_agent = Api(other["agent_credential"])
    assert other_agent.call("POST", f"/endpoints/{other['endpoint_id']}/heartbeat",
                            {"stats": {}, "direct": channel()})[0] == 200
    _, others = open_session(api, other["endpoint_id"], [fid])
    _, narrow = open_session(api, ep, [fid])
    _, third = api.call("POST", "/functions", {"function": serialize_function(inc)})
    dropped = [direct_result(others, fid),  # another endpoint's session, reported by this endpoint's agent
               direct_result({"session_id": str(uuid.uuid4())}, fid),  # a session never opened
               direct_result(narrow, world["fns"][1]),  # a function the session does not name
               direct_result(session, third["function_id"]),
               TaskResult(task_id=str(uuid.uuid4()), state="SUCCEEDED", session=session["session_id"])]  # no function
    kept = direct_result(session, fid)
    assert apply(ep, *dropped, kept) == (1, 0, 5)
    for r in dropped:
        assert not redis_client().exists(f"t:{r.task_id}")
        assert api.call("GET", f"/tasks/{r.task_id}")[0] == 404
    assert api.call("GET", f"/tasks/{kept.task_id}")[1]["owner"] == "alice"


def test_direct_results_are_not_pushed_and_queued_results_still_are(api, world, session, redis_url, monkeypatch):
    monkeypatch.setenv("SKYFN_PUSH", "redis")
    pushes = Pushes(redis_url, "alice")
    try:
        cursor = deps.store().done_cursor("alice")
        assert apply(world["ep"], direct_result(session, world["fns"][0], result="json 3.11\n2")) == (1, 0, 0)
        assert pushes.take(1, timeout=1.0) == []
        assert deps.store().done_cursor("alice") == cursor  # no completion entry: no gap for the SDK's pushes
        # a pack of both: the queued task is finished and pushed as ever, the direct one recorded only
        _, sub = submit(api, world["ep"], world["fns"][0])
        queued = TaskResult(task_id=sub["task_ids"][0], state="SUCCEEDED", result="json 3.11\n2")
        direct = direct_result(session, world["fns"][0], result="json 3.11\n3")
        assert apply(world["ep"], direct, queued) == (2, 0, 0)
        [message] = pushes.take(1)
        assert message["ids"] == [queued.task_id] and message["prev"] == cursor
        assert api.call("GET", f"/tasks/{direct.task_id}")[1]["result"] == "json 3.11\n3"
    finally:
        pushes.close()


def test_a_session_outlives_its_token_for_late_results_only(api, world, monkeypatch):
    monkeypatch.setenv("SKYFN_DIRECT_SESSION_TTL", "1")
    deps.reset()
    publish(world, channel())
    _, opened = open_session(api, world["ep"], world["fns"][:1])
    time.sleep(1.1)  # the token has expired; the agent's late report is still recorded
    assert apply(world["ep"], direct_result(opened, world["fns"][0], result="json 3.11\n2")) == (1, 0, 0)
    redis_client().delete(f"ds:{opened['session_id']}")  # past the grace
    assert apply(world["ep"], direct_result(opened, world["fns"][0])) == (0, 0, 1)


# --- through the rendezvous server (skyfn.protocol.direct_path, issue 40) -------------------------
@pytest.fixture
def rendezvous_env(monkeypatch):
    monkeypatch.setenv("SKYFN_RENDEZVOUS_ADDRESS", "rdv.example.org:7300")
    monkeypatch.setenv("SKYFN_RENDEZVOUS_SECRET", "rdv-secret")


def test_an_agent_gets_its_listen_ticket_and_a_user_token_does_not(api, world, rendezvous_env):
    from rendezvous.tokens import TokenError, verify_token as verify_group_token

    status, ticket = world["agent"].call("POST", f"/endpoints/{world['ep']}/direct/listen")
    assert status == 200, ticket
    assert ticket["address"] == "rdv.example.org:7300" and ticket["name"] == f"direct.{world['ep']}"
    verify_group_token("rdv-secret", ticket["name"], ticket["token"])
    with pytest.raises(TokenError):
        verify_group_token("rdv-secret", f"direct.{uuid.uuid4()}", ticket["token"])
    status, err = api.call("POST", f"/endpoints/{world['ep']}/direct/listen")
    assert status == 403 and "own agent" in err["message"], err


def test_without_a_rendezvous_server_the_listen_ticket_is_a_404_naming_the_fix(api, world, monkeypatch):
    monkeypatch.delenv("SKYFN_RENDEZVOUS_ADDRESS", raising=False)
    status, err = world["agent"].call("POST", f"/endpoints/{world['ep']}/direct/listen")
    assert status == 404 and err["error"] == "rendezvous_not_configured" and "direct.reach" in err["message"], err


def test_a_session_on_an_agent_without_a_port_carries_its_path_ticket(api, world, rendezvous_env):
    from rendezvous.tokens import verify_call_token
    from skyfn.protocol.direct_path import caller_of, path_key

    key = dict(channel(), address=None, rendezvous=True)
    publish(world, key)
    status, opened = open_session(api, world["ep"], world["fns"])
    assert status == 201, opened
    t = opened["rendezvous"]
    assert opened["address"] is None and t["address"] == "rdv.example.org:7300"
    assert t["name"] == f"direct.{world['ep']}" and t["caller"] == caller_of(opened["session_id"], "alice")
    verify_call_token("rdv-secret", t["name"], t["caller"], t["token"])  # the rendezvous server admits this caller
    assert t["path_key"] == path_key(key["session_key"], world["ep"], t["caller"], t["expires"])
    assert t["expires"] == opened["expires_at"] and key["session_key"] not in json.dumps(opened)


def test_an_agent_without_a_port_and_no_rendezvous_server_takes_no_sessions(api, world, monkeypatch):
    monkeypatch.delenv("SKYFN_RENDEZVOUS_ADDRESS", raising=False)
    publish(world, dict(channel(), address=None, rendezvous=True))
    status, err = open_session(api, world["ep"], world["fns"])
    assert status == 409 and err["error"] == "no_direct_channel" and "rendezvous server" in err["message"], err
