"""The two ends of a direct session in the NAT lab (tests/comm/test_direct_nat.py,
benchmarks/direct_nat.py), each run in its own namespace:

    python -m tests.comm.direct_nat_peer agent RENDEZVOUS WORKDIR [REACH [PORT ADVERTISE]]
        a real interchange (one manager, two worker processes, an Outbox to its own
        redis-server on the namespace's loopback) with `direct: {reach: REACH}`
        (default rendezvous: no port); its LISTEN ticket is made by the service's own
        function (skyfn.protocol.direct_path.listen_ticket) from $SKYFN_RENDEZVOUS_SECRET.
        Prints {"server_key", "session_key", "address", "name"} once listening, then reads
        commands on stdin: "stats" (prints the direct server's stats), "drop" (closes every
        path from the agent's side), "quit".

    python -m tests.comm.direct_nat_peer sdk RENDEZVOUS
        reads one JSON line on stdin: {"agent": <the agent's line>, "via", "tasks",
        "drop_after", "rtt_samples", "rtt_rounds", "owner", "endpoint"} and runs the tasks in a real
        DirectChannel (skyfn/executor/direct.py) whose sessions are signed as the service
        signs them (mint_token, path_ticket). Prints one JSON line: values checked, how often
        each future resolved, the channel's stats and round-trip times.

Only the service is stood in for, by the very functions it calls; everything on the
session's path (the channel, the rendezvous server, punching, the relay, the agent's
socket, the interchange and its workers) is real.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import Future
from pathlib import Path

SECRET_ENV = "SKYFN_RENDEZVOUS_SECRET"
ENDPOINT = "ep"


def square(x):
    return x * x


def nap_square(x):
    import time as _t

    _t.sleep(0.003)
    return x * x


FUNCTIONS = {"square": square, "nap_square": nap_square}


# -- the agent ---------------------------------------------------------------------------

def agent(rendezvous: str, workdir: str, reach: str = "rendezvous", port: str = "0", advertise: str = "") -> int:
    from infra.local.processes import start_redis
    from skyfn.protocol.api import ListenTicket
    from skyfn.protocol.direct_path import listen_ticket, listener_name
    from tests.agent.conftest import Queues
    from tests.agent.test_direct import Rig

    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    redis = start_redis(work / "redis", appendonly=False)
    secret = os.environ[SECRET_ENV]
    queues = Queues(redis.url, uuid.uuid4().hex[:10])
    direct = {"reach": reach, "punch_timeout": float(os.environ.get("SKYFN_TEST_PUNCH_TIMEOUT", "2"))}
    if reach != "rendezvous":  # also a port (forwarded by the router, as a user would open one)
        direct.update(listen="0.0.0.0", port=int(port), **({"advertise": advertise} if advertise else {}))
    rig = Rig(work, queues, direct=direct)
    server = rig.ix.direct
    server.start_reach(lambda: ListenTicket(**listen_ticket(secret, rendezvous, ENDPOINT, 3600, time.time())))
    deadline = time.monotonic() + 30
    while not server.reach.listening:
        if time.monotonic() > deadline:
            raise SystemExit(f"never listened at {rendezvous}: {server.reach.last_error}")
        time.sleep(0.05)
    info = server.info()
    print(json.dumps({**info, "name": listener_name(ENDPOINT)}), flush=True)
    try:
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "stats":
                print(json.dumps(rig.on_loop(server.stats)), flush=True)
            elif cmd == "drop":
                print(json.dumps({"dropped": server.reach.drop_paths()}), flush=True)
            elif cmd == "quit":
                break
    finally:
        rig.close()
        redis.stop()
    return 0


# -- the SDK -------------------------------------------------------------------------------

class ServiceStandIn:
    """What DirectChannel asks of the service: a function's body and sessions, signed with
    the functions the service's POST /endpoints/{id}/sessions calls."""

    def __init__(self, agent_info: dict, rendezvous: str, secret: str, owner: str, endpoint: str, body: str):
        self.info, self.rendezvous, self.secret = agent_info, rendezvous, secret
        self.owner, self.endpoint, self.body = owner, endpoint, body
        self.sessions = 0
        self.status_calls = 0

    def get_function(self, fid: str) -> dict:
        return {"function": self.body}

    def open_session(self, endpoint_id: str, fids: list[str]) -> dict:
        from skyfn.protocol.direct import body_digest, mint_token
        from skyfn.protocol.direct_path import path_ticket

        self.sessions += 1
        sid = str(uuid.uuid4())
        now = time.time()
        key = self.info["session_key"]
        token, exp = mint_token(key, session_id=sid, owner=self.owner, endpoint_id=self.endpoint,
                                functions={f: body_digest(self.body) for f in fids}, ttl=900.0, now=now)
        ticket = path_ticket(self.secret, self.rendezvous, self.endpoint, sid, self.owner, key, exp, now)
        return {"session_id": sid, "endpoint_id": endpoint_id, "address": self.info.get("address"),
                "server_key": self.info["server_key"], "token": token, "expires_at": exp, "rendezvous": ticket}

    def status(self, ids, wait=0, cursor=None):
        self.status_calls += 1
        raise RuntimeError("no service in the NAT lab: a task the agent could not replay would be settled here")


def sdk(rendezvous: str) -> int:
    job = json.loads(sys.stdin.readline())

    def pause(done: int) -> None:  # the test breaks the path now, then says go on
        print(json.dumps({"dropping": done}), flush=True)
        sys.stdin.readline()

    def turn(r: int, rtts=None) -> None:  # wait for our turn; then say the round is done
        if rtts is None:
            sys.stdin.readline()
        else:
            print(json.dumps({"round": r, "rtts": rtts}), flush=True)

    print(json.dumps(run_sdk(job, rendezvous, os.environ[SECRET_ENV], pause, turn)), flush=True)
    return 0


def run_sdk(job: dict, rendezvous: str, secret: str, pause=None, turn=None) -> dict:
    """Run `job` (see the module docstring) in a DirectChannel; its outcome. `pause(done)`
    is called once `drop_after` tasks of the batch resolved; `turn(round)` before and
    `turn(round, rtts)` after each of `rtt_rounds` rounds of round trips."""
    from skyfn.executor.channel import ChannelPort
    from skyfn.executor.direct import DirectChannel
    from skyfn.executor.progress import ProgressBar
    from skyfn.executor.state import State
    from skyfn.protocol.serialize import pack_args, serialize_function

    body = serialize_function(FUNCTIONS[job.get("fn", "square")])
    service = ServiceStandIn(job["agent"], rendezvous, secret, job.get("owner", "alice"),
                             job.get("endpoint", ENDPOINT), body)
    state = State()
    to_service: list = []
    port = ChannelPort(state, service, batch_size=256, idle_exit=60.0, task_options=lambda: {},
                       to_service=to_service.extend, bar=ProgressBar(False, state, lambda: None), owner="direct")
    ch = DirectChannel(port, ENDPOINT, timeout=float(job.get("timeout", 30.0)), via=job.get("via", "rendezvous"),
                       punch_timeout=float(job.get("punch_timeout", 2.0)))
    out: dict = {"rounds": []}
    t_open = time.monotonic()
    # one task alone first: the session's open to its first result (path setup included)
    first = Future()
    ch.submit([(first, "f1", pack_args((-1,), {}))])
    ch.start()
    deadline = time.monotonic() + float(job.get("first_timeout", 60.0))
    while not first.done() and not to_service and time.monotonic() < deadline:
        time.sleep(0.01)  # a session refused hands its task to the service (here: nobody) at once
    try:
        out["first"] = first.result(timeout=0)
    except Exception as exc:  # noqa: BLE001 - reported, the test says what it expected
        out["first_error"] = repr(exc)
        out["stats"] = ch.snapshot()
        ch.close(wait=False)
        return out
    out["setup_s"] = time.monotonic() - t_open
    out["path"] = ch.path
    # round trips: one task at a time; in `rtt_rounds` rounds, each when `turn` says so
    # (a benchmark interleaves the paths' rounds: a loaded machine's slow minute hits them all)
    rtts = []
    rounds = int(job.get("rtt_rounds", 1))
    for r in range(rounds):
        if rounds > 1 and turn is not None:
            turn(r)
        mine = []
        for i in range(int(job.get("rtt_samples", 0))):
            f = Future()
            t0 = time.perf_counter()
            ch.submit([(f, "f1", pack_args((i,), {}))])
            f.result(timeout=30)
            mine.append(time.perf_counter() - t0)
        rtts += mine
        if rounds > 1 and turn is not None:
            turn(r, mine)
    if rtts:
        out["rtt_p50_s"] = statistics.median(rtts)
    n = int(job.get("tasks", 0))
    if n:
        futures = [Future() for _ in range(n)]
        calls = [0] * n
        lock = threading.Lock()

        def counted(i):
            def cb(_f):
                with lock:
                    calls[i] += 1
            return cb

        for i, f in enumerate(futures):
            f.add_done_callback(counted(i))
        drop_after = int(job.get("drop_after", 0))
        t0 = time.perf_counter()
        ch.submit([(f, "f1", pack_args((i,), {})) for i, f in enumerate(futures)])
        if drop_after:
            while sum(f.done() for f in futures) < drop_after:
                time.sleep(0.002)
            out["dropped_at"] = sum(f.done() for f in futures)
            pause(out["dropped_at"])
        values = []
        for f in futures:
            try:
                values.append(f.result(timeout=float(job.get("batch_timeout", 120.0))))
            except Exception as exc:  # noqa: BLE001
                values.append(repr(exc))
        out["batch_s"] = time.perf_counter() - t0
        time.sleep(0.2)
        out["values_ok"] = values == [i * i for i in range(n)]
        out["wrong"] = [(i, v) for i, v in enumerate(values) if v != i * i][:5]
        out["resolved_once"] = all(c == 1 for c in calls)
        out["calls"] = sorted(set(calls))
    out["path_end"] = ch.path
    out["stats"] = ch.snapshot()
    out["to_service"] = len(to_service)
    out["status_calls"] = service.status_calls
    out["sessions"] = service.sessions
    out["path_bytes"] = sum(ch._bridge.traffic()) if ch._bridge is not None else 0
    ch.close(wait=False)
    return out


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "agent":
        sys.exit(agent(*sys.argv[2:]))
    sys.exit(sdk(*sys.argv[2:]))
