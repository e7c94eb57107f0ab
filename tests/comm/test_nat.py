"""The communicator through real NATs: every rank in its own network namespace behind its
own MASQUERADE router, the rendezvous server in the public namespace (tests/comm/netns.py).

- pairs and a group of 4 punch: stats() says direct, with the other NAT router's public
  address, and data, collectives and point-to-point keep working after the rendezvous
  server is killed;
- behind symmetric NATs (--random-fully) punching cannot work: the pair falls back to the
  relay and the program still gets every byte (sha256 of what was sent vs received);
- in a group where one peer is behind a symmetric NAT, the choice is made per pair;
- keep-alive pings hold an idle channel open through routers that forget idle mappings.
"""
from __future__ import annotations

import time

import pytest

from rendezvous import make_token
from tests.comm.natgroup import spawn_ranks, start_rendezvous, tell_all

SECRET = "nat-test-secret-not-logged"
PORT = 7300
PHASE_TIMEOUT = 60.0


def _run(topo, n: int, nbytes: int, explicit_ranks: bool, kill_rendezvous: bool):
    rdv = start_rendezvous(topo, SECRET, PORT)
    group = f"nat.{topo.run_id}"
    env = {"SKYFN_TEST_TOKEN": make_token(SECRET, group)}
    readers = spawn_ranks(topo, topo.sites, "tests.comm.nat_peer",
                          lambda s: [f"{topo.public_ip}:{PORT}", group, n, s.index if explicit_ranks else -1, nbytes],
                          env)
    joined = [r.json(PHASE_TIMEOUT) for r in readers]
    for j in joined:
        assert j["phase"] == "joined", j.get("trace") or j
    if kill_rendezvous:
        rdv.kill()
        rdv.wait(10)
    tell_all(readers)
    after = [r.json(PHASE_TIMEOUT) for r in readers]
    for a in after:
        assert a["phase"] == "after", a.get("trace") or a
    for r in readers:
        assert r.proc.wait(30) == 0
    site_of = {j["rank"]: topo.sites[i] for i, j in enumerate(joined)}
    return site_of, {j["rank"]: j for j in joined}, {a["rank"]: a for a in after}


def _check_bytes_and_collectives(n: int, by_rank: dict) -> None:
    for i in range(n):
        for j in range(n):
            if i != j:
                # what i sent to j is exactly what j received from i
                assert by_rank[i]["sent"][str(j)] == by_rank[j]["received"][str(i)]
        expect = [sum(k + 100 * r for r in range(n)) for k in range(4)]
        assert by_rank[i]["allreduce"] == expect
        assert by_rank[i]["allgather"] == list(range(n))


def _check_direct(n: int, site_of: dict, by_rank: dict, min_bytes: int) -> None:
    for i in range(n):
        stats = by_rank[i]["stats"]
        for j in range(n):
            if i == j:
                continue
            st = stats[str(j)]
            assert st["mode"] == "direct", (i, j, st)
            ip, port = st["address"].rsplit(":", 1)
            # the other side is reached at its NAT router's public address, nothing else
            assert ip == site_of[j].public_ip, (i, j, st)
            assert int(port) > 0
            assert st["bytes_sent"] >= min_bytes and st["bytes_received"] >= min_bytes


@pytest.mark.parametrize("explicit_ranks", [True, False], ids=["ranks-given", "ranks-assigned"])
def test_pair_punches_and_outlives_the_rendezvous(make_topology, explicit_ranks):
    topo = make_topology(2)
    nbytes = 1 << 20
    site_of, joined, after = _run(topo, 2, nbytes, explicit_ranks, kill_rendezvous=True)
    assert sorted(site_of) == [0, 1]
    _check_direct(2, site_of, joined, nbytes)
    _check_bytes_and_collectives(2, joined)
    # the rendezvous server was killed between the phases: still direct, still correct
    _check_direct(2, site_of, after, 2 * nbytes)
    _check_bytes_and_collectives(2, after)


def test_group_of_four_punches_every_pair(make_topology):
    topo = make_topology(4)
    nbytes = 256 << 10
    site_of, joined, after = _run(topo, 4, nbytes, explicit_ranks=False, kill_rendezvous=True)
    assert sorted(site_of) == [0, 1, 2, 3]
    assert len({s.public_ip for s in site_of.values()}) == 4
    _check_direct(4, site_of, joined, nbytes)
    _check_bytes_and_collectives(4, joined)
    _check_direct(4, site_of, after, 2 * nbytes)
    _check_bytes_and_collectives(4, after)


def test_symmetric_nat_falls_back_to_relay_with_every_byte(make_topology):
    topo = make_topology(2, symmetric=True)
    nbytes = 8 << 20
    site_of, joined, after = _run(topo, 2, nbytes, explicit_ranks=True, kill_rendezvous=False)
    for by_rank in (joined, after):
        for i in range(2):
            st = by_rank[i]["stats"][str(1 - i)]
            assert st["mode"] == "relay", st
            assert st["address"].rsplit(":", 1)[0] == topo.public_ip
        _check_bytes_and_collectives(2, by_rank)
    assert after[0]["stats"]["1"]["bytes_received"] >= 2 * nbytes


def test_mixed_group_chooses_direct_or_relay_per_pair(make_topology):
    """Three peers behind port-keeping NATs and one behind a symmetric NAT: pairs among the
    three punch, every pair with the fourth is relayed, and every byte arrives."""
    topo = make_topology(4, symmetric=[False, False, False, True])
    nbytes = 256 << 10
    site_of, joined, after = _run(topo, 4, nbytes, explicit_ranks=True, kill_rendezvous=False)
    for by_rank in (joined, after):
        for i in range(4):
            for j in range(4):
                if i == j:
                    continue
                st = by_rank[i]["stats"][str(j)]
                if 3 in (i, j):
                    assert st["mode"] == "relay", (i, j, st)
                    assert st["address"].rsplit(":", 1)[0] == topo.public_ip
                else:
                    assert st["mode"] == "direct", (i, j, st)
                    assert st["address"].rsplit(":", 1)[0] == site_of[j].public_ip
        _check_bytes_and_collectives(4, by_rank)


@pytest.mark.parametrize("keepalive, survives", [(1.0, True), (60.0, False)], ids=["pings", "no-pings"])
def test_keepalive_pings_keep_an_idle_channel_through_nats_that_forget(make_topology, keepalive, survives):
    """Routers that forget a mapping idle for 3 s (and drop what comes after): an idle
    punched channel survives 8 s of silence only because of the keep-alive pings. The
    no-pings case shows the routers really forget (the exchange then times out)."""
    topo = make_topology(2)
    for s in topo.sites:
        topo.set_idle_timeout(s, 3)
    rdv = start_rendezvous(topo, SECRET, PORT)
    group = f"ka.{topo.run_id}"
    readers = spawn_ranks(topo, topo.sites, "tests.comm.nat_peer",
                          lambda s: [f"{topo.public_ip}:{PORT}", group, 2, s.index, 64 << 10, keepalive, 8.0],
                          {"SKYFN_TEST_TOKEN": make_token(SECRET, group)})
    joined = [r.json(PHASE_TIMEOUT) for r in readers]
    for j in joined:
        assert j["phase"] == "joined", j.get("trace") or j
        assert j["stats"][str(1 - j["rank"])]["mode"] == "direct"
    rdv.kill()
    rdv.wait(10)
    time.sleep(8.0)  # idle well past the routers' 3 s mapping lifetime
    mapped = topo.sites[1].public_ip in topo.conntrack(topo.sites[0])
    tell_all(readers)
    after = [r.json(PHASE_TIMEOUT) for r in readers]
    if survives:
        assert mapped, "router 0 forgot the mapping despite the pings"
        for a in after:
            assert a["phase"] == "after", a.get("trace") or a
        _check_bytes_and_collectives(2, {a["rank"]: a for a in after})
    else:
        assert not mapped, "router 0 kept an idle mapping: the NAT timeout is not in effect"
        for a in after:
            assert a["phase"] == "error"
            assert "TimeoutError" in a["error"] or "unreachable" in a["error"], a["error"]
