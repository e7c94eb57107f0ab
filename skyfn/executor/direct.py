"""The Executor's direct session: tasks straight to the endpoint's agent, results straight back.

With ``Executor(..., direct=True)`` the tasks of a plain executor (one endpoint, no
memoization) skip the service's seven hops: the service authorizes a session
(``POST /endpoints/{id}/sessions``, the same checks as ``POST /tasks``) and the tasks
travel over one CurveZMQ connection to the agent's interchange, which runs them like any
others and answers each result at once (skyfn/protocol/direct.py). The agent reports
every direct task to the service too, which records it: ``GET /tasks/{id}``, the task
list and ``skyfn report`` show it as usual.

One thread (``skyfn-direct``) owns the socket. Callers hand it submissions through a
deque and a wake-up pipe; it sends what has gathered as one pack per wake-up (up to
``batch_size`` tasks a pack), resolves futures as results arrive, and keeps the payload of
every task until its result is in. Nothing is lost when the direct path fails; the tasks
concerned go through the service instead (at least once, as for every skyfn task):

* no session can be had: pyzmq is missing here (``why_not``), or the endpoint offers none
  (its agent has no ``direct:`` section, is offline or restarting: ``unavailable``, asked
  again every ``RETRY_AFTER_S`` while tasks come): those tasks go through the service;
* the agent refuses a pack: a stale or expired token gets a new session and one resend,
  anything else (a function it will not run) goes through the service, which reports it;
* the agent no longer holds a task whose result never came (the reply was lost while the
  connection was down): the service's record settles it, or, if the service has none
  after ``RESUBMIT_AFTER_S``, it goes through the service;
* the agent is gone: its socket refuses the connection (it stopped, or its address is
  stale: a restarted agent listens elsewhere until its first heartbeat publishes that),
  the CurveZMQ handshake fails (another agent, with another key, at that address), it
  falls silent (pings unanswered for ``timeout`` seconds: a network that drops packets)
  or it restarted (its start time changed): every task in flight is resubmitted through
  the service, and a new session is tried ``RETRY_AFTER_S`` later. The first two are seen
  on the socket's monitor as they happen, so a killed agent costs a fraction of a second,
  not ``timeout``.

Where the agent opens no port the session goes through the rendezvous server instead
(``via``: auto, address or rendezvous; skyfn/executor/direct_path.py): the DEALER then
connects to a local PathBridge, which carries the same CurveZMQ session over a punched or
relayed channel and makes a new one when it breaks. ``path`` says which (tcp, punched,
relayed). A broken path loses nothing: the PINGs that follow ask for the tasks still
waited for, and the agent replays their results (or, past its replay cache, the service
settles them).

A future resolves once: a task leaves the pending map exactly once, under its lock. The
channel reaches its Executor only through the ``ChannelPort`` the core hands it
(skyfn/executor/channel.py): resolving, handing tasks back to the service path, the bar.
"""
from __future__ import annotations

import collections
import logging
import os
import select
import threading
import time
import uuid
from typing import Optional

import orjson

from skyfn.executor.channel import ChannelPort
from skyfn.executor import direct_path
from skyfn.executor.direct_liveness import PING_EVERY_S, Liveness, watched_events
from skyfn.http import SkyfnAPIError
from skyfn.protocol import direct as proto
from skyfn.protocol.ids import uuid7s

log = logging.getLogger("skyfn.executor.direct")

RETRY_AFTER_S = 5.0
RENEW_BEFORE_S = 60.0  # a token this close to its expiry is renewed before use
PACK_BYTES = 16 << 20  # a pack is sent once its payloads reach this (the agent takes messages up to 64 MiB)
MAX_DIRECT_PAYLOAD = 8 << 20  # larger arguments go through the service (and S3)
MIN_WINDOW = 2000  # tasks of this executor the agent may hold at once, at least (PONG's capacity x 2)
MAX_RESENDS = 3  # a task the agent says never arrived is sent again at most this often
_IDLE_WAIT_S = 1.0


class DirectChannel(Liveness, threading.Thread):
    def __init__(self, port: ChannelPort, endpoint_id: str, timeout: float, via: Optional[str] = None,
                 punch_timeout: float = 3.0):
        super().__init__(name="skyfn-direct", daemon=True)
        via = via or os.environ.get("SKYFN_DIRECT_VIA", "auto")
        if via not in direct_path.VIAS:
            raise ValueError(f"direct_via must be one of {', '.join(direct_path.VIAS)}, got {via!r}")
        self.via = via
        self.punch_timeout = punch_timeout
        self._bridge: Optional[direct_path.PathBridge] = None  # the way through the rendezvous server
        self._address: Optional[str] = None  # what the DEALER connects to
        self._handshake_failures = 0
        self.port = port  # all it uses of the Executor (skyfn/executor/channel.py)
        self.endpoint_id = endpoint_id
        self.timeout = max(0.5, float(timeout))
        self.why_not: Optional[str] = None  # set when no session can ever be had (tasks go through the service)
        self.unavailable: Optional[str] = None  # why the last session request failed (asked again later)
        self.stats = collections.Counter()
        self._lock = threading.Lock()
        self._incoming: collections.deque = collections.deque()   # (future, function id, payload)
        self._pending: dict[str, tuple] = {}  # task id -> (future, function id, payload, resends); under _lock
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._closing = False
        self._functions: dict[str, dict] = {}  # function id -> {"body", "container", "tag"}
        self._session: Optional[dict] = None
        self._retry_at = 0.0
        self._ctx = None
        self._sock = None
        self._monitor = None  # the socket's event monitor: refused connections, failed handshakes
        self._up = False  # a handshake succeeded since the last connect or disconnect
        self.last_loss: Optional[str] = None
        self._agent_started: Optional[float] = None
        self._last_heard = 0.0
        self._last_ping = 0.0
        self._identity = uuid.uuid4().bytes
        self._drop = False  # drop_connection() asked for: done on this thread, which owns the socket
        self._window = MIN_WINDOW
        self._suspects: dict[str, float] = {}  # pending task id -> when the agent said it does not hold it
        try:
            import zmq  # noqa: F401 - the endpoint extra (pip install 'skyfn[direct]')
        except ImportError:
            self.why_not = "pyzmq is not installed (pip install 'skyfn[direct]')"

    # -- caller side ------------------------------------------------------------------
    @property
    def usable(self) -> bool:
        return self.why_not is None and not self._closing

    def submit(self, items: list[tuple]) -> None:
        self._incoming.extend(items)
        self._wake()

    def pending(self) -> int:
        with self._lock:
            return len(self._incoming) + len(self._pending)

    def futures(self) -> list:
        with self._lock:
            # list() copies the deque in one step: callers' threads append to it meanwhile
            return [item[0] for item in list(self._incoming)] + [p[0] for p in self._pending.values()]

    def snapshot(self) -> dict:
        """The counters, and whether tasks go direct now (`active`) or why not (`why_not`)."""
        waiting = time.monotonic() < self._retry_at
        counts = dict.fromkeys(("sessions", "session_failures", "packs", "tasks", "results", "refused", "lost",
                                "settled", "to_service", "peak_in_flight"), 0)
        b = self._bridge
        paths = dict(b.counts, path_setup_s=b.setup_s, path_error=b.last_error,
                     relay_bytes=sum(b.traffic()) if b.counts["relayed"] else 0) if b is not None else {}
        return dict(counts, **self.stats, **paths, active=self.usable and not waiting and self._session is not None,
                    why_not=self.why_not or (self.unavailable if waiting else None), last_loss=self.last_loss,
                    path=self.path)

    @property
    def path(self) -> Optional[str]:
        """How the session reaches the agent now: tcp, punched, relayed (None: no connection)."""
        if self._sock is None:
            return None
        return "tcp" if self._bridge is None else self._bridge.mode

    def drop_path(self) -> bool:
        """Break the path through the rendezvous server (fault tests); False when there is none."""
        return self._bridge is not None and self._bridge.drop_path()

    def close(self, wait: bool = True) -> None:
        """Stop taking tasks; with ``wait``, return once every task handed over is resolved
        or passed on to the service."""
        self._closing = True
        self._wake()
        if wait and self.is_alive():
            self.join()

    def drop_connection(self) -> None:
        """Drop the connection and make a new one under a new identity, as a client that lost
        its network and came back would: replies sent meanwhile are lost (fault tests)."""
        self._drop = True
        self._wake()

    def _wake(self) -> None:
        if self._wake_w < 0:
            return
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    # -- the thread -------------------------------------------------------------------
    def run(self) -> None:
        try:
            self.port.open_bar()
            self._loop()
        except BaseException as exc:  # never leave futures hanging: the service path takes them
            log.exception("skyfn direct channel failed; its tasks go through the service")
            self.why_not = f"the direct channel failed: {exc!r}"
            self._to_service(self._take_all(), "the direct channel failed")
        finally:
            self.port.close_bar()
            self._disconnect()
            fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), -1, -1
            for fd in fds:
                os.close(fd)

    def _loop(self) -> None:
        import zmq

        while True:
            wait = _IDLE_WAIT_S if not self._pending else min(PING_EVERY_S, self.timeout) / 2
            if self._sock is not None:
                events = dict(self._poller.poll(wait * 1000))
                readable = self._sock in events
                if self._monitor in events:
                    self._watch(zmq)
            else:
                readable = False
                select.select([self._wake_r], [], [], wait)
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except (BlockingIOError, OSError):
                pass
            if self._drop:
                self._drop = False
                if self._session is not None and self._address is not None:
                    self._identity = uuid.uuid4().bytes
                    self._connect(zmq, self._address, self._session["server_key"])
            if self._bridge is not None:
                self._check_path()
            if readable and self._sock is not None:
                self._receive(zmq)
            if self._incoming:
                self._send_incoming(zmq)
            if self._pending:
                self._check_alive(zmq)
            self.port.update_bar(idle=not self._pending)
            if self._closing and not self._incoming and not self._pending:
                return

    # -- sending ----------------------------------------------------------------------
    def _send_incoming(self, zmq) -> None:
        """Send what callers handed over, within the window: the agent holds at most
        `_window` of this executor's tasks (twice its capacity), the rest wait here, so a
        million-task map does not land in the agent's memory at once."""
        if self.why_not is not None or time.monotonic() < self._retry_at:
            self._to_service(self._drain_incoming(), self.why_not or self.unavailable or "no direct session")
            return
        n, free = len(self._incoming), self._window - len(self._pending)
        if self._pending and free < min(n, self.port.batch_size // 4):
            return  # wait for room: packs of a useful size, not a trickle
        items = [self._incoming.popleft() for _ in range(min(n, free))]
        live, service = [], []
        for it in items:
            if not it[0].cancelled():
                # GlobusFile arguments are validated and staged by the service path; a payload
                # this large is better fetched from S3 than held in one message
                (service if getattr(it[2], "staging", None) or len(it[2]) > MAX_DIRECT_PAYLOAD else live).append(it)
        if service:
            self._to_service(service, "staged files or a large payload")
        if not live:
            return
        if not self._ensure_session({it[1] for it in live}):
            self._to_service(live + self._drain_incoming(), self.why_not or "no direct session")
            return
        self._send(zmq, [(tid, fut, fid, payload, 0) for tid, (fut, fid, payload) in zip(uuid7s(len(live)), live)])

    def _drain_incoming(self) -> list[tuple]:
        items = []
        while self._incoming:
            items.append(self._incoming.popleft())
        return items

    def _send(self, zmq, tasks: list[tuple]) -> None:
        """Send (task id, future, function id, payload, resends) in packs; each task is pending from now on."""
        opts = self.port.task_options
        batch = self.port.batch_size
        token = self._session["token"].encode()
        with self._lock:
            if not self._pending:  # silence counts from the first task waited for
                self._last_heard = time.monotonic()
            for tid, fut, fid, payload, resends in tasks:
                self._pending[tid] = (fut, fid, payload, resends)
                fut.task_id = tid
            if len(self._pending) > self.stats["peak_in_flight"]:
                self.stats["peak_in_flight"] = len(self._pending)
        specs, fids, size = [], set(), 0
        for n, (tid, _, fid, payload, _) in enumerate(tasks, 1):
            fn = self._functions[fid]
            spec = {"task_id": tid, "function_id": fid, "payload": payload, **opts}
            if fn["container"]:
                spec["container"] = fn["container"]
            if fn["tag"]:
                spec["tag"] = fn["tag"]
            specs.append(spec)
            fids.add(fid)
            size += len(payload)
            if len(specs) >= batch or size >= PACK_BYTES or n == len(tasks):
                pack = {"tasks": specs, "functions": {f: self._functions[f]["body"] for f in fids}}
                try:
                    self._sock.send_multipart([proto.SUBMIT, token, orjson.dumps(pack)], copy=len(specs) > 8)
                except zmq.ZMQError as exc:  # the send queue is full: the agent stopped reading
                    self._lost(f"sending to the agent failed ({exc})")
                    return
                self.stats["packs"] += 1
                self.stats["tasks"] += len(specs)
                specs, fids, size = [], set(), 0

    def _ensure_session(self, fids: set[str], renew: bool = False) -> bool:
        """A session whose token covers `fids` and is not about to expire; False (and the
        tasks go through the service) when none can be had."""
        import zmq

        s = self._session
        if s is not None and not renew and fids <= s["fids"] and s["expires_at"] - time.time() > RENEW_BEFORE_S:
            return True
        want = set(fids) | (s["fids"] if s is not None else set())
        try:
            for fid in want - set(self._functions):
                info = self.port.client.get_function(fid)
                if not info.get("function"):
                    raise SkyfnAPIError(404, "not_found", f"the body of function {fid} is not readable")
                self._functions[fid] = {"body": info["function"], "container": info.get("container"),
                                        "tag": info.get("tag")}
            opened = self.port.client.open_session(self.endpoint_id, sorted(want))
        except Exception as exc:  # noqa: BLE001 - the service is the fallback, and it retries itself
            # 409 no_direct_channel: none offered now (no `direct:` section, or an agent
            # restarting: asked again later); 403/404: the service path reports the same
            # refusal on the task itself
            quiet = isinstance(exc, SkyfnAPIError) and exc.status == 409
            if not self.stats["session_failures"] or not quiet:
                (log.info if quiet else log.warning)("no direct session (%s); tasks go through the service", exc)
            self.unavailable = exc.message if isinstance(exc, SkyfnAPIError) else repr(exc)
            self._retry_at = time.monotonic() + RETRY_AFTER_S
            self.stats["session_failures"] += 1
            return False
        self.unavailable = None
        try:
            kind, where = direct_path.route(opened, self.via)
        except ValueError as exc:
            self.unavailable = str(exc)
            self._retry_at = time.monotonic() + RETRY_AFTER_S
            self.stats["session_failures"] += 1
            log.warning("no direct session (%s); tasks go through the service", exc)
            return False
        same_key = s is not None and opened["server_key"] == s["server_key"]
        if kind == "tcp" and not (same_key and self._bridge is None and where == self._address):
            self._connect(zmq, where, opened["server_key"])
        elif kind == "rendezvous":
            if same_key and self._bridge is not None and self._bridge.ticket["name"] == where["name"]:
                self._bridge.update(where)  # a renewed session: the next path uses its ticket
            else:
                bridge = direct_path.PathBridge(where, self.punch_timeout, on_change=self._wake)
                self._connect(zmq, bridge.address, opened["server_key"])
                self._bridge = bridge
        self._session = dict(opened, fids=want)
        self.stats["sessions"] += 1
        return True

    def _connect(self, zmq, address: str, server_key: str) -> None:
        bridge = self._bridge if address.startswith("ipc://") and self._bridge is not None \
            and self._bridge.address == address else None
        self._bridge = None  # kept across a reconnect to the same bridge only
        self._disconnect()
        self._bridge = bridge
        self._address = address
        self._handshake_failures = 0
        self._paths_judged = 0  # paths through the rendezvous whose handshake was already judged
        if self._ctx is None:
            self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        # one identity per session: after a reconnect the agent's replies still find us
        sock.setsockopt(zmq.ROUTING_ID, self._identity)
        sock.setsockopt(zmq.SNDTIMEO, int(self.timeout * 1000))
        sock.setsockopt(zmq.SNDHWM, 0)
        public, secret = zmq.curve_keypair()
        sock.curve_serverkey = server_key.encode()
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        self._monitor = sock.get_monitor_socket(watched_events(zmq))
        self._up = False
        sock.connect(address)
        self._sock = sock
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self._poller.register(self._wake_r, zmq.POLLIN)
        self._agent_started = None
        self._last_heard = time.monotonic()  # silence counts from the connection
        sock.send_multipart([proto.PING])  # the PONG tells the agent's capacity: the window

    def _disconnect(self) -> None:
        if self._bridge is not None:
            self._bridge.close()
            self._bridge = None
        if self._sock is not None:
            if self._monitor is not None:
                self._sock.disable_monitor()
                self._monitor.close(0)
                self._monitor = None
            self._sock.close(0)
            self._sock = None
        if self._closing and self._ctx is not None and not self._pending:
            self._ctx.term()
            self._ctx = None

    # -- receiving --------------------------------------------------------------------
    def _receive(self, zmq) -> None:
        sock = self._sock
        while sock is not None:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._last_heard = time.monotonic()
            op = frames[0]
            if op == proto.RESULTS:
                self._resolve(orjson.loads(frames[1]))
            elif op == proto.PONG:
                info = orjson.loads(frames[1])
                started = info.get("started")
                if self._agent_started is not None and started != self._agent_started:
                    self._agent_started = started
                    self._lost("the agent restarted")
                    return
                self._agent_started = started
                self._window = max(MIN_WINDOW, 2 * int(info.get("capacity") or 0))
                now = time.monotonic()
                for tid in info.get("unknown") or ():
                    if tid in self._pending:
                        self._suspects.setdefault(tid, now)
                self._resend(zmq, info.get("never") or ())
            elif op == proto.REFUSED:
                self._refused(zmq, orjson.loads(frames[1]))
            sock = self._sock

    def _resolve(self, results: list[dict]) -> None:
        done = []
        with self._lock:
            pop = self._pending.pop
            for rec in results:
                p = pop(rec.get("task_id"), None)
                if p is not None:
                    done.append((p[0], rec))
        self.stats["results"] += len(done)
        self.port.resolve([(fut, rec["task_id"], rec) for fut, rec in done], [])

    def _resend(self, zmq, never) -> None:
        """Tasks the agent says never arrived (lost with a broken connection) go again, a few times."""
        with self._lock:
            tasks = [(tid, *self._pending.pop(tid)) for tid in never if tid in self._pending]
        again = [(tid, fut, fid, payload, n + 1) for tid, fut, fid, payload, n in tasks if n < MAX_RESENDS]
        if again:
            self.stats["resent"] += len(again)
            self._send(zmq, again)
        gone = [(fut, fid, payload) for tid, fut, fid, payload, n in tasks if n >= MAX_RESENDS]
        if gone:
            self._to_service(gone, "sent to the agent several times, never arrived")

    def _refused(self, zmq, refusal: dict) -> None:
        code, reason = refusal.get("code"), refusal.get("reason", "")
        with self._lock:
            tasks = [(tid, *self._pending.pop(tid)) for tid in refusal.get("task_ids") or () if tid in self._pending]
        self.stats["refused"] += len(tasks)
        if not tasks:
            return
        if code in (proto.REFUSE_BAD_TOKEN, proto.REFUSE_EXPIRED) and all(t[4] == 0 for t in tasks):
            if self._ensure_session({t[2] for t in tasks}, renew=True):
                self._send(zmq, [(tid, fut, fid, payload, 1) for tid, fut, fid, payload, _ in tasks])
                return
        log.warning("the agent refused %d direct task(s) (%s: %s); they go through the service", len(tasks), code, reason)
        self._to_service([(fut, fid, payload) for _, fut, fid, payload, _ in tasks], reason)

    def _lost(self, why: str) -> None:
        """The agent is gone (or lost our tasks): everything in flight goes through the service."""
        self.stats["lost"] += 1
        self.last_loss = why
        log.warning("direct session lost: %s; %d task(s) in flight go through the service", why, len(self._pending))
        self._session = None
        self._suspects.clear()
        self._disconnect()
        self._retry_at = time.monotonic() + RETRY_AFTER_S
        with self._lock:
            items = [(fut, fid, payload) for fut, fid, payload, _ in self._pending.values()]
            self._pending.clear()
        self._to_service(items, why)

    def _take_all(self) -> list[tuple]:
        with self._lock:
            items = list(self._incoming) + [(fut, fid, payload) for fut, fid, payload, _ in self._pending.values()]
            self._incoming.clear()
            self._pending.clear()
        return items

    def _to_service(self, items: list[tuple], why: str) -> None:
        items = [it for it in items if not it[0].cancelled()]
        if items:
            self.stats["to_service"] += len(items)
            self.port.to_service(items)

