"""The agent's results queue seals every pack (endpoint_agent/service/sealed_results.py) on a
real Redis stream: what arrives opens under the endpoint's results key, derived from its
credential as the service derives it; a credential rotated while the agent runs seals from
then on with the new key; without a key nothing leaves unsealed."""
from __future__ import annotations

import hashlib

import pytest

from endpoint_agent.service.sealed_results import SealedResults
from skyfn.protocol.messages import ResultPack, TaskResult
from skyfn.protocol.queues import open_queue
from skyfn.protocol.result_seal import key_of_credential, open_sealed, results_key, verify

OLD = "skyfn-agent.ep-1." + "a" * 43
NEW = "skyfn-agent.ep-1." + "b" * 43


def body(tid: str) -> bytes:
    return ResultPack(endpoint_id="anything", results=[TaskResult(task_id=tid, state="SUCCEEDED",
                                                                  result="json 3.11\n1")]).model_dump_json().encode()


def test_packs_leave_sealed_with_the_current_key(queues):
    held = {"key": key_of_credential(OLD)}
    sender = SealedResults(open_queue(queues.results_desc, consumer="agent"), lambda: "ep-1", lambda: held["key"])
    sender.send([body("t1")])
    held["key"] = key_of_credential(NEW)  # rotated while the agent runs
    sender.send([body("t2")])
    got = queues.results.receive(max_messages=10, wait_seconds=1)
    opened = [open_sealed(m.body) for m in got]
    assert [(ep, b) for ep, _, b in opened] == [("ep-1", body("t1")), ("ep-1", body("t2"))]
    # the service's key of each credential: from the SHA-256 it keeps of the secret
    service_key = {c: results_key(hashlib.sha256(c.rsplit(".", 1)[1].encode()).hexdigest()) for c in (OLD, NEW)}
    assert verify(service_key[OLD], "ep-1", opened[0][2], opened[0][1])
    assert verify(service_key[NEW], "ep-1", opened[1][2], opened[1][1])
    assert not verify(service_key[OLD], "ep-1", opened[1][2], opened[1][1])


def test_without_a_key_nothing_is_sent(queues):
    sender = SealedResults(open_queue(queues.results_desc, consumer="agent"), lambda: "ep-1", lambda: None)
    with pytest.raises(RuntimeError, match="no results key"):
        sender.send([body("t1")])
    assert queues.results.receive(max_messages=10, wait_seconds=0) == []
