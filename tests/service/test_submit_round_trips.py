"""The Redis round trips of POST /tasks before its tasks reach the endpoint's queue (issue
37), through the real API handler on a real redis-server and moto: the functions and the
endpoint named are read in one round trip, and the caller's identity claims are kept for
later runs after the tasks were queued, not before (the tasks still carry them)."""
from __future__ import annotations

import functools
import hashlib
import os

from lambdas.auth import mint_token
from lambdas.adapters.redis_store import connection, lua_files
from lambdas.core import deps
from lambdas.core.identity import submitters
from skyfn.protocol import pack_args, serialize_function
from tests.recording_redis import RecordingRedis
from tests.service.conftest import SECRET, Api


def double(x):
    return 2 * x


def test_a_submission_reads_function_and_endpoint_together_and_keeps_claims_after_queueing(service_env,
                                                                                         monkeypatch):
    api = Api(mint_token(SECRET, "dora", username="dora", email="dora@example.org", identity_provider="skyfn-local"))
    status, fn = api.call("POST", "/functions", {"function": serialize_function(double), "name": "double"})
    assert status == 201, fn
    status, ep = api.call("POST", "/endpoints", {"name": "cluster"})
    assert status in (200, 201), ep

    recorder = RecordingRedis.from_url(os.environ["SKYFN_REDIS_URL"])
    deps.reset()
    monkeypatch.setattr(connection, "redis_client", functools.lru_cache(maxsize=1)(lambda: recorder))
    body = {"endpoint_id": ep["endpoint_id"], "tasks": [{"function_id": fn["function_id"], "payload": pack_args((1,), {})}]}
    status, answer = api.call("POST", "/tasks", body)
    assert status == 202, answer

    sent = recorder.sent
    assert ("HMGET", "HGETALL") in sent  # the function and the endpoint: one round trip
    assert "HGETALL" not in sent  # the endpoint is not read again on its own
    queued = next(i for i, s in enumerate(sent) if isinstance(s, tuple) and "XADD" in s)
    claims = sent.index(f"EVALSHA {hashlib.sha1(lua_files.source('remember_claims').encode()).hexdigest()}")
    assert claims > queued
    assert submitters.known("dora") == {"username": "dora", "email": "dora@example.org",
                                        "identity_provider": "skyfn-local"}
