"""The submitting identity and the user's user_config travel with each task (issue 23,
multi-user endpoints; DESIGN.md section 12), through the real API handler on a real
redis-server and moto:

- the identity claims (username, email, identity provider) are read from local-issuer
  tokens, OIDC issuers' tokens and API Gateway's authorizer context; agents have none;
- every TaskPack read from the endpoint's queue carries `identity` and the request's
  `user_config`, unchanged; the service keeps each user's latest claims (a Redis hash written
  only when they change) for tasks submitted later without a token (runs);
- a user_config that is not a JSON object, too large or too deep is a 400 naming the fix;
- `all-users` (role run, functions and endpoints) lets every signed-in user submit; revoked,
  it stops; `manage` for it is a 400;
- `skyfn local token --email` puts the claim in the token, which the service then reads.
"""
from __future__ import annotations

import json
import time

import jwt
import pytest

from lambdas.auth import Identity, claims_of, mint_token
from lambdas.core import deps
from lambdas.core.identity import jwt_keys, submitters
from skyfn.protocol import pack_args, serialize_function
from skyfn.protocol.messages import TaskPack
from skyfn.protocol.user_config import MAX_USER_CONFIG_BYTES, MAX_USER_CONFIG_DEPTH
from tests.service.conftest import SECRET, Api, Context, api_event
from tests.service.oidc_issuer import Issuer
from lambdas.adapters.redis_store.connection import redis_client


def double(x):
    return 2 * x


def queued_packs(ep: dict) -> list[TaskPack]:
    entries = redis_client().xrange(ep["task_queue"]["name"])
    return [TaskPack.model_validate_json(fields[b"b"]) for _, fields in entries]


def setup_objects(api: Api, name: str = "cluster") -> tuple[str, dict]:
    status, fn = api.call("POST", "/functions", {"function": serialize_function(double), "name": "double"})
    assert status == 201, fn
    status, ep = api.call("POST", "/endpoints", {"name": name})
    assert status in (200, 201), ep
    return fn["function_id"], ep


def submit(api: Api, fid: str, ep: dict, n: int = 1, **extra):
    body = {"endpoint_id": ep["endpoint_id"],
            "tasks": [{"function_id": fid, "payload": pack_args((i,), {})} for i in range(n)], **extra}
    return api.call("POST", "/tasks", body)


def whoami_identity(token: str) -> Identity:
    from lambdas.auth import authenticate

    return authenticate(f"Bearer {token}")


# --- claims from tokens -----------------------------------------------------------------------
def test_local_issuer_tokens_carry_the_claims_and_the_service_reads_them(service_env):
    token = mint_token(SECRET, "alice-id", username="alice", email="alice@example.org",
                       identity_provider="skyfn-local")
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["preferred_username"] == "alice" and claims["email"] == "alice@example.org"
    assert claims["identity_provider"] == "skyfn-local"
    ident = whoami_identity(token)
    assert ident == Identity(user="alice-id", username="alice", email="alice@example.org",
                             identity_provider="skyfn-local")
    # an older token without claims: the provider is the issuer, nothing else is made up
    assert whoami_identity(mint_token(SECRET, "bob")).claims() == {"identity_provider": "skyfn-local"}


def oidc_token(issuer: Issuer, **claims) -> str:
    kid, key, alg = issuer.keys[-1]
    now = int(time.time())
    body = {"sub": "ada-uuid", "iss": issuer.url, "aud": issuer.audience, "iat": now, "exp": now + 600, **claims}
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid})


def test_oidc_tokens_give_username_email_and_provider(oidc):
    globus = oidc_token(oidc, preferred_username="ada@uni.edu", email="ada@uni.edu",
                        identity_provider="41143743-f3c8-4d60-bbdb-eeecaba85bd9")
    assert whoami_identity(globus).claims() == {"username": "ada@uni.edu", "email": "ada@uni.edu",
                                                "identity_provider": "41143743-f3c8-4d60-bbdb-eeecaba85bd9"}
    # Cognito: cognito:username, and the issuer when no provider claim is present
    cognito = oidc_token(oidc, **{"cognito:username": "ada", "email": "ada@lab.org"})
    assert whoami_identity(cognito).claims() == {"username": "ada", "email": "ada@lab.org",
                                                 "identity_provider": oidc.url}
    # a federated Cognito user: the provider from `identities`
    fed = oidc_token(oidc, username="ada2", identities=[{"providerName": "UniSSO", "userId": "x"}])
    assert whoami_identity(fed).claims() == {"username": "ada2", "identity_provider": "UniSSO"}
    # end to end: the pack of a task this token submits carries them
    api = Api(globus)
    fid, ep = setup_objects(api)
    status, body = submit(api, fid, ep)
    assert status == 202, body
    (pack,) = queued_packs(ep)
    assert pack.identity.model_dump() == {"id": "ada-uuid", "username": "ada@uni.edu", "email": "ada@uni.edu",
                                          "identity_provider": "41143743-f3c8-4d60-bbdb-eeecaba85bd9"}


def test_claims_of_ignores_what_is_not_a_claim():
    assert claims_of({"sub": "x"}) == {}
    assert claims_of({"preferred_username": "", "username": "u", "email": 7, "iss": "i"}) == \
        {"username": "u", "identity_provider": "i"}
    assert claims_of({"email": "e" * 1000, "identities": '[{"providerName": "Google"}]'}) == \
        {"identity_provider": "Google"}
    assert Identity(endpoint_id="ep").claims() == {}  # agents have none


def test_behind_api_gateway_the_authorizers_claims_reach_the_pack(service_env, monkeypatch):
    from lambdas.api import handler

    monkeypatch.setenv("SKYFN_AUTH_PROVIDER", "globus")
    deps.reset()
    authorizer = {"principalId": "g-sub", "sub": "g-sub", "username": "ada@uni.edu", "email": "ada@uni.edu",
                  "identity_provider": "uni-idp"}

    def call(method, path, body=None):
        event = api_event(method, path, body)
        event["requestContext"]["authorizer"] = authorizer
        resp = handler(event, Context())
        return resp["statusCode"], json.loads(resp["body"])

    _, fn = call("POST", "/functions", {"function": serialize_function(double)})
    _, ep = call("POST", "/endpoints", {"name": "gw"})
    status, body = call("POST", "/tasks", {"endpoint_id": ep["endpoint_id"], "user_config": {"account": "p1"},
                                           "tasks": [{"function_id": fn["function_id"],
                                                      "payload": pack_args((1,), {})}]})
    assert status == 202, body
    (pack,) = queued_packs(ep)
    assert pack.identity.model_dump() == {"id": "g-sub", "username": "ada@uni.edu", "email": "ada@uni.edu",
                                          "identity_provider": "uni-idp"}
    assert pack.user_config == {"account": "p1"}


def test_cognito_user_pool_claims_are_read(service_env, monkeypatch):
    from lambdas.auth import identify

    monkeypatch.setenv("SKYFN_AUTH_PROVIDER", "cognito")
    deps.reset()
    event = api_event("GET", "/whoami")
    event["requestContext"]["authorizer"] = {"claims": {
        "sub": "c-sub", "cognito:username": "ada", "email": "ada@lab.org",
        "iss": "https://cognito-idp.us-east-1.amazonaws.com/pool",
        "identities": '{"providerName":"UniSSO","userId":"123"}'}}
    assert identify(event) == Identity(user="c-sub", username="ada", email="ada@lab.org", identity_provider="UniSSO")


# --- packs carry identity and user_config -------------------------------------------------------
def test_every_pack_carries_the_identity_and_the_user_config_unchanged(service_env):
    token = mint_token(SECRET, "alice", username="alice", email="alice@example.org", identity_provider="skyfn-local")
    api = Api(token)
    fid, ep = setup_objects(api)
    config = {"account": "proj1", "cores": 4, "modules": ["gcc", "mpi"], "nested": {"a": {"b": None}},
              "ratio": 0.5, "on": True, "ünïcode": "✓"}
    # big payloads split the request into several packs: every one carries both
    big = "x" * (200 * 1024)
    body = {"endpoint_id": ep["endpoint_id"], "user_config": config,
            "tasks": [{"function_id": fid, "payload": pack_args((big, i), {})} for i in range(6)]}
    status, answer = api.call("POST", "/tasks", body)
    assert status == 202, answer
    packs = queued_packs(ep)
    assert len(packs) > 1 and sum(len(p.tasks) for p in packs) == 6
    for pack in packs:
        assert pack.identity.model_dump() == {"id": "alice", "username": "alice", "email": "alice@example.org",
                                              "identity_provider": "skyfn-local"}
        assert pack.user_config == config
        assert pack.owner == "alice"
    # without a user_config: the identity still, no user_config
    status, _ = submit(api, fid, ep)
    assert status == 202
    last = queued_packs(ep)[-1]
    assert last.user_config is None and last.identity.id == "alice"
    raw = json.loads(redis_client().xrange(ep["task_queue"]["name"])[-1][1][b"b"])
    assert "user_config" not in raw


def test_claims_are_kept_per_user_and_written_only_when_they_change(service_env):
    r = redis_client()
    api = Api(mint_token(SECRET, "carol", username="carol", email="carol@a.org", identity_provider="skyfn-local"))
    fid, ep = setup_objects(api)
    assert submit(api, fid, ep)[0] == 202
    assert submitters.known("carol") == {"username": "carol", "email": "carol@a.org", "identity_provider": "skyfn-local"}
    # the same claims again: nothing is written (a marker field left in the hash survives)
    r.hset("claims:carol", "marker", "1")
    assert submit(api, fid, ep)[0] == 202
    assert r.hget("claims:carol", "marker") == b"1"
    assert submitters.remember("carol", {"username": "carol", "email": "carol@a.org",
                                         "identity_provider": "skyfn-local"}) is False
    # new claims (a new email, no longer a username claim): the hash is replaced
    api2 = Api(mint_token(SECRET, "carol", email="carol@b.org", identity_provider="skyfn-local"))
    assert submit(api2, fid, ep)[0] == 202
    assert r.hgetall("claims:carol") == {b"email": b"carol@b.org", b"identity_provider": b"skyfn-local"}
    assert queued_packs(ep)[-1].identity.model_dump() == {"id": "carol", "username": None, "email": "carol@b.org",
                                                          "identity_provider": "skyfn-local"}


def test_tasks_submitted_without_a_token_carry_the_owners_kept_claims(service_env):
    """What a run's steps do (lambdas/core/runs: batch chunks, flow and SPMD steps): submit on
    the owner's behalf with no token. The packs carry the claims last seen for the owner, or
    {id} alone when none were ever seen."""
    from lambdas.core.runs import steps

    api = Api(mint_token(SECRET, "dave", username="dave", email="dave@example.org", identity_provider="skyfn-local"))
    fid, ep = setup_objects(api)
    redis_client().hset(f"ep:{ep['endpoint_id']}", "st", "online")
    assert submit(api, fid, ep)[0] == 202  # the claims are seen (and kept) here
    answer = steps.submit({"owner": "dave", "endpoint_id": ep["endpoint_id"], "function_id": fid, "args": [3]})
    pack = queued_packs(ep)[-1]
    assert [t.task_id for t in pack.tasks] == [answer["task_id"]]
    assert pack.identity.model_dump() == {"id": "dave", "username": "dave", "email": "dave@example.org",
                                          "identity_provider": "skyfn-local"}
    assert pack.user_config is None

    # a user whose claims were never seen: {id} only
    api_e = Api(mint_token(SECRET, "erin"))
    fid_e, ep_e = setup_objects(api_e, "erin-ep")
    redis_client().hset(f"ep:{ep_e['endpoint_id']}", "st", "online")
    redis_client().delete("claims:erin")  # (her registration calls kept nothing; make sure)
    steps.submit({"owner": "erin", "endpoint_id": ep_e["endpoint_id"], "function_id": fid_e, "args": [1]})
    assert queued_packs(ep_e)[-1].identity.model_dump() == {"id": "erin", "username": None, "email": None,
                                                            "identity_provider": None}


def test_a_batch_run_remembers_the_claims_for_its_chunks(service_env):
    """POST /batches keeps the caller's claims before its chunks are routed without a token
    (lambdas/core/runs/batches.route_chunk -> tasks.submit(owner, ...), as steps.submit above)."""
    api = Api(mint_token(SECRET, "frank", username="frank", email="frank@x.org", identity_provider="skyfn-local"))
    fid, ep = setup_objects(api)
    redis_client().delete("claims:frank")
    api.call("POST", "/batches", {"endpoint_id": ep["endpoint_id"], "function_id": fid,
                                  "payloads": [pack_args((1,), {})]})  # may fail without Step Functions: kept first
    assert submitters.known("frank") == {"username": "frank", "email": "frank@x.org",
                                         "identity_provider": "skyfn-local"}


# --- user_config refusals ------------------------------------------------------------------------
def deep(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize("config,words", [
    ([1, 2], ["JSON object", "not an array", "user_config={...}"]),
    ("account=proj1", ["JSON object", "not a string"]),
    (7, ["not a number"]),
    ({"blob": "x" * MAX_USER_CONFIG_BYTES}, [f"over the limit of {MAX_USER_CONFIG_BYTES} bytes",
                                              "pass data to the function as arguments"]),
    (deep(MAX_USER_CONFIG_DEPTH + 1), [f"deeper than {MAX_USER_CONFIG_DEPTH}", "flatten"]),
])
def test_a_bad_user_config_is_a_400_naming_the_problem_and_the_fix(api, config, words):
    fid, ep = setup_objects(api)
    status, body = submit(api, fid, ep, user_config=config)
    assert status == 400, body
    assert body["error"] == "invalid_user_config" and "user_config" in body["message"]
    for word in words:
        assert word in body["message"], (word, body["message"])
    assert queued_packs(ep) == []  # nothing stored or queued
    # the same request with a valid user_config (at the limits) goes through
    assert submit(api, fid, ep, user_config=deep(MAX_USER_CONFIG_DEPTH))[0] == 202
    assert submit(api, fid, ep, user_config=None)[0] == 202


def test_a_bad_user_config_does_not_claim_the_idempotency_key(api):
    fid, ep = setup_objects(api)
    status, _ = submit(api, fid, ep, user_config=[1], idempotency_key="k1")
    assert status == 400
    status, body = submit(api, fid, ep, user_config={"ok": 1}, idempotency_key="k1")
    assert status == 202 and body["replayed"] is False
    assert queued_packs(ep)[-1].user_config == {"ok": 1}


# --- all-users -----------------------------------------------------------------------------------
def test_all_users_share_lets_any_signed_in_user_run_until_revoked(api):
    fid, ep = setup_objects(api)
    newcomer = f"fresh-{time.time_ns()}"  # a user the service has never seen
    fresh = Api(mint_token(SECRET, newcomer, email="new@example.org"))
    assert submit(fresh, fid, ep)[0] == 404  # not shared: as if it did not exist
    for kind, obj in (("endpoints", ep["endpoint_id"]), ("functions", fid)):
        status, body = api.call("POST", f"/shares/{kind}/{obj}", {"principal": "all-users", "role": "run"})
        assert status == 200 and body["shares"] == {"all-users": "run"}, body
    status, body = submit(fresh, fid, ep, user_config={"account": "guest"})
    assert status == 202, body
    pack = queued_packs(ep)[-1]
    assert pack.owner == newcomer and pack.identity.id == newcomer and pack.identity.email == "new@example.org"
    assert pack.user_config == {"account": "guest"}
    # run only: the fresh user cannot manage it
    status, body = fresh.call("POST", f"/shares/endpoints/{ep['endpoint_id']}", {"principal": "user:x", "role": "run"})
    assert status == 403 and "'run'" in body["message"]
    status, body = fresh.call("GET", f"/endpoints/{ep['endpoint_id']}")
    assert status == 200 and body["owner"] == "alice"
    # revoked: the next request is refused again
    status, body = api.call("DELETE", f"/shares/endpoints/{ep['endpoint_id']}/all-users")
    assert status == 200 and body["shares"] == {}
    assert submit(fresh, fid, ep)[0] == 404


def test_all_users_takes_run_on_functions_and_endpoints_only(api):
    fid, ep = setup_objects(api)
    status, body = api.call("POST", f"/shares/endpoints/{ep['endpoint_id']}", {"principal": "all-users",
                                                                               "role": "manage"})
    assert status == 400 and body["error"] == "share_refused"
    assert "'all-users' can only be granted 'run'" in body["message"] and "every signed-in user" in body["message"]
    assert "user:<id>" in body["message"]  # the fix
    status, grp = api.call("POST", "/endpoint-groups", {"name": "g", "members": [{"endpoint_id": ep["endpoint_id"]}]})
    assert status == 201
    status, body = api.call("POST", f"/shares/endpoint-groups/{grp['group_id']}", {"principal": "all-users",
                                                                                   "role": "run"})
    assert status == 400 and "functions and endpoints only" in body["message"]
    # endpoint agents are not users: an all-users share gives them nothing
    from lambdas.core.identity import access

    api.call("POST", f"/shares/endpoints/{ep['endpoint_id']}", {"principal": "all-users", "role": "run"})
    assert access.role("endpoint", ep["endpoint_id"], "alice", "") is None
    assert access.role("endpoint", ep["endpoint_id"], "alice", "someone") == "run"


# --- skyfn local token ---------------------------------------------------------------------------
def test_skyfn_local_token_puts_the_email_claim_in_the_token(service_env, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from infra.local.cli import app
    from infra.local.state import StateDir

    state = StateDir.at(tmp_path)
    state.signing_key(create=True)  # what `skyfn local up` creates
    result = CliRunner().invoke(app, ["token", "--user", "alice", "--email", "alice@example.org",
                                      "--home", str(tmp_path)])
    assert result.exit_code == 0, result.output
    token = result.output.strip()
    keys = jwt_keys.key_set(jwks_file=str(state.jwks_file))
    claims = keys.verify(token, "skyfn-local", "skyfn")
    assert claims["sub"] == "alice" and claims["email"] == "alice@example.org"
    assert claims["preferred_username"] == "alice" and claims["identity_provider"] == "skyfn-local"

    result = CliRunner().invoke(app, ["token", "--user", "bob", "--username", "bobby", "--home", str(tmp_path)])
    assert result.exit_code == 0, result.output
    claims = keys.verify(result.output.strip(), "skyfn-local", "skyfn")
    assert claims["preferred_username"] == "bobby" and "email" not in claims

    # the service, verifying with the runtime's JWKS file as `skyfn local up` configures it, reads them
    monkeypatch.delenv("SKYFN_AUTH_SECRET", raising=False)
    monkeypatch.setenv("SKYFN_AUTH_JWKS_FILE", str(state.jwks_file))
    monkeypatch.setenv("SKYFN_AUTH_ISSUER", "skyfn-local")
    deps.reset()
    assert whoami_identity(token) == Identity(user="alice", username="alice", email="alice@example.org",
                                              identity_provider="skyfn-local")


# --- the SDK: Client.run, batches and the Executor send user_config -----------------------------
@pytest.fixture
def gateway(service_env, tmp_path, monkeypatch):
    """The real API handler behind the embedded gateway (real HTTP), for the SDK."""
    from infra.local.standins.gateway import Gateway
    from lambdas.api import handler

    monkeypatch.setenv("SKYFN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SKYFN_EXECUTOR_PUSH", "0")
    gw = Gateway(handler, concurrency=1).start()
    yield gw
    gw.stop()


def test_the_sdk_sends_user_config_with_run_batches_and_the_executor(gateway):
    from skyfn import Client, Executor

    token = mint_token(SECRET, "gina", username="gina", email="gina@example.org", identity_provider="skyfn-local")
    with Client(gateway.url, token, backoff=0.01) as client:
        ep = Api(token).call("POST", "/endpoints", {"name": "mu"})[1]
        tid = client.run(double, 1, endpoint_id=ep["endpoint_id"], user_config={"account": "run"})
        pack = queued_packs(ep)[-1]
        assert [t.task_id for t in pack.tasks] == [tid] and pack.user_config == {"account": "run"}
        assert pack.identity.model_dump() == {"id": "gina", "username": "gina", "email": "gina@example.org",
                                              "identity_provider": "skyfn-local"}
        # a function keyword argument of another name still goes to the function
        client.run(double, endpoint_id=ep["endpoint_id"], x=3)
        assert queued_packs(ep)[-1].user_config is None

        batch = client.create_batch(ep["endpoint_id"], user_config={"account": "batch"})
        batch.add(double, 1)
        batch.add(double, 2)
        ids = client.batch_run(batch)
        pack = queued_packs(ep)[-1]
        assert [t.task_id for t in pack.tasks] == ids and pack.user_config == {"account": "batch"}

        ids = client.submit_tasks([{"function_id": pack.tasks[0].function_id, "payload": pack_args((5,), {})}],
                                  ep["endpoint_id"], user_config={"account": "raw"})
        assert queued_packs(ep)[-1].user_config == {"account": "raw"}

        ex = Executor(endpoint_id=ep["endpoint_id"], client=client, user_config={"account": "ex", "gpus": 1},
                      data_store=None, push=False)
        try:
            futures = [ex.submit(double, i) for i in range(3)]
            deadline = time.monotonic() + 10
            while any(f.task_id is None for f in futures) and time.monotonic() < deadline:
                time.sleep(0.01)
            mine = {f.task_id for f in futures}
            sent = [p for p in queued_packs(ep) if {t.task_id for t in p.tasks} & mine]
            assert sent and all(p.user_config == {"account": "ex", "gpus": 1} for p in sent)
            assert {t.task_id for p in sent for t in p.tasks} == mine
        finally:
            ex.shutdown(wait=True, cancel_futures=True)

        # refused in the SDK before anything is sent, with the service's message
        before = len(queued_packs(ep))
        with pytest.raises(ValueError, match="JSON object"):
            client.run(double, 1, endpoint_id=ep["endpoint_id"], user_config=["not", "an", "object"])
        with pytest.raises(ValueError, match="deeper than"):
            Executor(endpoint_id=ep["endpoint_id"], client=client, user_config=deep(MAX_USER_CONFIG_DEPTH + 1))
        assert len(queued_packs(ep)) == before
