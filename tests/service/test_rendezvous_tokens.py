"""Rendezvous group tokens issued by the service (POST /rendezvous/tokens,
lambdas/core/runs/rendezvous_tokens.py), used against a real rendezvous server: a token admits
its holder to the caller's own (namespaced) group until it expires, and to no other group."""
from __future__ import annotations

import time

import pytest

from lambdas.core import deps
from rendezvous.client import RendezvousError, join
from rendezvous.runner import serve_in_thread
from rendezvous.tokens import TokenError, verify_token

SECRET = "rdv-secret-" + "r" * 32


@pytest.fixture
def rdv(service_env, monkeypatch):
    from lambdas.core.runs.settings import run_settings

    with serve_in_thread("127.0.0.1", 0, SECRET) as server:
        monkeypatch.setenv("SKYFN_RENDEZVOUS_SECRET", SECRET)
        monkeypatch.setenv("SKYFN_RENDEZVOUS_ADDRESS", server.address)
        run_settings.cache_clear()
        deps.reset()
        yield server
    run_settings.cache_clear()


def test_a_token_admits_its_group_and_no_other(rdv, api, other_api):
    status, tok = api.call("POST", "/rendezvous/tokens", {"name": "shuffle", "ttl_seconds": 600})
    assert status == 201 and tok["address"] == rdv.address and tok["group"].endswith(".shuffle")
    assert 590 < tok["expires"] - time.time() <= 600
    session = join(tok["address"], tok["group"], tok["token"], size=1, timeout=10)
    assert session.rank == 0 and session.size == 1
    session.close()
    _, theirs = other_api.call("POST", "/rendezvous/tokens", {"name": "shuffle"})
    assert theirs["group"] != tok["group"]  # names are namespaced to the user who asked
    with pytest.raises(RendezvousError) as err:
        join(tok["address"], theirs["group"], tok["token"], size=1, timeout=10)  # alice's token, mallory's group
    assert err.value.code == "bad_token"


def test_tokens_expire(rdv, api):
    status, tok = api.call("POST", "/rendezvous/tokens", {"name": "brief", "ttl_seconds": 60})
    assert status == 201
    verify_token(SECRET, tok["group"], tok["token"])
    with pytest.raises(TokenError) as err:
        verify_token(SECRET, tok["group"], tok["token"], now=tok["expires"] + 1)
    assert err.value.code == "expired_token"


@pytest.mark.parametrize("body", [{"name": "a b"}, {"name": "x", "ttl_seconds": 10},
                                  {"name": "x", "ttl_seconds": 7 * 86400}, {}])
def test_bad_requests_are_422(rdv, api, body):
    assert api.call("POST", "/rendezvous/tokens", body)[0] == 422


def test_without_a_rendezvous_server_the_route_says_so(service_env, api, monkeypatch):
    from lambdas.core.runs.settings import run_settings

    monkeypatch.delenv("SKYFN_RENDEZVOUS_SECRET", raising=False)
    run_settings.cache_clear()
    status, body = api.call("POST", "/rendezvous/tokens", {"name": "x"})
    run_settings.cache_clear()
    assert status == 404 and body["error"] == "rendezvous_not_configured"
