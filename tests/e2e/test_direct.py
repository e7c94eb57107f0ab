"""Direct sessions through the real embedded runtime: the Executor talks to the agent's
interchange over CurveZMQ with a token the service signed, each result comes straight
back, the service records every task, and when the agent dies mid-batch the tasks in
flight go through the service instead -- every future resolves exactly once."""
from __future__ import annotations

import threading
import time

import pytest

from skyfn import Client, Executor
from skyfn.http import SkyfnAPIError
from tests.e2e.agent_kill import kill_and_restart, wait_under_way


@pytest.fixture(autouse=True)
def live_channel(local_home, client, endpoint_id):
    """The service hands out the running agent's socket (not one of an agent that an
    earlier test killed and restarted, before the new one's first heartbeat)."""
    import json

    status = local_home / "endpoints" / "local" / "status.json"
    fid = client.register_function(square)
    deadline = time.monotonic() + 30
    while True:
        try:
            live = json.loads(status.read_text())["direct"]["address"]
            if client.open_session(endpoint_id, [fid])["address"] == live:
                return
        except (OSError, ValueError, KeyError, TypeError, SkyfnAPIError):
            pass
        assert time.monotonic() < deadline, "the agent's direct socket was never published"
        time.sleep(0.1)


def square(x):
    return x * x


def fail_on(x):
    if x == 3:
        raise ValueError(f"bad input {x}")
    return x


def slow_square(x):
    import time as _t

    _t.sleep(0.002)
    return x * x


def _counted(futures) -> dict[int, int]:
    calls: dict[int, int] = {}
    lock = threading.Lock()

    def on_done(i):
        def cb(_fut):
            with lock:
                calls[i] = calls.get(i, 0) + 1
        return cb

    for i, f in enumerate(futures):
        f.add_done_callback(on_done(i))
    return calls


def test_direct_session_runs_tasks_and_the_service_records_them(client, endpoint_id):
    with Executor(endpoint_id=endpoint_id, client=client, direct=True) as ex:
        futures = [ex.submit(fail_on, i) for i in range(8)]
        values = []
        for f in futures:
            try:
                values.append(f.result(timeout=60))
            except ValueError as exc:
                values.append(str(exc))
        stats = ex.direct_stats
    assert values == [0, 1, 2, "bad input 3", 4, 5, 6, 7]
    assert stats["active"] and stats["why_not"] is None
    assert stats["tasks"] == 8 and stats["results"] == 8 and stats["to_service"] == 0 and stats["sessions"] >= 1
    # the service recorded each task from the agent's report, owner and all
    ids = [f.task_id for f in futures]
    deadline = time.monotonic() + 30
    while True:
        st = client.status(ids, include_events=True)["tasks"]
        if len(st) == 8 and all(t["state"] in ("SUCCEEDED", "FAILED") for t in st.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert [st[t]["state"] for t in ids] == ["SUCCEEDED"] * 3 + ["FAILED"] + ["SUCCEEDED"] * 4
    info = client.get_task(ids[5])
    assert info["state"] == "SUCCEEDED" and info["endpoint_id"] == endpoint_id
    assert client.get_result(ids[5], timeout=5) == 5
    events = [e[0] for e in info["events"]]
    assert events[:4] == ["CREATED", "QUEUED", "DISPATCHED", "RUNNING"] and "SUCCEEDED" in events


def test_direct_batch_of_10000_resolves_each_future_once(client, endpoint_id):
    n = 10_000
    with Executor(endpoint_id=endpoint_id, client=client, direct=True) as ex:
        futures = [ex.submit(square, i) for i in range(n)]
        calls = _counted(futures)
        assert [f.result(timeout=120) for f in futures] == [i * i for i in range(n)]
        stats = ex.direct_stats
        # the window: the agent never held more than twice its capacity (>= 2000) of them at once
        assert 0 < stats["peak_in_flight"] <= ex._direct._window == 2000, (stats["peak_in_flight"], ex._direct._window)
    assert stats["tasks"] == n and stats["results"] == n and stats["to_service"] == 0
    time.sleep(0.2)
    assert len(calls) == n and set(calls.values()) == {1}


def test_a_direct_batch_shows_a_progress_bar(client, endpoint_id):
    import io

    out = io.StringIO()
    with Executor(endpoint_id=endpoint_id, client=client, direct=True, progress=out) as ex:
        assert list(ex.map(square, range(50))) == [i * i for i in range(50)]
        assert ex.direct_stats["results"] == 50
    assert "50/50" in out.getvalue()


def test_direct_session_needs_a_plain_executor(client, endpoint_id):
    with Executor(endpoint_id=endpoint_id, client=client, direct=True, memoize=True) as ex:
        assert ex.direct_stats == {}
        assert "cache" in ex.direct_why_not
        assert ex.submit(square, 7).result(timeout=60) == 49
    with Executor(endpoint_id=endpoint_id, client=client) as ex:  # off unless asked for
        assert ex.direct_stats == {} and ex.direct_why_not is None


def test_sessions_are_refused_without_a_token_and_for_unknown_functions(local_home, client, endpoint_id):
    fid = client.register_function(square)
    opened = client.open_session(endpoint_id, [fid])
    assert opened["endpoint_id"] == endpoint_id and opened["address"].startswith("tcp://127.0.0.1:")
    assert opened["expires_at"] > time.time() + 60
    with Client(token="not-a-token") as stranger, pytest.raises(SkyfnAPIError) as err:
        stranger.open_session(endpoint_id, [fid])
    assert err.value.status == 401
    with pytest.raises(SkyfnAPIError) as err:
        client.open_session(endpoint_id, ["00000000-0000-4000-8000-000000000000"])
    assert err.value.status == 404


def sleepy(x):
    import time as _t

    _t.sleep(1.0)
    return x + 1


def test_a_reply_lost_while_the_connection_was_down_is_settled_from_the_service(client, endpoint_id):
    with Executor(endpoint_id=endpoint_id, client=client, direct=True) as ex:
        assert ex.submit(square, 2).result(timeout=60) == 4  # session open, connected
        fut = ex.submit(sleepy, 41)
        deadline = time.monotonic() + 10
        while ex.direct_stats["tasks"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        ex._direct.drop_connection()  # a new identity: the agent's reply goes to the one gone
        assert fut.result(timeout=60) == 42
        stats = ex.direct_stats
    assert stats["settled"] == 1 and stats["to_service"] == 0 and stats["lost"] == 0, stats


def test_agent_killed_mid_batch_loses_nothing(local_home, client, endpoint_id):
    n = 2000
    with Executor(endpoint_id=endpoint_id, client=client, direct=True, direct_timeout=2.0) as ex:
        futures = [ex.submit(slow_square, i) for i in range(n)]
        calls = _counted(futures)
        wait_under_way(futures)
        kill_and_restart(local_home)
        assert [f.result(timeout=180) for f in futures] == [i * i for i in range(n)]
        stats = ex.direct_stats
    assert stats["lost"] >= 1 and stats["to_service"] >= 1, stats
    assert stats["results"] + stats["to_service"] >= n
    time.sleep(0.2)
    assert len(calls) == n and set(calls.values()) == {1}
    # the service knows at least every task it was handed after the loss, all SUCCEEDED
    ids = [f.task_id for f in futures]
    states = []
    for chunk in range(0, n, 500):
        states += [t["state"] for t in client.status(ids[chunk:chunk + 500])["tasks"].values()]
    assert set(states) == {"SUCCEEDED"} and len(states) >= stats["to_service"]


def test_a_killed_agent_is_noticed_on_the_socket_not_by_waiting_for_silence(local_home, client, endpoint_id):
    """With `direct_timeout` far beyond the test's patience, only the socket's monitor (the
    agent's address refusing the reconnection) can hand the tasks in flight to the service
    in time; the next session, after the restarted agent published its socket, is direct."""
    n = 600
    with Executor(endpoint_id=endpoint_id, client=client, direct=True, direct_timeout=600.0) as ex:
        futures = [ex.submit(slow_square, i) for i in range(n)]
        calls = _counted(futures)
        wait_under_way(futures, done=100)
        kill_and_restart(local_home)
        t0 = time.monotonic()
        assert [f.result(timeout=60) for f in futures] == [i * i for i in range(n)]
        recovered_s = time.monotonic() - t0
        stats = ex.direct_stats
        assert stats["lost"] >= 1 and stats["to_service"] >= 1, stats
        assert "accepts connections" in stats["last_loss"] or "handshake" in stats["last_loss"], stats
        # a new session once the restarted agent's heartbeat published its new socket
        deadline = time.monotonic() + 60
        while True:
            before = ex.direct_stats["results"]
            assert ex.submit(square, 5).result(timeout=60) == 25
            if ex.direct_stats["results"] > before:
                break
            assert time.monotonic() < deadline, ex.direct_stats
            time.sleep(0.5)
    assert recovered_s < 60
    time.sleep(0.2)
    assert len(calls) == n and set(calls.values()) == {1}


def test_a_handshake_the_agent_refuses_hands_the_tasks_to_the_service(client, endpoint_id):
    """Reconnecting with a key that is not the agent's (as to an agent restarted on the same
    port) fails the CurveZMQ handshake: seen at once on the monitor, nothing waits for silence."""
    import zmq

    with Executor(endpoint_id=endpoint_id, client=client, direct=True, direct_timeout=600.0) as ex:
        assert ex.submit(square, 2).result(timeout=60) == 4
        ex._direct._session["server_key"] = zmq.curve_keypair()[0].decode()  # not the agent's
        ex._direct.drop_connection()
        deadline = time.monotonic() + 30
        while ex.direct_stats["lost"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        stats = ex.direct_stats
        assert stats["lost"] == 1 and "refused the session's handshake" in stats["last_loss"], stats
        assert list(ex.map(square, range(50), timeout=60)) == [i * i for i in range(50)]
        stats = ex.direct_stats
    assert stats["to_service"] == 50 and stats["results"] == 1, stats


def test_an_idle_session_is_not_taken_for_a_lost_agent(client, endpoint_id):
    with Executor(endpoint_id=endpoint_id, client=client, direct=True, direct_timeout=2.0) as ex:
        assert ex.submit(square, 3).result(timeout=60) == 9
        time.sleep(3.0)  # idle for longer than direct_timeout
        assert ex.submit(square, 4).result(timeout=60) == 16
        stats = ex.direct_stats
    assert stats["lost"] == 0 and stats["to_service"] == 0 and stats["results"] == 2, stats


def test_a_refused_token_gets_a_new_session_and_one_resend(client, endpoint_id):
    from skyfn.protocol.direct import mint_token, new_session_key

    with Executor(endpoint_id=endpoint_id, client=client, direct=True) as ex:
        assert ex.submit(square, 5).result(timeout=60) == 25
        session = ex._direct._session
        # a token the agent cannot verify, as after its restart on the same port
        session["token"], _ = mint_token(new_session_key(), session_id=session["session_id"], owner="x",
                                         endpoint_id=endpoint_id, functions={})
        # one hand-over (map), so one pack carries all five on the bad token, however busy the machine
        assert list(ex.map(square, range(5), timeout=60)) == [0, 1, 4, 9, 16]
        stats = ex.direct_stats
    assert stats["refused"] == 5 and stats["sessions"] >= 2 and stats["to_service"] == 0 and stats["results"] == 6


def test_an_endpoint_without_a_direct_socket_gets_its_tasks_through_the_service(client):
    bare = client._http.post("/endpoints", {"name": "no-direct"})["endpoint_id"]  # no agent: nothing published
    with Executor(endpoint_id=bare, client=client, direct=True) as ex:
        fut = ex.submit(square, 6)
        deadline = time.monotonic() + 30
        while not fut.task_id and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = ex.direct_stats
        assert stats["session_failures"] == 1 and stats["to_service"] == 1 and stats["tasks"] == 0, stats
        assert not stats["active"] and "takes no direct sessions" in stats["why_not"]
        assert client.get_task(fut.task_id)["state"] == "QUEUED"  # waiting at the service for an agent
        ex.shutdown(wait=True, cancel_futures=True)
    assert fut.cancelled()


def size_of(x):
    return len(x)


def test_a_very_large_argument_goes_through_the_service(client, endpoint_id):
    big = "z" * (9 << 20)  # above MAX_DIRECT_PAYLOAD (8 MiB): through the service and S3
    with Executor(endpoint_id=endpoint_id, client=client, direct=True, data_store=None) as ex:
        small, large = ex.submit(size_of, "abc"), ex.submit(size_of, big)
        assert (small.result(timeout=60), large.result(timeout=120)) == (3, len(big))
        stats = ex.direct_stats
    assert stats["tasks"] == 1 and stats["to_service"] == 1, stats
