"""Direct sessions from behind one NAT to an agent behind another (issue 40), in the
network-namespace lab: the SDK (tests/comm/direct_nat_peer.py sdk) and the agent (a real
interchange with its workers, `direct: {reach: rendezvous}`: no port) each behind a
MASQUERADE router that drops unsolicited inbound packets, the agent's namespace also
dropping every inbound connection itself, the rendezvous server on the public side.
1,000 tasks go over a punched channel; with a symmetric NAT on one side over the relay;
with the rendezvous server (and so the relay's connections) killed mid-batch the session
comes back and every task resolves exactly once, with its value."""
from __future__ import annotations

import json
import secrets
import subprocess

import pytest

from tests.comm.natgroup import LineReader, start_rendezvous
from tests.comm.netns import NatTopology

PORT = 7300


class Lab:
    def __init__(self, topo: NatTopology, tmp_path, punch_timeout: float):
        self.topo, self.tmp, self.punch_timeout = topo, tmp_path, punch_timeout
        self.secret = secrets.token_hex(16)
        self.rdv = start_rendezvous(topo, self.secret, PORT)
        self.address = f"{topo.public_ip}:{PORT}"
        self.sdk_site, self.agent_site = topo.sites
        # the agent's namespace takes no connection from outside at all (its router drops them too)
        topo.run(self.agent_site.ns, ["iptables", "-A", "INPUT", "-i", "eth0", "-m", "conntrack", "--ctstate", "NEW",
                                      "-j", "DROP"])
        # the agent decides when punching gave up: a generous bound where it must succeed (a
        # loaded machine), a short one where it cannot (a symmetric NAT: the relay is the point)
        env = {"SKYFN_RENDEZVOUS_SECRET": self.secret, "SKYFN_TEST_PUNCH_TIMEOUT": str(punch_timeout)}
        proc = topo.python(self.agent_site.ns, ["-m", "tests.comm.direct_nat_peer", "agent", self.address,
                                                str(tmp_path / "agent")], env=env, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.agent = LineReader(proc)
        self.info = self.agent.json(90)
        self.env = env

    def agent_cmd(self, cmd: str) -> dict:
        self.agent.proc.stdin.write(cmd + "\n")
        self.agent.proc.stdin.flush()
        return self.agent.json(30)

    def sdk(self, **job) -> LineReader:
        proc = self.topo.python(self.sdk_site.ns, ["-m", "tests.comm.direct_nat_peer", "sdk", self.address],
                                env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        proc.stdin.write(json.dumps({"agent": self.info, "punch_timeout": self.punch_timeout, **job}) + "\n")
        proc.stdin.flush()
        return LineReader(proc)

    def public_listeners(self) -> list[str]:
        """TCP sockets listening in the agent's namespace on anything but loopback."""
        out = self.topo.run(self.agent_site.ns, ["ss", "-Hltn"]).stdout.splitlines()
        return [line for line in out if "127.0.0.1:" not in line and "[::1]:" not in line]


@pytest.fixture
def lab(make_topology, tmp_path):
    def make(symmetric=False) -> Lab:
        return Lab(make_topology(2, symmetric=symmetric), tmp_path, 2.0 if symmetric else 15.0)
    return make


def _all_once(out: dict, n: int) -> None:
    assert out.get("first") == 1, out
    assert out["values_ok"] and out["resolved_once"], out
    st = out["stats"]
    assert st["results"] == n + 1 and st["to_service"] == 0 and st["lost"] == 0, st
    assert out["to_service"] == 0 and out["status_calls"] == 0, out


def test_1000_tasks_over_a_punched_channel_between_two_nats(lab):
    lab = lab()
    assert lab.info["address"] is None and lab.info["rendezvous"] is True
    out = lab.sdk(tasks=1000).json(180)
    _all_once(out, 1000)
    assert out["path"] == "punched" and out["path_end"] == "punched", out
    assert out["stats"]["relayed"] == 0 and out["stats"]["relay_bytes"] == 0, out["stats"]
    assert lab.public_listeners() == []   # no port, not even one left by punching
    stats = lab.agent_cmd("stats")
    assert stats["rendezvous"]["punched"] == 1 and stats["rendezvous"]["refused"] == 0, stats
    assert stats["tasks"] == 1001, stats


def test_a_symmetric_nat_sends_the_session_over_the_relay(lab):
    lab = lab(symmetric=[True, False])
    out = lab.sdk(tasks=1000).json(180)
    _all_once(out, 1000)
    assert out["path"] == "relayed" and out["stats"]["punched"] == 0, out
    assert out["stats"]["relay_bytes"] > 1000 * 20, out   # every task and result went through the server
    assert lab.public_listeners() == []


def test_the_relay_killed_mid_batch_the_session_comes_back_and_every_task_resolves_once(lab):
    lab = lab(symmetric=[True, False])
    sdk = lab.sdk(tasks=1500, fn="nap_square", drop_after=300, timeout=60)
    paused = sdk.json(180)
    assert "dropping" in paused, paused
    # the relay dies: the server process and with it both halves of every relayed connection
    lab.rdv.kill()
    lab.rdv.wait(10)
    lab.rdv = start_rendezvous(lab.topo, lab.secret, PORT)
    sdk.proc.stdin.write("go\n")
    sdk.proc.stdin.flush()
    out = sdk.json(240)
    _all_once(out, 1500)
    st = out["stats"]
    assert out["dropped_at"] < 1500, out           # the kill came while tasks were still under way
    assert st["path_breaks"] >= 1 and st["relayed"] >= 2 and out["path_end"] == "relayed", st
    assert out["sessions"] == 1                    # the same session, through a new path
