"""How long results are kept, on the real embedded runtime: a WebSocket connection
subscribed with peek receives the pushes without consuming the results they carry (the
local gateway's hub marks them retrieved only when a connection without peek got them), and
a SUCCEEDED task whose result was purged makes get_result / get_batch_result raise
ResultExpired, naming the task, when it finished, the retention and what to do."""
from __future__ import annotations

import re
import select
import time

from skyfn.push import PushChannel, ws_url


def triple(x):
    return 3 * x


def _pushed(channels, ids, timeout: float = 60.0) -> list[dict[str, dict]]:
    """Per channel, the statuses pushed inline for `ids`, once each channel has them all."""
    seen: list[dict[str, dict]] = [{} for _ in channels]
    deadline = time.monotonic() + timeout
    while any(not set(ids) <= set(s) for s in seen) and time.monotonic() < deadline:
        for ch, got in zip(channels, seen):
            if select.select([ch.fileno()], [], [], 0.2)[0]:
                for msg in ch.read() or []:
                    if msg.get("type") == "done":
                        got.update({st["task_id"]: st for st in msg["tasks"]})
    return seen


def test_a_peek_subscription_gets_the_pushes_without_consuming_results(client, endpoint_id, hot_store):
    url = ws_url(client.service_url)
    watcher = PushChannel(url, client.config.token, peek=True)
    watcher.connect()
    consumer = None
    try:
        fid = client.register_function(triple)
        batch = client.create_batch(endpoint_id)
        for i in range(6):
            batch.add(fid, i)
        first = client.batch_run(batch)
        (seen,) = _pushed([watcher], first)
        assert {tid: st["state"] for tid, st in seen.items() if tid in first} == {tid: "SUCCEEDED" for tid in first}
        assert all("result" in seen[tid] for tid in first)  # the same pushes, results inline

        # a consuming connection (the Executor's: no peek) joins; its deliveries mark
        consumer = PushChannel(url, client.config.token)
        consumer.connect()
        second = [client.run(fid, 10, endpoint_id=endpoint_id)]
        pushed = _pushed([watcher, consumer], second)
        assert all(got[second[0]]["state"] == "SUCCEEDED" for got in pushed)
        deadline = time.monotonic() + 10
        while hot_store.consumed(second) != second and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hot_store.consumed(second) == second
        # the hub handles pushes in order: the first batch's went by long ago, unmarked
        assert hot_store.consumed(first) == []
        answer = client.get_batch_result(first)
        assert [answer[tid]["result"] for tid in first] == [3 * i for i in range(6)]
        assert hot_store.consumed(first) == first  # the real read consumes
    finally:
        watcher.close()
        if consumer is not None:
            consumer.close()


def test_peek_must_be_a_boolean(client):
    channel = PushChannel(ws_url(client.service_url), client.config.token)
    try:
        channel.connect()
        channel.send({"action": "subscribe", "peek": "yes"})
        assert select.select([channel.fileno()], [], [], 10)[0]
        assert channel.read() == [{"type": "error", "message": '"peek" must be true or false'}]
    finally:
        channel.close()


def test_a_purged_success_raises_result_expired(client, endpoint_id, hot_store):
    from skyfn import ResultExpired

    fid = client.register_function(triple)
    tid = client.run(fid, 14, endpoint_id=endpoint_id)
    assert client.get_result(tid, timeout=60) == 42  # read: purged SKYFN_RESULT_TTL (600 s) from now
    finished = next(ts for state, ts in client.status([tid], include_events=True)["tasks"][tid]["events"]
                    if state == "SUCCEEDED")
    deadline = time.monotonic() + 30  # the runtime's history drain archives it, then Redis may expire it
    while hot_store.r.hget(f"t:{tid}", "h") is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert 0 < hot_store.r.ttl(f"t:{tid}") <= 600, "archived and read: its record expires 600 s after the read"
    hot_store.r.pexpire(f"t:{tid}", 1)  # as if the 600 s had passed
    time.sleep(0.05)
    assert not hot_store.r.exists(f"t:{tid}"), "Redis did not expire the task"

    try:
        client.get_result(tid, timeout=10)
    except ResultExpired as exc:
        err = exc
    else:
        raise AssertionError("get_result of a purged success returned instead of raising")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(finished))
    assert re.sub(r"\(\d+ s ago\)", "(N s ago)", str(err)) == (
        f"task {tid} SUCCEEDED at {stamp} (N s ago), but its result is no longer kept: the service keeps a "
        "result SKYFN_RESULT_TTL=600 s (10 min) after it is first read (a status read, get_result, an Executor "
        "future, or a push delivered to one of your connections), or SKYFN_UNRETRIEVED_TTL=604800 s (7 days) if "
        "it is never read. Collect results sooner after they finish, or have the function return large or "
        "long-lived results by reference (skyfn.data.default_store().ref(value, ttl=...), or S3) and keep the ref.")
    assert err.task_id == tid and err.finished == finished

    entry = client.get_batch_result([tid])[tid]
    assert entry["state"] == "SUCCEEDED" and not entry["pending"] and "result" not in entry
    assert isinstance(entry["exception"], ResultExpired) and str(entry["exception"]).startswith(f"task {tid} ")
    st = client.status([tid])["tasks"][tid]
    assert st["result_expired"]["result_ttl"] == 600 and "result" not in st
