"""A batch whose chunks the Distributed Map cannot route (the endpoint is offline) fails
their tasks in the Map's Catch step (lambdas/core/runs/batches.chunk_failed); those final states
are pushed to the owner's WebSocket connections like results (issue 13), each task once,
in messages that chain on the completion stream's cursors."""
from __future__ import annotations

import select
import time

from skyfn.push import PushChannel, ws_url
from skyfn.runs import submit_batch
from tests.runs import fns


def test_tasks_of_an_unroutable_chunk_are_pushed_failed(client, offline_endpoint):
    channel = PushChannel(ws_url(client.service_url), client.config.token)
    cursor = channel.connect()
    try:
        batch = submit_batch(client, fns.square, [(i,) for i in range(30)], offline_endpoint, poll_seconds=1)
        seen: dict[str, dict] = {}
        chain = []
        deadline = time.monotonic() + 120
        while len(seen) < 30 and time.monotonic() < deadline:
            if select.select([channel.fileno()], [], [], 1.0)[0]:
                for msg in channel.read() or []:
                    if msg.get("type") != "done":
                        continue
                    chain.append(msg)
                    for st in msg["tasks"]:
                        assert st["task_id"] not in seen, "a task pushed twice"
                        seen[st["task_id"]] = st
    finally:
        channel.close()
    assert set(seen) == set(batch.task_ids)
    assert all(st["state"] == "FAILED" and st["reason"].startswith("not routed: EndpointOffline")
               for st in seen.values())
    ours = [m for m in chain if set(m["ids"]) & set(batch.task_ids)]
    assert ours and all(set(m["ids"]) <= set(batch.task_ids) for m in ours)
    # pushed in cursor order, each naming the entry before it (nothing else finished meanwhile)
    assert [m["prev"] for m in chain] == [cursor] + [m["cursor"] for m in chain[:-1]]
    assert batch.wait(timeout=120)["state"] == "NOT_ROUTED"
