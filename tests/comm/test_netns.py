"""The NAT topology itself, checked with plain Python sockets (no communicator), so a
topology fault is never mistaken for a communicator fault."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.comm.netns import PUBLIC_IP, NatTopology, wait_listening

PROBE = ["-m", "tests.comm.punch_probe"]


def _probe_pair(topo: NatTopology, port: int = 7000, deadline_s: float = 5.0) -> list[dict]:
    refl = topo.python(topo.public_ns, PROBE + ["reflector", PUBLIC_IP, str(port), "2"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_listening(topo, topo.public_ns, port, proc=refl)
    peers = [topo.python(s.ns, PROBE + ["peer", PUBLIC_IP, str(port), f"peer{s.index}", str(deadline_s)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for s in topo.sites]
    results = []
    for p in peers:
        out, err = p.communicate(timeout=deadline_s + 30)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    refl.communicate(timeout=10)
    return results


def _connect_outcome(topo: NatTopology, ns: str, ip: str, port: int) -> str:
    code = ("import socket,sys\n"
            "s=socket.socket(); s.settimeout(1.0)\n"
            "try:\n"
            f"    s.connect(({ip!r},{port})); print('connected')\n"
            "except socket.timeout: print('timeout')\n"
            "except ConnectionRefusedError: print('refused')\n"
            "except OSError as e: print('error', e.errno)\n")
    return topo.run(ns, [sys.executable, "-c", code]).stdout.strip()


def test_namespaces_and_addresses(make_topology):
    topo = make_topology(2)
    for s in topo.sites:
        addrs = topo.run(s.router_ns, ["ip", "-4", "-o", "addr", "show"]).stdout
        assert s.public_ip in addrs and "192.168.7.1" in addrs
        assert topo.run(s.router_ns, ["sysctl", "-n", "net.ipv4.ip_forward"]).stdout.strip() == "1"
        assert topo.run(s.ns, ["sysctl", "-n", "net.ipv4.ip_forward"]).stdout.strip() == "0"
        nat = topo.run(s.router_ns, ["iptables", "-t", "nat", "-S", "POSTROUTING"]).stdout
        assert "-o pub -j MASQUERADE" in nat and "--random-fully" not in nat
    assert topo.run(topo.public_ns, ["sysctl", "-n", "net.ipv4.ip_forward"]).stdout.strip() == "0"
    # Both peers hold the same private address: they can only meet through the NATs.
    assert topo.sites[0].private_ip == topo.sites[1].private_ip


def test_unsolicited_inbound_is_dropped_not_reset(make_topology):
    topo = make_topology(2)
    # From the public side and from the other peer: silence (a drop), never a reset.
    assert _connect_outcome(topo, topo.public_ns, topo.sites[0].public_ip, 7001) == "timeout"
    assert _connect_outcome(topo, topo.sites[1].ns, topo.sites[0].public_ip, 7001) == "timeout"
    # The public side has no route to private addresses at all.
    assert _connect_outcome(topo, topo.public_ns, topo.sites[0].private_ip, 7001).startswith("error")


def test_plain_sockets_punch_through_the_nats(make_topology):
    topo = make_topology(2)
    a, b = _probe_pair(topo)
    for me, other, site, other_site in ((a, b, topo.sites[0], topo.sites[1]), (b, a, topo.sites[1], topo.sites[0])):
        # The reflector saw each peer at its router's public address, port kept by MASQUERADE.
        assert me["observed"] == [site.public_ip, me["local_port"]]
        assert me["ok"], me
        assert me["payload_ok"]
        assert me["peername"] == [other_site.public_ip, other["observed"][1]]
    assert topo.conntrack(topo.sites[0]).count(topo.sites[1].public_ip) >= 1


def test_symmetric_nat_defeats_plain_punching(make_topology):
    topo = make_topology(2, symmetric=True)
    nat = topo.run(topo.sites[0].router_ns, ["iptables", "-t", "nat", "-S", "POSTROUTING"]).stdout
    assert "--random-fully" in nat
    a, b = _probe_pair(topo, deadline_s=2.0)
    assert not a["ok"] and not b["ok"]
    assert a["attempts"] > 1 and b["attempts"] > 1


def test_close_removes_every_namespace(netns_reason):
    if netns_reason:
        pytest.skip(f"NAT tests need network namespaces: {netns_reason}")
    with NatTopology(3) as topo:
        names = topo.namespaces()
        sleeper = topo.spawn(topo.sites[0].ns, ["sleep", "60"])
        assert len(names) == 7
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in names)
    assert sleeper.poll() is not None


def test_failed_setup_cleans_up(netns_reason, monkeypatch):
    if netns_reason:
        pytest.skip(f"NAT tests need network namespaces: {netns_reason}")
    topo = NatTopology(2)

    def broken(site):
        raise RuntimeError("rule failed on purpose")

    monkeypatch.setattr(topo, "_nat_rules", broken)
    with pytest.raises(RuntimeError, match="on purpose"):
        topo.create()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert topo.run_id not in listed


@pytest.mark.parametrize("symmetric", [False, True], ids=["cone-nat", "symmetric-nat"])
def test_rendezvous_sees_public_addresses_and_relays_through_nats(make_topology, symmetric):
    """The rendezvous server and its reference client alone (no communicator) across the NATs."""
    from rendezvous import make_token
    from tests.comm.natgroup import spawn_ranks, start_rendezvous

    topo = make_topology(2, symmetric=symmetric)
    secret, group, port, nbytes = "probe-secret", f"probe.{topo.run_id}", 7300, 4 << 20
    start_rendezvous(topo, secret, port)
    readers = spawn_ranks(topo, topo.sites, "tests.comm.rdv_probe",
                          lambda s: [f"{topo.public_ip}:{port}", group, 2, s.index, nbytes],
                          {"SKYFN_TEST_TOKEN": make_token(secret, group)})
    a, b = (r.json(60) for r in readers)
    for me in (a, b):
        assert [ip for ip, _ in me["peers"]] == [topo.sites[0].public_ip, topo.sites[1].public_ip]
    if not symmetric:  # MASQUERADE kept the ports: the server saw each peer's own port
        assert a["peers"][0][1] == a["local_port"] and a["peers"][1][1] == b["local_port"]
    assert a["sent"] == b["received"] and b["sent"] == a["received"]
    assert a["received_bytes"] == b["received_bytes"] == nbytes
