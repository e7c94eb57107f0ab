"""Direct sessions through the rendezvous server on this machine (issue 40; the NAT lab is
tests/comm/test_direct_nat.py): a real interchange that opens no port and LISTENs at a
real rendezvous server, real SDK paths (skyfn/executor/direct_path.py) and DirectChannels.
A ticket for another user, endpoint or session is refused at the rendezvous server and at
the agent; a relay that alters one byte breaks the session's connection, which comes back
through a new path, and no altered result is ever delivered."""
from __future__ import annotations

import socket
import time

import pytest

from rendezvous import Limits, client, pair, serve_in_thread
from rendezvous.client import RendezvousError
from rendezvous.server import Connection
from skyfn.executor.direct_path import PathBridge
from skyfn.protocol.api import ListenTicket
from skyfn.protocol.direct_path import REFUSE_BAD_TICKET, listen_ticket, listener_name, path_ticket
from tests.agent.test_direct import Rig
from tests.comm.direct_nat_peer import run_sdk

SECRET = "issue-40-secret"
OTHER = {"endpoint": {"endpoint": "ep2"}, "session": {"sid": "s-2"}, "user": {"owner": "mallory"}}


@pytest.fixture
def reach(tmp_path, queues):
    rdv = serve_in_thread("127.0.0.1", 0, SECRET, limits=Limits(zero_copy_relay=False))
    rig = Rig(tmp_path, queues, direct={"reach": "rendezvous", "punch_timeout": 0.5})
    server = rig.ix.direct
    server.start_reach(lambda: ListenTicket(**listen_ticket(SECRET, rdv.address, "ep", 3600, time.time())))
    deadline = time.monotonic() + 20
    while not server.reach.listening:
        assert time.monotonic() < deadline, server.reach.last_error
        time.sleep(0.02)
    yield rig, rdv
    rig.close()
    rdv.stop()


def _ticket(rig, rdv, *, endpoint="ep", sid="s-1", owner="alice"):
    now = time.time()
    return path_ticket(SECRET, rdv.address, endpoint, sid, owner, rig.ix.direct.session_key, now + 600, now)


def test_the_agent_opens_no_port_and_publishes_that_it_listens_at_the_rendezvous(reach):
    rig, _ = reach
    info = rig.ix.direct.info()
    assert info["address"] is None and info["rendezvous"] is True and rig.ix.direct.port is None


@pytest.mark.parametrize("other", ["endpoint", "session", "user"])
def test_a_ticket_for_another_user_endpoint_or_session_is_refused_at_the_rendezvous(reach, other):
    rig, rdv = reach
    good = _ticket(rig, rdv)
    bad = _ticket(rig, rdv, **OTHER[other])
    with pytest.raises(RendezvousError) as err:
        # the call token of the other ticket, presented for this session's caller at this endpoint
        client.call(rdv.address, listener_name("ep"), bad["token"], caller=good["caller"], timeout=10)
    assert err.value.code == "bad_token" and "call token was not made for caller" in err.value.reason
    assert rig.ix.direct.reach.counts["calls"] == 0   # the agent never heard of it


@pytest.mark.parametrize("other", ["endpoint", "session", "user"])
def test_a_ticket_for_another_user_endpoint_or_session_is_refused_at_the_agent(reach, other):
    rig, rdv = reach
    good = _ticket(rig, rdv)
    bad = _ticket(rig, rdv, **OTHER[other])
    # admitted by the rendezvous server (a good call token), but proving another session's path key
    bridge = PathBridge(dict(good, path_key=bad["path_key"]), punch_timeout=0.5)
    try:
        local = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        local.connect(bridge.ipc_path)
        deadline = time.monotonic() + 20
        while bridge.refused is None:
            assert time.monotonic() < deadline, bridge.last_error
            time.sleep(0.02)
        local.close()
    finally:
        bridge.close()
    assert bridge.refused[0] == REFUSE_BAD_TICKET and "another session, user or endpoint" in bridge.refused[1]
    assert bridge.counts["paths"] == 0
    stats = rig.on_loop(rig.ix.direct.stats)
    assert stats["rendezvous"]["refused"] == 1 and stats["packs"] == 0 and stats["rendezvous"]["paths"] == 0


def test_a_refused_path_ends_the_session_and_its_tasks_go_through_the_service(reach):
    rig, rdv = reach
    info = dict(rig.ix.direct.info(), session_key="00" * 32)  # a session signed with a key this agent never had
    out = run_sdk({"agent": info, "tasks": 0, "first_timeout": 30, "timeout": 10}, rdv.address, SECRET)
    assert "first_error" in out and out["stats"]["lost"] == 1 and out["stats"]["to_service"] == 1, out
    assert "refused the path" in out["stats"]["last_loss"], out


def test_a_relay_that_alters_a_byte_breaks_the_connection_never_the_data(reach, monkeypatch):
    rig, rdv = reach
    seen = {"bytes": 0, "altered": 0}
    forward = Connection.data_received

    def tampering(self, data: bytes):
        if self.partner is not None and not seen["altered"]:
            seen["bytes"] += len(data)
            if seen["bytes"] > 4000:  # past the handshakes: inside the session's traffic
                i = len(data) // 2
                data = data[:i] + bytes([data[i] ^ 0x20]) + data[i + 1:]
                seen["altered"] += 1
        return forward(self, data)

    monkeypatch.setattr(Connection, "data_received", tampering)
    connect = pair.connect
    monkeypatch.setattr(pair, "connect", lambda *a, **k: connect(*a, **dict(k, allow_direct=False)))  # relay only
    out = run_sdk({"agent": rig.ix.direct.info(), "tasks": 400, "timeout": 30}, rdv.address, SECRET)
    assert seen["altered"] == 1
    assert out["first"] == 1 and out["values_ok"] and out["resolved_once"], out
    st = out["stats"]
    assert st["path_breaks"] >= 1 and st["relayed"] >= 2 and st["lost"] == 0 and st["to_service"] == 0, st
    assert out["path_end"] == "relayed" and out["status_calls"] == 0, out


def test_auto_takes_the_address_when_it_answers_else_the_rendezvous_and_names_what_is_missing():
    from skyfn.executor.direct_path import route

    ticket = {"name": "direct.ep"}
    listening = socket.create_server(("127.0.0.1", 0))
    try:
        open_address = f"tcp://127.0.0.1:{listening.getsockname()[1]}"
        assert route({"address": open_address, "rendezvous": ticket}, "auto") == ("tcp", open_address)
    finally:
        listening.close()
    assert route({"address": open_address, "rendezvous": ticket}, "auto") == ("rendezvous", ticket)  # refused now
    assert route({"address": open_address, "rendezvous": ticket}, "rendezvous") == ("rendezvous", ticket)
    assert route({"address": open_address, "rendezvous": None}, "auto") == ("tcp", open_address)
    for opened, via, expect in [({"address": None, "rendezvous": ticket}, "address", "direct_via='auto'"),
                                ({"address": None, "rendezvous": None}, "auto", "SKYFN_RENDEZVOUS_ADDRESS"),
                                ({"address": open_address, "rendezvous": None}, "rendezvous", "direct.reach")]:
        with pytest.raises(ValueError) as err:
            route(opened, via)
        assert expect in str(err.value)


def test_an_agent_with_reach_auto_is_reached_at_its_address_by_default(tmp_path, queues):
    rdv = serve_in_thread("127.0.0.1", 0, SECRET)
    rig = Rig(tmp_path, queues, direct={"reach": "auto", "listen": "127.0.0.1"})
    try:
        rig.ix.direct.start_reach(lambda: ListenTicket(**listen_ticket(SECRET, rdv.address, "ep", 3600, time.time())))
        info = rig.ix.direct.info()
        assert info["address"].startswith("tcp://127.0.0.1:") and info["rendezvous"] is True
        out = run_sdk({"agent": info, "tasks": 50, "via": "auto"}, rdv.address, SECRET)
        assert out["values_ok"] and out["path"] == "tcp" and "paths" not in out["stats"], out
        out = run_sdk({"agent": info, "tasks": 50, "via": "rendezvous"}, rdv.address, SECRET)
        assert out["values_ok"] and out["path"] == "punched", out
    finally:
        rig.close()
        rdv.stop()
