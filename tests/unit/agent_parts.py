"""Helpers of the unit tests of the interchange's and the manager's parts: a real IxState
with a real ROUTER socket, manager/worker stand-ins as real DEALER sockets, and an outbox
that records what it is handed."""
from __future__ import annotations

import uuid

import zmq

from endpoint_agent import wire
from endpoint_agent.config import EndpointConfig
from endpoint_agent.interchange.state import IxState, ManagerHandle


class RecordingOutbox:
    """What the interchange hands the outbox, in order; `idle` is what it answers."""

    def __init__(self, idle: bool = True):
        self.bodies: list[bytes] = []
        self.acks: list[str] = []
        self.extended: list[str] = []
        self.puts = 0
        self.is_idle = idle

    def put(self, bodies=(), acks=(), extend=()):
        self.puts += 1
        self.bodies.extend(bodies)
        self.acks.extend(acks)
        self.extended.extend(extend)

    def idle(self) -> bool:
        return self.is_idle

    def results(self) -> list[dict]:
        return [r for b in self.bodies for r in wire.loads(b)["results"]]

    def updates(self) -> list[dict]:
        return [u for b in self.bodies for u in wire.loads(b)["updates"]]


def make_state(ctx: zmq.Context, outbox=None, **cfg) -> IxState:
    """An IxState over a real ROUTER bound to a fresh inproc address (st.address)."""
    config = EndpointConfig(**{"workers": 1, "managers": 0, "manager_heartbeat_period": 0.5, **cfg})
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    address = f"inproc://ix-test-{uuid.uuid4().hex}"
    router.bind(address)
    return IxState(config, "ep", outbox if outbox is not None else RecordingOutbox(), router,
                   address=address, public_address="tcp://node.example:5555", server_key=None)


def connect_dealer(ctx: zmq.Context, address: str, identity: str) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.IDENTITY, identity.encode())
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    return s


def handshake(router: zmq.Socket, dealer: zmq.Socket) -> None:
    """Make the ROUTER know the DEALER's identity (ROUTER_MANDATORY sends need it)."""
    dealer.send_multipart([b"hello", b""])
    assert router.poll(2000), "the dealer never reached the router"
    router.recv_multipart()


def registered_manager(st: IxState, ctx: zmq.Context, name: str, *, workers: int = 2, credit: int = 0,
                       cores: int | None = None, accelerators=(), warm=None, block: str = "b") -> tuple:
    """A registered ManagerHandle in st.managers and the DEALER socket that stands for it."""
    sock = connect_dealer(ctx, st.address, name)
    handshake(st.router, sock)
    m = ManagerHandle(name.encode())
    m.registered = True
    m.workers, m.cores, m.credit = workers, workers if cores is None else cores, credit
    m.accelerators = list(accelerators)
    m.warm = dict(warm or {})
    m.block = block
    st.managers[m.identity] = m
    return m, sock


def recv_all(sock: zmq.Socket, timeout: float = 0.5) -> list[list[bytes]]:
    out = []
    while sock.poll(timeout * 1000):
        out.append(sock.recv_multipart())
        timeout = 0.05
    return out


def task_record(task_id: str, pack: int, *, fn: str = "f1", route=None, recv: float = 100.0) -> list:
    """A task record (endpoint_agent/task_record.py) as the intake makes it."""
    from endpoint_agent.interchange.state import PLAIN
    from endpoint_agent.task_record import new_record

    return new_record(task_id, fn, f"payload-{task_id}", None, pack, recv, PLAIN if route is None else route)


# --- the manager's parts ------------------------------------------------------------------
def make_manager_state(ctx: zmq.Context, workers: int = 2, *, prefetch: int = 4, cores: int | None = None,
                       accelerators=(), containers=None, worker_addr: str | None = None):
    """A ManagerState with real sockets: `wsock` (ROUTER) bound at worker_addr (inproc by
    default) and `ix` (DEALER) connected to the returned ROUTER, the interchange's stand-in."""
    from endpoint_agent.manager.containers import configure
    from endpoint_agent.manager.state import ManagerState
    from endpoint_agent.slots import Slots

    st = ManagerState("mgr-test", workers, prefetch, cores=cores or workers, accelerators=list(accelerators))
    st.wsock = ctx.socket(zmq.ROUTER)
    st.wsock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    st.wsock.setsockopt(zmq.LINGER, 0)
    st.worker_addr = worker_addr or f"inproc://mgr-test-{uuid.uuid4().hex}"
    st.wsock.bind(st.worker_addr)
    ix = ctx.socket(zmq.ROUTER)
    ix.setsockopt(zmq.LINGER, 0)
    ix_addr = f"inproc://ix-test-{uuid.uuid4().hex}"
    ix.bind(ix_addr)
    st.ix = connect_dealer(ctx, ix_addr, "mgr-test")
    st.slots = Slots(workers)
    st.idle_timeout, st.routing, st.rng, st.runtime, st.pool = configure(containers or {}, workers)
    return st, ix


def sleeper():
    """A real process that lives until killed (a worker process's stand-in)."""
    import subprocess

    return subprocess.Popen(["sleep", "60"])


def worker_standin(ctx: zmq.Context, st, slot: int, ctype: str = "none", *, proc=None, ready: bool = True):
    """A WorkerProc in st.workers[slot] with a real process and the DEALER socket that stands
    for it (connected to st.wsock, its identity known to the ROUTER)."""
    from endpoint_agent.manager.state import WorkerProc

    identity = f"w{slot}.{uuid.uuid4().hex[:6]}"
    sock = connect_dealer(ctx, st.worker_addr, identity)
    handshake(st.wsock, sock)
    w = WorkerProc(slot, slot + 1, proc or sleeper(), identity.encode(), ctype)
    w.ready = ready
    st.workers[slot] = w
    st.slot_type[slot] = ctype
    st.by_identity[w.identity] = w
    return w, sock


def reap(st) -> None:
    for w in st.workers:
        if w is not None and w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()
    st.slots.close()
