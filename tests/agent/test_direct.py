"""Direct sessions against a real interchange: real manager and worker processes, an
Outbox sending to a real Redis results stream, and an SDK stand-in that is a real ZeroMQ
DEALER with CurveZMQ client keys, speaking skyfn.protocol.direct with tokens minted by
the service's function (mint_token) over the agent's published session key."""
from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future

import orjson
import pytest
import zmq

from endpoint_agent.config import ConfigError, parse_config
from endpoint_agent.interchange import Interchange
from endpoint_agent.service.outbox import Outbox
from skyfn.protocol import direct as dp
from skyfn.protocol.api import Heartbeat
from skyfn.protocol.messages import TaskPack, TaskSpec
from skyfn.protocol.queues import open_queue
from skyfn.protocol.remote_exception import unwrap_exception
from skyfn.protocol.serialize import deserialize, pack_args, serialize_function
from tests.agent import fns

SQUARE = serialize_function(fns.square)
FAIL = serialize_function(fns.fail)
SLOW = serialize_function(fns.slow)


class SpyTaskQueue:
    """The agent's task queue as the outbox uses it: records what it acks and extends."""

    def __init__(self):
        self.deleted: list[str] = []
        self.extended: list[str] = []

    def extend(self, receipts, visibility_timeout=None):
        self.extended.extend(receipts)

    def delete(self, receipts):
        self.deleted.extend(receipts)


class Rig:
    """An Interchange with direct sessions on, its loop in a thread of its own (the
    interchange's thread), one local manager with two workers, and a real Outbox."""

    def __init__(self, tmp_path, queues, **cfg):
        self.queues = queues
        self.spy = SpyTaskQueue()
        results = open_queue(queues.results_desc, consumer="agent")
        self.outbox = Outbox(self.spy, results, 60.0)
        self.outbox.start()
        config = parse_config({"workers": 2, "managers": 1, "manager_heartbeat_period": 0.5,
                               "direct": {"listen": "127.0.0.1"}, **cfg})
        self.ctx = zmq.Context()
        self.ix = Interchange(config, "ep", self.outbox, ctx=self.ctx, key_dir=tmp_path / "curve")
        self.outbox.on_idle = self.ix.on_outbox_idle
        self.calls: collections.deque = collections.deque()
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self.ix.start_local_managers()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while self.ix.snapshot()["workers"] < 2:
            assert time.monotonic() < deadline, "the manager never registered its workers"
            time.sleep(0.05)

    def _loop(self):
        try:
            while not self._stop.is_set():
                self.ix.step(0.02)
                while self.calls:
                    fn, fut = self.calls.popleft()
                    fut.set_result(fn())
        except BaseException as exc:  # the test fails on it
            self.errors.append(exc)
            raise

    def on_loop(self, fn):
        """Run fn on the interchange's thread; its result."""
        fut: Future = Future()
        self.calls.append((fn, fut))
        self.ix.wake_up()
        return fut.result(timeout=10)

    def close(self):
        self._stop.set()
        self.thread.join(10)
        self.outbox.drain(timeout=10)
        self.outbox.close()
        self.ix.close()
        self.ctx.term()
        assert not self.errors, self.errors


class Sdk:
    """The SDK's end of a session: a CurveZMQ DEALER client of the direct socket."""

    def __init__(self, ix: Interchange | None, ctx: zmq.Context, info: dict | None = None):
        info = info or ix.direct.info()
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        pub, sec = zmq.curve_keypair()
        self.sock.curve_secretkey, self.sock.curve_publickey = sec, pub
        self.sock.curve_serverkey = info["server_key"].encode()
        self.sock.connect(info["address"])
        self.frames: list[list[bytes]] = []

    def submit(self, token: str, tasks: list[TaskSpec], functions: dict[str, str]) -> None:
        pack = {"tasks": [t.model_dump(exclude_none=True) for t in tasks], "functions": functions}
        self.sock.send_multipart([dp.SUBMIT, token.encode(), orjson.dumps(pack)])

    def recv(self, timeout: float = 10.0) -> list[bytes]:
        assert self.sock.poll(timeout * 1000), f"nothing from the agent in {timeout} s"
        frames = self.sock.recv_multipart()
        self.frames.append(frames)
        return frames

    def results(self, task_ids, timeout: float = 30.0) -> dict[str, dict]:
        want, got = set(task_ids), {}
        deadline = time.monotonic() + timeout
        while not want <= got.keys():
            op, body = self.recv(max(0.1, deadline - time.monotonic()))
            assert op == dp.RESULTS, (op, body)
            for rec in orjson.loads(body):
                assert rec["task_id"] not in got, f"two results for {rec['task_id']}"
                got[rec["task_id"]] = rec
        return got

    def refusal(self, timeout: float = 10.0) -> dict:
        op, body = self.recv(timeout)
        assert op == dp.REFUSED, (op, body)
        return orjson.loads(body)

    def close(self):
        self.sock.close(0)


@pytest.fixture
def rig(tmp_path, queues):
    r = Rig(tmp_path, queues)
    yield r
    r.close()


@pytest.fixture
def sdk(rig):
    s = Sdk(rig.ix, rig.ctx)
    yield s
    s.close()


def _token(rig, fns_map=None, *, key=None, endpoint="ep", ttl=60.0, sid="sess-1", owner="alice"):
    fns_map = {"f1": dp.body_digest(SQUARE)} if fns_map is None else fns_map
    token, _ = dp.mint_token(key or rig.ix.direct.session_key, session_id=sid, owner=owner, endpoint_id=endpoint,
                             functions=fns_map, ttl=ttl)
    return token


def _tasks(prefix, n, fid="f1", args=lambda i: (i,)):
    return [TaskSpec(task_id=f"{prefix}{i}", function_id=fid, payload=pack_args(args(i), {})) for i in range(n)]


def _nothing_ran(rig, ids, wait=0.5):
    """No result for any of `ids` reached the results queue, and the interchange holds none."""
    time.sleep(wait)
    rig.queues.drain(wait=0.1)
    assert not set(ids) & rig.queues.by_task.keys()
    held = rig.on_loop(lambda: {t[0] for t in rig.ix.tasks.values()})
    assert not set(ids) & held


def test_tasks_run_and_results_come_back_to_the_sdk_and_the_results_queue(rig, sdk):
    token = _token(rig, {"f1": dp.body_digest(SQUARE), "f2": dp.body_digest(FAIL)})
    tasks = _tasks("a", 3) + [TaskSpec(task_id="boom", function_id="f2", payload=pack_args((7,), {}))]
    sdk.submit(token, tasks, {"f1": SQUARE, "f2": FAIL})
    got = sdk.results([t.task_id for t in tasks])
    for i in range(3):
        r = got[f"a{i}"]
        assert r["state"] == "SUCCEEDED" and deserialize(r["result"]) == i * i
        assert r["session"] == "sess-1" and r["function_id"] == "f1"
        assert [e[0] for e in r["events"]] == ["DISPATCHED", "RUNNING", "DONE"]
    exc = unwrap_exception(got["boom"]["error"])
    assert got["boom"]["state"] == "FAILED" and isinstance(exc, ValueError) and "bad value 7" in str(exc)
    assert got["boom"]["function_id"] == "f2"

    # the same records reach the results queue (validated as ResultPacks), for the service to record
    recorded = rig.queues.collect([t.task_id for t in tasks], timeout=10)
    for tid, recs in recorded.items():
        assert len(recs) == 1 and recs[0]["session"] == "sess-1"
        assert recs[0]["function_id"] == ("f2" if tid == "boom" else "f1")
        assert recs[0]["state"] == got[tid]["state"]

    # no queue message: nothing acknowledged, no lease extended, no RUNNING/LEASE update for them
    rig.on_loop(rig.ix.extend_leases)
    rig.outbox.drain(timeout=5)
    assert rig.spy.deleted == [] and rig.spy.extended == []
    rig.queues.drain(wait=0.2)
    assert not {u["task_id"] for u in rig.queues.updates} & {t.task_id for t in tasks}
    assert rig.ix.direct_packs == {} and rig.ix.load() == 0
    stats = rig.ix.direct.stats()
    assert stats["packs"] == 1 and stats["tasks"] == 4 and stats["refused"] == 0


def test_a_later_pack_may_leave_out_a_body_already_verified(rig, sdk):
    token = _token(rig)
    sdk.submit(token, _tasks("first", 1), {"f1": SQUARE})
    assert deserialize(sdk.results(["first0"])["first0"]["result"]) == 0
    sdk.submit(token, _tasks("again", 2, args=lambda i: (i + 5,)), {})
    got = sdk.results(["again0", "again1"])
    assert [deserialize(got[t]["result"]) for t in ("again0", "again1")] == [25, 36]


def test_200_tasks_in_one_pack_come_back_in_few_frames(rig, sdk):
    tasks = _tasks("b", 200)
    sdk.submit(_token(rig), tasks, {"f1": SQUARE})
    got = sdk.results([t.task_id for t in tasks])
    assert all(deserialize(got[f"b{i}"]["result"]) == i * i for i in range(200))
    assert len(sdk.frames) < 200  # batched per interchange step
    rig.queues.collect([t.task_id for t in tasks], timeout=10)
    assert rig.spy.deleted == []


def test_polled_packs_are_still_acknowledged_and_leased_beside_direct_ones(rig, sdk):
    slow_token = _token(rig, {"s": dp.body_digest(SLOW)})
    sdk.submit(slow_token, [TaskSpec(task_id="d-slow", function_id="s", payload=pack_args((1, 1.0), {}))],
               {"s": SLOW})
    polled = TaskPack(pack_id="p", endpoint_id="ep", functions={"s": SLOW},
                      tasks=[TaskSpec(task_id="q-slow", function_id="s", payload=pack_args((2, 1.0), {}))])
    rig.ix.deliver([("receipt-polled", polled, time.time())], 1)
    deadline = time.monotonic() + 10
    while rig.on_loop(lambda: len(rig.ix.packs)) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    rig.on_loop(rig.ix.extend_leases)
    rig.outbox.drain(timeout=5)
    assert rig.spy.extended == ["receipt-polled"]
    assert deserialize(sdk.results(["d-slow"])["d-slow"]["result"]) == 1
    rig.queues.collect(["d-slow", "q-slow"], timeout=10)
    rig.outbox.drain(timeout=5)
    assert rig.spy.deleted == ["receipt-polled"]
    leased = {u["task_id"] for u in rig.queues.updates if u["state"] == "LEASE"}
    assert leased == {"q-slow"}
    assert "d-slow" not in {u["task_id"] for u in rig.queues.updates}


@pytest.mark.parametrize("case", ["bad_signature", "other_agent", "expired", "wrong_endpoint", "not_in_token",
                                  "digest_mismatch"])
def test_refusals_name_the_tasks_and_run_nothing(rig, sdk, case):
    token, functions, fid = _token(rig), {"f1": SQUARE}, "f1"
    code = {"bad_signature": dp.REFUSE_BAD_TOKEN, "other_agent": dp.REFUSE_BAD_TOKEN, "expired": dp.REFUSE_EXPIRED,
            "wrong_endpoint": dp.REFUSE_WRONG_ENDPOINT, "not_in_token": dp.REFUSE_FUNCTION,
            "digest_mismatch": dp.REFUSE_FUNCTION}[case]
    if case == "bad_signature":
        body, sig = token.split(".")
        token = body + "." + ("A" if sig[0] != "A" else "B") + sig[1:]
    elif case == "other_agent":
        token = _token(rig, key=dp.new_session_key())
    elif case == "expired":
        token = _token(rig, ttl=-1.0)
    elif case == "wrong_endpoint":
        token = _token(rig, endpoint="another-endpoint")
    elif case == "not_in_token":
        fid, functions = "f9", {"f9": SQUARE}
    elif case == "digest_mismatch":
        functions = {"f1": FAIL}
    tasks = _tasks(f"r-{case}-", 3, fid=fid)
    sdk.submit(token, tasks, functions)
    ref = sdk.refusal()
    assert ref["code"] == code and ref["task_ids"] == [t.task_id for t in tasks] and ref["reason"]
    _nothing_ran(rig, [t.task_id for t in tasks])
    assert rig.ix.direct.stats()["refused"] == 1 and rig.ix.direct.stats()["tasks"] == 0


def test_a_cached_token_still_expires(rig, sdk):
    token = _token(rig, ttl=1.0)
    sdk.submit(token, _tasks("c", 1), {"f1": SQUARE})
    sdk.results(["c0"])
    time.sleep(1.1)
    sdk.submit(token, _tasks("late", 1), {})
    ref = sdk.refusal()
    assert ref["code"] == dp.REFUSE_EXPIRED and ref["task_ids"] == ["late0"]


def test_a_missing_body_is_refused(rig, sdk):
    sdk.submit(_token(rig), _tasks("nobody", 2), {})
    ref = sdk.refusal()
    assert ref["code"] == dp.REFUSE_FUNCTION and ref["task_ids"] == ["nobody0", "nobody1"]


def test_malformed_packs_are_refused(rig, sdk):
    token = _token(rig).encode()
    sdk.sock.send_multipart([dp.SUBMIT, token, b"{not json"])
    assert sdk.refusal()["code"] == dp.REFUSE_BAD_PACK
    sdk.sock.send_multipart([dp.SUBMIT, token, orjson.dumps({"tasks": []})])
    assert sdk.refusal()["code"] == dp.REFUSE_BAD_PACK
    sdk.sock.send_multipart([dp.SUBMIT, token, orjson.dumps({"tasks": [{"task_id": "m1", "function_id": "f1"}],
                                                             "functions": {"f1": SQUARE}})])
    ref = sdk.refusal()
    assert ref["code"] == dp.REFUSE_BAD_PACK and ref["task_ids"] == ["m1"] and "payload" in ref["reason"]
    sdk.sock.send_multipart([dp.SUBMIT, token])  # a frame short
    assert sdk.refusal()["code"] == dp.REFUSE_BAD_PACK
    _nothing_ran(rig, ["m1"])


def test_packs_are_refused_while_the_agent_stops(rig, sdk):
    rig.on_loop(lambda: setattr(rig.ix.direct, "taking", False))  # what Agent._drain does
    sdk.submit(_token(rig), _tasks("stopping", 2), {"f1": SQUARE})
    ref = sdk.refusal()
    assert ref["code"] == dp.REFUSE_BAD_TOKEN and "stopping" in ref["reason"] and len(ref["task_ids"]) == 2
    _nothing_ran(rig, ["stopping0", "stopping1"])


def test_ping_pong(rig, sdk):
    sdk.sock.send_multipart([dp.PING])
    op, body = sdk.recv()
    info = orjson.loads(body)
    assert op == dp.PONG and info["load"] == 0 and info["started"] <= time.time()
    assert info["capacity"] == rig.ix.capacity() >= 2 and info["unknown"] == []


def test_a_ping_names_the_asked_tasks_the_agent_does_not_hold(rig, sdk):
    slow = _token(rig, {"s": dp.body_digest(SLOW), "f1": dp.body_digest(SQUARE)})
    sdk.submit(slow, [TaskSpec(task_id="running", function_id="s", payload=pack_args((1, 1.5), {}))], {"s": SLOW})
    sdk.submit(slow, [TaskSpec(task_id="quick", function_id="f1", payload=pack_args((3,), {}))], {"f1": SQUARE})
    assert deserialize(sdk.results(["quick"])["quick"]["result"]) == 9
    # in one message: a pack and then a PING asking about it, the running task, a finished
    # one and one never sent -- the agent holds the first two, replays the finished one's
    # result (its reply may have been lost) and names the one that never arrived
    sdk.submit(slow, [TaskSpec(task_id="same-step", function_id="s", payload=pack_args((2, 0.5), {}))], {})
    sdk.sock.send_multipart([dp.PING, orjson.dumps(["same-step", "running", "quick", "never-sent", 7])])
    replayed = []
    while True:
        op, body = sdk.recv()
        if op == dp.PONG:
            break
        assert op == dp.RESULTS
        replayed += orjson.loads(body)
    info = orjson.loads(body)
    assert [r["task_id"] for r in replayed] == ["quick"] and deserialize(replayed[0]["result"]) == 9
    assert info["unknown"] == [] and info["never"] == ["never-sent"]
    # another SDK (another identity) asking about the same task gets no replay: it is not its task
    other = Sdk(rig.ix, rig.ctx)
    try:
        other.sock.send_multipart([dp.PING, orjson.dumps(["quick"])])
        op, body = other.recv()
        assert op == dp.PONG and orjson.loads(body)["unknown"] == ["quick"]
    finally:
        other.close()
    sdk.sock.send_multipart([dp.PING, b"not json"])  # a bad list asks nothing
    op, body = sdk.recv()
    assert op == dp.PONG and orjson.loads(body)["unknown"] == []
    assert set(sdk.results(["running", "same-step"])) == {"running", "same-step"}


def test_a_client_gone_mid_batch_stalls_nothing(rig, sdk):
    token, _ = dp.mint_token(rig.ix.direct.session_key, session_id="s2", owner="bob", endpoint_id="ep",
                             functions={"s": dp.body_digest(SLOW)}, ttl=60)
    gone = Sdk(rig.ix, rig.ctx)
    ids = [f"g{i}" for i in range(6)]
    gone.submit(token, [TaskSpec(task_id=t, function_id="s", payload=pack_args((i, 0.2), {}))
                        for i, t in enumerate(ids)], {"s": SLOW})
    deadline = time.monotonic() + 10
    while rig.ix.direct.stats()["tasks"] < 6:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    gone.close()
    # the service still gets every result; the SDK's copies are dropped and counted
    recorded = rig.queues.collect(ids, timeout=20)
    assert all(r[0]["session"] == "s2" for r in recorded.values())
    deadline = time.monotonic() + 5
    while rig.ix.direct.stats()["dropped_results"] < 1:
        assert time.monotonic() < deadline, rig.ix.direct.stats()
        time.sleep(0.05)
    # and the loop serves the next SDK at once
    sdk.submit(_token(rig), _tasks("after", 1, args=lambda i: (9,)), {"f1": SQUARE})
    assert deserialize(sdk.results(["after0"], timeout=10)["after0"]["result"]) == 81


def test_the_agents_allowlist_applies_to_direct_tasks(tmp_path, queues):
    rig = Rig(tmp_path, queues, allowed_functions=["0f8fad5b-d9cb-469f-a165-70867728950e"])
    try:
        sdk = Sdk(rig.ix, rig.ctx)
        sdk.submit(_token(rig), _tasks("deny", 1), {"f1": SQUARE})
        r = sdk.results(["deny0"])["deny0"]
        assert r["state"] == "FAILED" and "f1" in r["reason"] and r["session"] == "sess-1"
        sdk.close()
    finally:
        rig.close()


def test_owner_and_name_entries_match_the_names_the_token_carries(tmp_path, queues):
    """An `{owner, name}` allowlist entry lets a direct task run when the service's token
    names that owner and name for its function, as a polled pack's function_meta would;
    another name, or a token that names none, is refused as on the queue path."""
    rig = Rig(tmp_path, queues, allowed_functions=[{"owner": "alice", "name": "square"}])
    try:
        sdk = Sdk(rig.ix, rig.ctx)
        digest = {"f1": dp.body_digest(SQUARE)}
        for prefix, names in (("named", {"f1": ("alice", "square")}), ("other", {"f1": ("bob", "square")}),
                              ("unnamed", None)):
            token, _ = dp.mint_token(rig.ix.direct.session_key, session_id="sess-1", owner="alice",
                                     endpoint_id="ep", functions=digest, ttl=60.0, names=names)
            sdk.submit(token, _tasks(prefix, 2, args=lambda i: (i + 3,)), {"f1": SQUARE})
            got = sdk.results([f"{prefix}0", f"{prefix}1"])
            if prefix == "named":
                assert [deserialize(got[f"named{i}"]["result"]) for i in range(2)] == [9, 16]
                assert {r["state"] for r in got.values()} == {"SUCCEEDED"}
            else:
                assert {r["state"] for r in got.values()} == {"FAILED"}, got
                assert all("allowed_functions" in r["reason"] and "f1" in r["reason"] for r in got.values()), got
        sdk.close()
    finally:
        rig.close()


def test_a_token_whose_names_are_malformed_is_refused():
    key = dp.new_session_key()
    import hashlib
    import hmac

    claims = {"sid": "s", "sub": "alice", "ep": "ep", "exp": time.time() + 60, "fns": {}, "fnm": {"f1": "alice"}}
    body = dp._b64(orjson.dumps(claims))  # signed with the right key, but "fnm" is not [owner, name]
    sig = dp._b64(hmac.new(bytes.fromhex(key), body.encode(), hashlib.sha256).digest())
    with pytest.raises(dp.DirectRefused, match="claims are malformed"):
        dp.verify_token(key, f"{body}.{sig}", "ep")


def test_info_is_what_heartbeats_publish_and_stays_out_of_stats(rig, tmp_path):
    from endpoint_agent.interchange import ensure_server_keys

    info = rig.ix.direct.info()
    hb = Heartbeat(stats={}, direct=info)  # the contract's model accepts it
    assert hb.direct.address == f"tcp://127.0.0.1:{rig.ix.direct.port}"
    assert hb.direct.server_key == ensure_server_keys(tmp_path / "curve")[0].decode()
    assert info["session_key"] not in orjson.dumps(rig.ix.direct.stats()).decode()


@pytest.mark.parametrize("section,expect", [
    ({"listen": "tcp://0.0.0.0"}, "direct.listen"),
    ({"listen": "127.0.0.1:7000"}, "without ':port'"),
    ({"port": 70000}, "direct.port"),
    ({"port": "any"}, "direct.port"),
    ({"advertise": "host name"}, "direct.advertise"),
    ({"lisen": "127.0.0.1"}, "unknown key 'direct.lisen'"),
    ({"reach": "nat"}, "direct.reach"),
    ({"punch_timeout": 0}, "direct.punch_timeout"),
    ("yes", "key 'direct'"),
])
def test_config_errors_name_the_field_and_the_fix(section, expect):
    with pytest.raises(ConfigError) as err:
        parse_config({"direct": section})
    assert expect in str(err.value) and "allowed" in str(err.value)


def test_config_defaults_and_switch():
    assert parse_config({}).direct is None
    assert parse_config({"direct": None}).direct is None
    on = parse_config({"direct": True}).direct
    assert (on.listen, on.port, on.advertise) == ("127.0.0.1", 0, None) and on.advertised_host() == "127.0.0.1"
    assert parse_config({"direct": {"listen": "0.0.0.0", "advertise": "login1"}}).direct.advertised_host() == "login1"


def test_a_port_in_use_is_a_config_error(tmp_path):
    from endpoint_agent.direct.server import DirectServer
    from endpoint_agent.interchange import ensure_server_keys

    ctx = zmq.Context()
    taken = ctx.socket(zmq.REP)
    port = taken.bind_to_random_port("tcp://127.0.0.1")
    try:
        with pytest.raises(ConfigError, match="direct.port"):
            DirectServer(parse_config({"direct": {"port": port}}).direct, "ep", ctx,
                         ensure_server_keys(tmp_path / "curve"))
    finally:
        taken.close(0)
        ctx.term()


def test_a_real_agent_publishes_its_socket_with_the_first_heartbeat_and_keeps_the_key_secret(home, queues):
    from infra.local.processes import free_port
    from tests.agent.conftest import AgentProc
    from tests.agent.test_link import FakeService

    port = free_port()
    svc = FakeService(port, queues)
    svc.start()
    agent = AgentProc(home, "direct-ep", {"workers": 1, "service_url": f"http://127.0.0.1:{port}", "token": "tok",
                                          "heartbeat_period": 30, "receive_wait": 0.5,
                                          "direct": {"listen": "127.0.0.1"}})
    ctx = zmq.Context()
    try:
        agent.start()
        deadline = time.monotonic() + 20
        while not svc.requests:
            assert time.monotonic() < deadline, agent.tail()
            time.sleep(0.01)
        registered = time.monotonic()
        while not [hb for hb in svc.heartbeats() if "direct" in hb[3]]:
            assert time.monotonic() < deadline, agent.tail()
            time.sleep(0.01)
        assert time.monotonic() - registered < 1.0  # sessions can open within a second of the start
        # the heartbeater's first (the next is 30 s later); an earlier one reporting the allowlist
        # before the interchange existed has none
        info = [hb for hb in svc.heartbeats() if "direct" in hb[3]][0][3]["direct"]
        assert info["address"].startswith("tcp://127.0.0.1:")
        sdk = Sdk(None, ctx, info)
        token, _ = dp.mint_token(info["session_key"], session_id="s-real", owner="alice", endpoint_id="ep",
                                 functions={"f1": dp.body_digest(SQUARE)})
        sdk.submit(token, _tasks("real", 2, args=lambda i: (i + 3,)), {"f1": SQUARE})
        got = sdk.results(["real0", "real1"], timeout=30)
        assert [deserialize(got[t]["result"]) for t in ("real0", "real1")] == [9, 16]
        assert queues.collect(["real0", "real1"], timeout=10)["real0"][0]["session"] == "s-real"
        sdk.close()
        status = agent.wait_status(lambda st: (st.get("direct") or {}).get("tasks") == 2)
        assert status["direct"]["address"] == info["address"]
        assert agent.terminate() == 0
        paths = home / "endpoints" / "direct-ep"
        for f in paths.rglob("*"):
            if f.is_file():
                assert info["session_key"].encode() not in f.read_bytes(), f"the session key is in {f}"
    finally:
        agent.kill()
        svc.stop()
        ctx.term()


def test_the_embedded_runtime_turns_direct_on_for_its_endpoint(tmp_path):
    from endpoint_agent.config import load_config
    from infra.local.agent import ensure_direct

    config = tmp_path / "endpoints" / "local" / "config.yaml"
    ensure_direct("local", tmp_path)  # no config yet: the template, with direct on
    ensure_direct("local", tmp_path)  # once only
    assert config.read_text().count("\ndirect:") == 1
    on = load_config(config).direct
    assert on is not None and on.listen == "127.0.0.1"
    config.write_text("workers: 2\ndirect: null\n")  # an owner's choice is kept
    ensure_direct("local", tmp_path)
    assert load_config(config).direct is None


def test_a_large_result_goes_inline_to_the_sdk_and_by_reference_to_the_service(rig, sdk, aws_endpoint, unique):
    import boto3

    from skyfn.data.connectors.s3 import S3Connector
    from skyfn.protocol import blobs

    bucket = f"results-{unique}"
    boto3.client("s3", endpoint_url=aws_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    s3 = S3Connector(bucket, prefix="", endpoint_url=aws_endpoint)
    form = dict(s3.presign_prefix_upload("results/ep/", blobs.MAX_BLOB_BYTES, 600), prefix="results/ep/")

    def give_form():  # as a polled pack's result_upload would
        rig.ix.result_upload = form
    rig.on_loop(give_form)
    body = serialize_function(fns.big)
    n = blobs.INLINE_BYTES + 1000
    sdk.submit(_token(rig, {"b": dp.body_digest(body)}),
               [TaskSpec(task_id="large", function_id="b", payload=pack_args((n,), {}))], {"b": body})
    got = sdk.results(["large"])["large"]
    assert got["state"] == "SUCCEEDED" and deserialize(got["result"]) == "r" * n
    [rec] = rig.queues.collect(["large"], timeout=10)["large"]
    assert rec["result"] == blobs.make_ref("results/ep/large") and rec["session"] == "sess-1"
    assert "_sdk_result" not in rec
    assert deserialize(s3.get("results/ep/large").decode()) == "r" * n
