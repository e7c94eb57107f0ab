"""The direct path through real NATs: two endpoints in their own network namespaces, each
behind its own MASQUERADE router (tests/comm/netns.py), the rendezvous server in the
public namespace. On the producer's side the object server (`python -m
endpoint_agent.data.object_server`) and a producer process that puts a 100 MB numpy array as
alice's ref; on the consumer's side a process that resolves it through a punched channel.

- port-keeping NATs: the channel is direct (to the producer router's public address) and
  the array arrives equal (sha256) in a consumer that does not know the store's secret
  (the object server checks the capability); mallory's task holding the ref is refused by
  the object server, naming the ref, the store and the reason; an evicted ref fails with
  the object server's reason;
- symmetric NATs (--random-fully): punching cannot work, the channel is relayed through the
  rendezvous server, and the array still arrives equal.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import time

import pytest

from tests.comm.natgroup import LineReader, start_rendezvous
from tests.comm.netns import NatTopology, namespaces_unavailable_reason

RDV_SECRET = "direct-nat-secret-never-logged"
STORE = "results@ep-producer"
PORT = 7300
NAME = "objects.ep-producer"


@pytest.fixture(scope="module")
def netns_reason():
    return namespaces_unavailable_reason()


def _object_server(topo: NatTopology, directory: str, store_secret: str, tmp_path) -> subprocess.Popen:
    ready = tmp_path / "ready.json"
    log = open(tmp_path / "object_server.log", "w")
    proc = topo.python(topo.sites[0].ns, ["-m", "endpoint_agent.data.object_server", "--rendezvous",
                                          f"{topo.public_ip}:{PORT}", "--name", NAME, "--store", STORE,
                                          "--directory", directory, "--endpoint-id", "ep-producer",
                                          "--timeout", "60", "--ready-file", str(ready)],
                       env={"SKYFN_RENDEZVOUS_SECRET": RDV_SECRET, "SKYFN_DIRECT_STORE_SECRET": store_secret},
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert proc.poll() is None, f"object server exited {proc.returncode}: {(tmp_path / 'object_server.log').read_text()}"
        assert time.monotonic() < deadline, "object server did not listen within 30 s"
        time.sleep(0.05)
    return proc


def _pull(topo: NatTopology, nbytes: int, tmp_path) -> tuple[dict, dict, str]:
    """Rendezvous, object server and producer on their sides, then the consumer's checks."""
    store_secret = secrets.token_hex(32)
    directory = str(tmp_path / "objects")
    rdv = start_rendezvous(topo, RDV_SECRET, PORT, log_level="info")
    server = _object_server(topo, directory, store_secret, tmp_path)
    env = {"SKYFN_RENDEZVOUS_SECRET": RDV_SECRET}
    args = [f"{topo.public_ip}:{PORT}", NAME, directory]
    producer = topo.run(topo.sites[0].ns, [os.sys.executable, "-m", "tests.data.direct_peer", "produce", *args,
                                           str(nbytes)], timeout=60,
                        env={**env, "SKYFN_ENDPOINT_ID": "ep-producer", "SKYFN_TEST_STORE": STORE,
                             "SKYFN_TEST_STORE_SECRET": store_secret})
    made = json.loads(producer.stdout.strip().splitlines()[-1])
    assert "error" not in made, made
    consumer = topo.python(topo.sites[1].ns, ["-m", "tests.data.direct_peer", "consume", *args],
                           env={**env, "SKYFN_ENDPOINT_ID": "ep-consumer"}, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    consumer.stdin.write(json.dumps(made) + "\n")
    consumer.stdin.flush()
    reader = LineReader(consumer)
    checks = {}
    for _ in range(4):
        line = reader.json(90)
        assert "error" not in line or "check" in line, line
        checks[line["check"]] = line
    assert consumer.wait(30) == 0
    server.terminate()
    assert server.wait(15) == 0
    rdv.terminate()
    return made, checks, (tmp_path / "object_server.log").read_text()


def _key(made: dict) -> str:
    import base64
    import pickle

    from skyfn.data.ref import ref_info

    return ref_info(pickle.loads(base64.b64decode(made["ref"]))).key


@pytest.fixture
def topology(netns_reason):
    if netns_reason:
        pytest.skip(f"direct-path NAT tests need network namespaces: {netns_reason}")
    made = []

    def make(symmetric: bool) -> NatTopology:
        topo = NatTopology(2, symmetric=symmetric).create()
        made.append(topo)
        return topo

    yield make
    for topo in made:
        topo.close()


def test_100mb_array_pulled_through_punched_nats_and_refusals(topology, tmp_path):
    topo = topology(symmetric=False)
    made, checks, log = _pull(topo, 100 << 20, tmp_path)
    alice = checks["alice"]
    assert alice["ok"], alice
    assert alice["sha256"] == made["sha256"] and alice["shape"] == [(100 << 20) // 8]
    assert alice["local"] is False                      # the consumer endpoint pulled, it did not read a file
    assert alice["store_known"] is False                # ... without the store's secret: the object server checked
    (channel,) = alice["channels"][NAME]
    assert channel["mode"] == "direct", channel
    assert channel["address"].rsplit(":", 1)[0] == topo.sites[0].public_ip    # the producer's NAT, nothing else
    assert channel["bytes_received"] >= 100 << 20
    key = _key(made)

    for check in ("mallory_ref", "mallory_server"):  # mallory's task holding the ref; the connector asked directly
        refused = checks[check]
        assert not refused["ok"] and refused["type"] == "RefAccessDenied", refused
        assert refused["error"] == (f"cannot resolve ref {key!r} of store {STORE!r}: it belongs to alice and is not "
                                    "shared with mallory: ask its owner to share it (store.ref(obj, "
                                    f"share_with=[...])); refused by the object server {NAME} of endpoint ep-producer")
    missing = checks["evicted"]
    assert not missing["ok"] and missing["type"] == "RefResolutionError"
    assert f"of store {STORE!r}: no such object on the object server {NAME} of endpoint ep-producer: evicted by its " \
           "owner" in missing["error"]
    assert f"refused {STORE}/{key} to mallory (owner alice)" in log
    assert RDV_SECRET not in log


def test_symmetric_nats_fall_back_to_the_relay(topology, tmp_path):
    topo = topology(symmetric=True)
    made, checks, _ = _pull(topo, 32 << 20, tmp_path)
    alice = checks["alice"]
    assert alice["ok"], alice
    assert alice["sha256"] == made["sha256"]
    (channel,) = alice["channels"][NAME]
    assert channel["mode"] == "relay", channel
    assert channel["address"].rsplit(":", 1)[0] == topo.public_ip          # through the rendezvous server
    assert channel["bytes_received"] >= 32 << 20
    assert checks["mallory_server"]["type"] == "RefAccessDenied"
