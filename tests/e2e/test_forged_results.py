"""On the embedded runtime, as a new user would try it: bob registers an endpoint of his own
and, with the credential and queue login that gives him, adds result packs to the runtime's
shared results stream about alice's task, RUNNING on the local endpoint -- a SUCCEEDED whose
value is a pickle that would run his code in alice's client, a FAILED, a RUNNING update --
naming her endpoint, naming "", unsealed, and sealed with his own key. The service consumes
them (the stream's consumer group has nothing left) and her task is unaffected; her own
agent's result then lands, and her client never runs bob's pickle.
"""
from __future__ import annotations

import base64
import pickle
import time

import redis
import requests

from skyfn.protocol.messages import ResultPack, TaskResult, TaskUpdate
from skyfn.protocol.result_seal import key_of_credential, seal


def nap(seconds):
    import time

    time.sleep(seconds)
    return seconds


class Boom:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _consumed(admin: redis.Redis, timeout: float = 60.0) -> None:
    """Wait until the service's reader has taken and acknowledged every entry of the results stream."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        groups = admin.xinfo_groups("results")
        if groups and all(g["lag"] == 0 and g["pending"] == 0 for g in groups):
            return
        time.sleep(0.1)
    raise AssertionError(f"the results stream was not consumed within {timeout} s: {admin.xinfo_groups('results')}")


def _state(client, tid: str) -> dict:
    return client.status([tid], peek=True)["tasks"][tid]


def test_another_users_endpoint_cannot_forge_alices_result(local_home, client, endpoint_id, tmp_path):
    from infra.local import runtime
    from infra.local.state import StateDir

    state = StateDir.at(local_home)
    admin = redis.Redis.from_url(state.read_runtime()["redis_url"])
    marker = tmp_path / "bobs-code-ran"
    tid = client.run(client.register_function(nap), 6, endpoint_id=endpoint_id)
    deadline = time.monotonic() + 60
    while _state(client, tid)["state"] != "RUNNING":
        assert time.monotonic() < deadline, _state(client, tid)
        time.sleep(0.1)

    bob = runtime.mint_token(state, "bob")
    reply = requests.post(f"{client.service_url}/endpoints", json={"name": "bobs-laptop"},
                          headers={"Authorization": f"Bearer {bob}"}, timeout=30)
    assert reply.status_code == 201, reply.text
    mine = reply.json()
    bobs_login = redis.Redis.from_url(mine["results_queue"]["url"])  # ep-<bob's endpoint>: XADD to results
    key = key_of_credential(mine["agent_credential"])
    evil = f"pickle 3.11\n{base64.b64encode(pickle.dumps(Boom(str(marker)))).decode()}"

    def forged(named: str, result: TaskResult) -> bytes:
        return ResultPack(endpoint_id=named, results=[result],
                          updates=[TaskUpdate(task_id=tid, state="RUNNING", ts=time.time())]).model_dump_json().encode()

    success = TaskResult(task_id=tid, state="SUCCEEDED", result=evil)
    failure = TaskResult(task_id=tid, state="FAILED", reason="bob says it failed")
    for body in (seal(mine["endpoint_id"], key, forged(endpoint_id, success)),
                 seal(mine["endpoint_id"], key, forged("", success)),
                 seal(mine["endpoint_id"], key, forged(endpoint_id, failure)),
                 forged(endpoint_id, success), forged("", failure),
                 seal(endpoint_id, key, forged(endpoint_id, success))):
        bobs_login.xadd("results", {"b": body})
    _consumed(admin)
    now = _state(client, tid)  # as it was (or, on a slow machine, finished by her own agent)
    assert now["state"] == "RUNNING" or (now["state"] == "SUCCEEDED" and now["result_by"] == endpoint_id), now
    assert client.get_result(tid, timeout=60) == 6  # her agent's result, not dropped as a duplicate
    final = client.status([tid], peek=True)["tasks"][tid]
    assert final["result_by"] == endpoint_id == final["endpoint_id"]
    assert not marker.exists()
