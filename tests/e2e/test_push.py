"""The results push through the real embedded runtime (issue 13): the Executor's WebSocket
connection to the local gateway, killed mid-batch, loses nothing and resolves nothing twice;
the WebSocket API takes the REST API's tokens and nothing else."""
from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time

import pytest


def square_slowly(x):
    import time as _t

    _t.sleep(0.001)
    return x * x


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def test_push_survives_five_connection_kills(client, endpoint_id):
    from skyfn import Executor

    n, kills_wanted = 10_000, 5
    calls = [0] * n
    lock = threading.Lock()
    resolved = [0]
    kills = []

    def counted(i):
        def cb(_fut):
            with lock:
                calls[i] += 1
                resolved[0] += 1
        return cb

    with Executor(endpoint_id=endpoint_id, client=client, push=True) as ex:
        ex.submit(square_slowly, -1).result(timeout=60)  # connected and warm
        assert ex.push_stats["connected"]

        def killer():
            for k in range(kills_wanted):
                # the next kill once a slice of the batch more has resolved and the channel is back
                _wait_for(lambda: resolved[0] >= (k + 1) * n // (kills_wanted + 2), 120)
                _wait_for(lambda: ex._pushed.connected, 30)
                connects = ex.push_stats["connects"]
                ex._pushed.kill()
                kills.append((resolved[0], connects))
                _wait_for(lambda: ex.push_stats["connects"] > connects, 30)

        thread = threading.Thread(target=killer, daemon=True)
        futures = []
        for i in range(n):
            fut = ex.submit(square_slowly, i)
            fut.add_done_callback(counted(i))
            futures.append(fut)
        thread.start()
        values = [f.result(timeout=300) for f in futures]
        thread.join(60)
        stats = ex.push_stats

    print("push stats", stats, "kills at (resolved, connects)", kills)
    assert values == [i * i for i in range(n)]
    assert calls == [1] * n, "a future resolved more than once, or never"
    assert len(kills) == kills_wanted, kills
    assert stats["disconnects"] >= kills_wanted
    assert stats["connects"] >= kills_wanted + 1
    assert stats["pushed_results"] > 0  # the push carried results, not only the fallback


def test_executor_without_push_long_polls(client, endpoint_id):
    from skyfn import Executor

    with Executor(endpoint_id=endpoint_id, client=client, push=False) as ex:
        assert list(ex.map(square_slowly, range(50))) == [i * i for i in range(50)]
        assert ex.push_stats == {}


def _upgrade(port: int, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """A raw WebSocket upgrade request: (HTTP status, what followed the headers)."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Upgrade: websocket", "Connection: Upgrade",
             f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13", *(f"{k}: {v}" for k, v in headers.items())]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 101:
            s.settimeout(2)
            try:
                while chunk := s.recv(4096):
                    rest += chunk
            except OSError:
                pass
        return status, rest


def test_websocket_api_takes_the_rest_tokens_only(client):
    from skyfn.push import PushChannel, PushUnavailable, ws_url

    port = int(client.service_url.rsplit(":", 1)[1])
    assert _upgrade(port, "/ws", {})[0] == 401
    status, body = _upgrade(port, "/ws?token=not-a-token", {})
    assert status == 401 and b"unauthorized" in body
    assert _upgrade(port, "/ws", {"Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.e30.x"})[0] == 401
    assert _upgrade(port, "/elsewhere", {"Authorization": f"Bearer {client.config.token}"})[0] == 404
    assert _upgrade(port, f"/ws?token={client.config.token}", {})[0] == 101

    with pytest.raises(PushUnavailable) as refused:
        PushChannel(ws_url(client.service_url), "forged").connect()
    assert refused.value.status == 401
    channel = PushChannel(ws_url(client.service_url), client.config.token)
    cursor = channel.connect()
    assert "-" in cursor  # a completion-stream position
    channel.send({"action": "nonsense"})
    assert _wait_for(lambda: select_readable(channel), 10)
    msgs = channel.read()
    assert msgs and msgs[0]["type"] == "error"
    channel.close()


def select_readable(channel) -> bool:
    import select

    return bool(select.select([channel.fileno()], [], [], 0)[0])


def test_push_message_chain(client, endpoint_id):
    """Pushed entries chain: each names the one before, as the status cursor does."""
    import select

    from skyfn.protocol.push import cursor_key
    from skyfn.push import PushChannel, ws_url

    channel = PushChannel(ws_url(client.service_url), client.config.token)
    cursor = channel.connect()
    fid = client.register_function(square_slowly)
    ids = [client.run(fid, i, endpoint_id=endpoint_id) for i in range(5)]
    seen: dict[str, dict] = {}
    chain = []
    deadline = time.monotonic() + 60
    while len(seen) < 5 and time.monotonic() < deadline:
        if select.select([channel.fileno()], [], [], 1.0)[0]:
            for msg in channel.read() or []:
                if msg["type"] == "done":
                    chain.append((msg["prev"], msg["cursor"]))
                    for st in msg["tasks"]:
                        seen[st["task_id"]] = st
    channel.close()
    assert set(seen) == set(ids)
    assert all(st["state"] == "SUCCEEDED" for st in seen.values())
    # each entry names the one before it; later entries sort later (completions of other
    # tests' tasks, pushed before this channel subscribed, may sit between two of ours)
    keys = [cursor_key(cursor)] + [cursor_key(c) for _, c in chain]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert all(cursor_key(p) < cursor_key(c) for p, c in chain)
    assert json.dumps(chain)  # plain strings


def test_shutdown_waits_for_pushed_results(client, endpoint_id):
    """shutdown(wait=True) right after submitting: the thread keeps reading pushes until
    every future is done (it once spun without reading)."""
    from skyfn import Executor

    ex = Executor(endpoint_id=endpoint_id, client=client, push=True)
    futures = [ex.submit(square_slowly, i) for i in range(50)]
    ex.shutdown(wait=True)
    assert all(f.done() for f in futures)
    assert [f.result(timeout=0) for f in futures] == [i * i for i in range(50)]
