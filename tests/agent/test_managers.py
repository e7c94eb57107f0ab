"""Many managers, CurveZMQ, lost managers, routing, cancel, output capture and GPUs:
real agent, manager and worker processes, real ZeroMQ, real redis-server."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime

import pytest
import zmq

from endpoint_agent import wire
from endpoint_agent.config import EndpointConfig
from endpoint_agent.interchange import Interchange
from skyfn.protocol.messages import TaskPack, TaskSpec
from skyfn.protocol.serialize import deserialize, pack_args, serialize_function
from tests.agent import fns
from tests.agent.conftest import ROOT


def _one(results):
    dup = {t: len(r) for t, r in results.items() if len(r) != 1}
    assert not dup, f"tasks with more than one result: {dup}"
    return {t: r[0] for t, r in results.items()}


def _start_manager(status, block, workers=2, heartbeat=0.5, server_key=True, identity=None):
    port = status["interchange"].rsplit(":", 1)[1]
    cmd = [sys.executable, "-m", "endpoint_agent.manager", "--interchange", f"tcp://127.0.0.1:{port}",
           "--block", block, "--workers", str(workers), "--heartbeat", str(heartbeat)]
    if server_key:
        cmd += ["--server-key", status["server_key"]]
    if identity:
        cmd += ["--identity", identity]
    return subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _log_time(line: str) -> float:
    m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})", line)
    assert m, line
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000


def test_two_managers_one_remote_over_curve_share_a_batch_and_survive_a_sigkill(queues, agent_factory):
    hb = 0.5
    agent = agent_factory(interchange_address="0.0.0.0", manager_heartbeat_period=hb, max_task_retries=2)
    agent.start(wait_workers=2)
    st = agent.status()
    assert st["encrypted"] and st["server_key"], st  # non-loopback: CurveZMQ by default
    remote = _start_manager(st, "b1", identity="remote-1")
    try:
        st = agent.wait_status(lambda s: len(s.get("managers") or []) == 2 and len(s.get("worker_pids") or []) == 4)
        assert {m["block"] for m in st["managers"]} == {"local", "b1"}
        remote_workers = set(next(m for m in st["managers"] if m["block"] == "b1")["worker_pids"])
        ids = queues.push(fns.whoami, [(i, 0.02) for i in range(400)], prefix="share", pack_size=50)
        # until both managers' workers have answered (a loaded machine can give the first
        # hundred all to the manager that connected first), at most 250 of the 400
        deadline = time.monotonic() + 30
        used_before: set = set()
        while len(queues.by_task) < 250 and time.monotonic() < deadline:
            queues.drain(wait=0.05)
            used_before = {deserialize(r[0]["result"])[1] for r in queues.by_task.values()}
            if used_before & remote_workers and used_before - remote_workers and len(queues.by_task) >= 50:
                break
        assert used_before & remote_workers, "the remote manager took no task"
        assert used_before - remote_workers, "the local manager took no task"
        t_kill = time.time()
        os.killpg(remote.pid, signal.SIGKILL)  # the manager and its workers, mid-batch
        results = _one(queues.collect(ids, timeout=60))
        for i, tid in enumerate(ids):
            assert results[tid]["state"] == "SUCCEEDED", results[tid]
            assert deserialize(results[tid]["result"])[0] == i
        lost = [ln for ln in agent.tail(400).splitlines() if "manager remote-1" in ln and " lost: " in ln]
        assert lost, agent.tail(60)
        detected = _log_time(lost[0]) - t_kill
        assert detected <= 2 * hb + 0.35, f"lost manager detected after {detected:.2f} s"
        st = agent.wait_status(lambda s: s.get("managers_lost", 0) >= 1)
        assert [m["block"] for m in st["managers"]] == ["local"]
        time.sleep(0.3)
        assert queues.drain() == 0  # no late duplicates
    finally:
        if remote.poll() is None:
            os.killpg(remote.pid, signal.SIGKILL)
        remote.wait(5)


class _NullOutbox:
    def __init__(self):
        self.bodies, self.acks = [], []

    def put(self, bodies=(), acks=(), extend=()):
        self.bodies.extend(bodies)
        self.acks.extend(acks)

    def idle(self):
        return True


def _ix(tmp_path, **cfg):
    config = EndpointConfig(workers=1, managers=0, manager_heartbeat_period=0.5, **cfg)
    return Interchange(config, "ep", _NullOutbox(), ctx=zmq.Context(), key_dir=tmp_path / "curve")


def _fake_manager(ctx, ix, identity, server_key=None, **reg):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.IDENTITY, identity.encode())
    s.setsockopt(zmq.LINGER, 0)
    # a plaintext client of a Curve server may never get a connection: never block on it
    s.setsockopt(zmq.SNDTIMEO, 2000)
    if server_key:
        pub, sec = zmq.curve_keypair()
        s.curve_secretkey, s.curve_publickey, s.curve_serverkey = sec, pub, server_key.encode()
    s.connect(ix.address)
    info = {"pid": 1, "hostname": identity, "block": "b", "workers": 2, "capacity": 4, "cores": 2,
            "accelerators": [], "warm": {}, "containers": {}, "cold_starts": 0}
    info.update(reg)
    try:
        s.send_multipart([wire.REG, wire.dumps(info)])
    except zmq.Again:
        if server_key:  # an encrypted client must get through
            raise
    return s


def _spin(ix, seconds, until=None):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ix.step(0.02)
        if until is not None and until():
            return True
    return False


def _recv_all(sock, timeout=0.5):
    out = []
    while sock.poll(timeout * 1000):
        out.append(sock.recv_multipart())
        timeout = 0.05
    return out


def test_curve_server_ignores_a_plaintext_client(tmp_path):
    ix = _ix(tmp_path, interchange_address="0.0.0.0")
    assert ix.server_key  # on by default off loopback
    ctx = zmq.Context()
    try:
        plain = _fake_manager(ctx, ix, "plain")
        assert not _spin(ix, 1.0, until=lambda: ix.snapshot()["managers"])
        assert plain.poll(100) == 0  # nothing comes back either
        good = _fake_manager(ctx, ix, "curvy", server_key=ix.server_key)
        assert _spin(ix, 3.0, until=lambda: ix.snapshot()["managers"])
        assert [m["id"] for m in ix.snapshot()["managers"]] == ["curvy"]
        # the key pair is kept in the endpoint directory, secret key private
        assert (tmp_path / "curve" / "server.key_secret").stat().st_mode & 0o077 == 0
        plain.close()
        good.close()
    finally:
        ix.close()
        ctx.term()
    assert not _ix(tmp_path).server_key  # loopback: no encryption by default
    assert _ix(tmp_path, encryption="on").server_key


def _pack(tasks, fn=fns.square):
    body = serialize_function(fn)
    specs = [TaskSpec(task_id=tid, function_id="f1", payload=pack_args((1,), {}), **kw) for tid, kw in tasks]
    return TaskPack(pack_id="p", endpoint_id="ep", functions={"f1": body}, tasks=specs)


def test_warming_aware_routing_snapshot_and_drain(tmp_path):
    ix = _ix(tmp_path)
    ctx = zmq.Context()
    try:
        cold = _fake_manager(ctx, ix, "cold", block="b1", workers=4)
        warm = _fake_manager(ctx, ix, "warm", block="b2", workers=2, warm={"sci": 1}, containers={"sci": 1})
        gpu = _fake_manager(ctx, ix, "gpu", block="b3", workers=1, accelerators=["0", "1"])
        for s in (cold, warm, gpu):
            s.send_multipart([wire.REQ, wire.dumps(10)])
        assert _spin(ix, 2.0, until=lambda: len(ix.snapshot()["managers"]) == 3 and
                     all(m.credit for m in ix.managers.values()))
        ix.deliver([("r1", _pack([("c1", {"container": "sci"}), ("p1", {}), ("g1", {"resources": {"gpus": 2}}),
                                  ("huge", {"resources": {"gpus": 8}})]), time.time())], 4)
        _spin(ix, 0.3)
        got = {}
        for name, s in (("cold", cold), ("warm", warm), ("gpu", gpu)):
            for op, body in _recv_all(s, 0.2):
                if op == wire.TASKS:
                    got.setdefault(name, []).extend(t[0] for t in wire.loads(body)["t"])
        by_id = {ix.tasks[k][0]: name for name, keys in got.items() for k in keys}
        assert by_id["c1"] == "warm"          # idle warm container of its type
        assert by_id["p1"] == "cold"          # plain: most free workers
        assert by_id["g1"] == "gpu"           # the only node with 2 GPUs
        assert "huge" not in by_id
        failed = [r for b in ix.outbox.bodies for r in wire.loads(b)["results"]]
        assert [r["task_id"] for r in failed] == ["huge"] and "8 GPU(s)" in failed[0]["reason"]

        snap = ix.snapshot()
        assert snap["pending"] == 0 and snap["workers"] == 7
        m = {x["id"]: x for x in snap["managers"]}
        assert m["warm"]["warm"] == {"sci": 0} and m["warm"]["block"] == "b2"
        assert set(m["cold"]) >= {"id", "block", "workers", "free_workers", "running", "warm", "last_heartbeat"}
        bs = ix.block_snapshot()
        assert bs["blocks"]["b1"]["tasks"] == 1 and bs["blocks"]["b1"]["managers"] == 1

        ix.drain_block("b1")
        _spin(ix, 0.2)
        assert [op for op, _ in _recv_all(cold, 0.2)] == [wire.DRAIN]
        cold.send_multipart([wire.BACK, wire.dumps(got["cold"])])  # gives the unstarted task back
        cold.send_multipart([wire.BYE, b""])
        assert _spin(ix, 2.0, until=lambda: "cold" not in {x["id"] for x in ix.snapshot()["managers"]})
        _spin(ix, 0.2)
        regot = [t[0] for op, body in _recv_all(warm, 0.3) if op == wire.TASKS for t in wire.loads(body)["t"]]
        assert regot and ix.tasks[regot[0]][0] == "p1"   # re-dispatched elsewhere, not lost
        for s in (cold, warm, gpu):
            s.close()
    finally:
        ix.close()
        ctx.term()


def test_cancel_kills_a_running_task_and_spares_the_others(queues, agent_factory):
    agent = agent_factory().start(wait_workers=2)
    before = set(agent.status()["worker_pids"])
    ids = queues.push(fns.slow, [(i, 30.0 if i == 0 else 1.0) for i in range(2)], prefix="cx", pack_size=1)
    queues.wait_running(ids)
    queues.cancel([ids[0]])
    later = queues.push(fns.square, [(i,) for i in range(20)], prefix="after", function_id="f2")
    results = queues.collect([ids[1]] + later, timeout=20)
    assert all(r[0]["state"] == "SUCCEEDED" for r in results.values())
    st = agent.wait_status(lambda s: s.get("cancelled") == 1 and len(s.get("worker_pids") or []) == 2
                           and len(set(s["worker_pids"]) - before) == 1)
    assert st["in_flight"] == 0
    # the cancelled task never gets a result, and its pack is acked anyway
    deadline = time.monotonic() + 5
    while (queues.tasks.depth() or queues.leases()) and time.monotonic() < deadline:
        queues.drain(wait=0.1)
    assert queues.tasks.depth() == 0
    assert ids[0] not in queues.by_task
    # a cancel that arrives before its task: the task is dropped on arrival
    ids2, bodies, groups = queues.build(fns.slow, [(0, 30.0)], prefix="early")
    queues.cancel(ids2)
    time.sleep(1.0)
    queues.send(bodies, groups)
    agent.wait_status(lambda s: s.get("cancelled") == 2)
    assert ids2[0] not in queues.by_task


def test_stdout_stderr_captured_and_capped(queues, agent_factory):
    agent_factory(max_output_bytes=100).start(wait_workers=2)
    small = queues.push(fns.chatty, [(1, 2, 1)], prefix="small")
    big = queues.push(fns.chatty, [(2, 1000, 1000)], prefix="big")
    quiet = queues.push(fns.square, [(3,)], prefix="quiet", function_id="f2")
    r = _one(queues.collect(small + big + quiet, timeout=20))
    assert r[small[0]]["stdout"] == "outout" and r[small[0]]["stderr"] == "err"
    out, err = r[big[0]]["stdout"], r[big[0]]["stderr"]
    assert out.startswith("out" * 33) and "truncated" in out and "2900 more characters" in out
    assert err.startswith("err" * 33) and "truncated" in err and len(err) < 200
    assert r[quiet[0]].get("stdout") is None and r[quiet[0]].get("stderr") is None


def test_gpu_assignment_sets_cuda_visible_devices(queues, agent_factory):
    agent_factory(workers=3, accelerators=["0", "1"], cores=4).start(wait_workers=3)
    two = queues.push(fns.gpu_env, [(i, 1.0) for i in range(2)], prefix="g1", resources={"gpus": 1, "cores": 2},
                      pack_size=2)
    both = queues.push(fns.gpu_env, [(9,)], prefix="g2", resources={"gpus": 2}, function_id="f2")
    plain = queues.push(fns.gpu_env, [(5,)], prefix="plain", function_id="f3")
    toomuch = queues.push(fns.gpu_env, [(0,)], prefix="big", resources={"gpus": 3}, function_id="f4")
    r = _one(queues.collect(two + both + plain + toomuch, timeout=30))
    got = [deserialize(r[t]["result"]) for t in two]
    assert sorted(g[1] for g in got) == ["0", "1"]        # one accelerator each, never the same
    assert {g[2] for g in got} == {"2"}                    # OMP_NUM_THREADS = cores
    g2 = deserialize(r[both[0]]["result"])
    assert sorted(g2[1].split(",")) == ["0", "1"]
    assert deserialize(r[plain[0]]["result"])[1] is None   # plain tasks see no assignment
    assert r[toomuch[0]]["state"] == "FAILED" and "3 GPU(s)" in r[toomuch[0]]["reason"]


@pytest.mark.parametrize("workers", [2])
def test_manager_command_line_is_stable(workers):
    from endpoint_agent.manager.manager import build_parser

    args = build_parser().parse_args(["--interchange", "tcp://h:1", "--block", "b7", "--workers", str(workers),
                                      "--server-key", "K" * 40])
    assert (args.interchange, args.block, args.workers, args.server_key) == ("tcp://h:1", "b7", workers, "K" * 40)


def test_container_tasks_run_in_warm_bubblewrap_workers(queues, agent_factory):
    import shutil

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    agent = agent_factory(workers=2, containers={"runtime": "bubblewrap", "idle_timeout": 60,
                                                 "types": {"fn0": {"image": "host"}, "fn1": {"image": "host"}}})
    agent.start(wait_workers=2)
    a = queues.push(fns.whoami, [(i,) for i in range(6)], prefix="c0", container="fn0", pack_size=6)
    ra = _one(queues.collect(a, timeout=40))
    b = queues.push(fns.whoami, [(i,) for i in range(6)], prefix="c1", container="fn1", function_id="f2")
    rb = _one(queues.collect(b, timeout=40))
    assert all(r["state"] == "SUCCEEDED" for r in list(ra.values()) + list(rb.values()))
    # inside bubblewrap's own pid namespace the worker's pid is tiny
    assert all(deserialize(r["result"])[1] < 50 for r in list(ra.values()) + list(rb.values()))
    st = agent.wait_status(lambda s: s.get("cold_starts", 0) >= 2 and s.get("containers"))
    assert set(st["containers"]) <= {"fn0", "fn1"}
    # a second batch of fn0 reuses warm workers: no cold start per task
    before = st["cold_starts"]
    c = queues.push(fns.whoami, [(i,) for i in range(20)], prefix="c2", container="fn1", function_id="f2")
    assert all(r["state"] == "SUCCEEDED" for r in _one(queues.collect(c, timeout=40)).values())
    st = agent.wait_status(lambda s: True)
    assert st["cold_starts"] - before <= 1, st


def test_manager_with_a_wrong_server_key_exits_with_a_reason(tmp_path, monkeypatch):
    """A manager the interchange never accepts must end with a reason, not hang."""
    import subprocess
    import sys

    import endpoint_agent.manager.manager as manager_mod

    ix = _ix(tmp_path, interchange_address="0.0.0.0")
    try:
        wrong_pub, _ = zmq.curve_keypair()
        env = dict(__import__("os").environ)
        code = ("import endpoint_agent.manager.manager as m, sys; m.SEND_TIMEOUT_S = 1.0; "
                "sys.exit(m.main(sys.argv[1:]))")
        proc = subprocess.Popen([sys.executable, "-c", code, "--interchange", ix.address, "--block", "b",
                                 "--workers", "1", "--server-key", wrong_pub.decode(), "--heartbeat", "0.2"],
                                stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            ix.step(0.05)
        assert proc.returncode is not None, "the manager hung"
        err = proc.stderr.read()
        assert not ix.snapshot()["managers"]
        assert manager_mod.SEND_TIMEOUT_S == 30.0
        assert "interchange" in err, err[-800:]  # it says why it gave up
    finally:
        if proc.poll() is None:
            proc.kill()
        ix.close()
