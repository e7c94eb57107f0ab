"""Direct sessions through the rendezvous server, the agent's side (skyfn.protocol.direct_path).

`RendezvousReach` holds a LISTEN connection at the rendezvous server under the name the
service signs (`ticket()`: a ListenTicket; asked again at every reconnect, so an expired
token or a moved server heals by itself). Each INCOMING call gets a thread of its own:
it joins the call's 2-rank group as rank 0 (rendezvous/pair.py: punched, else relayed),
sends the CHALLENGE, checks the SDK's PROOF against the caller the rendezvous server
named, and only then connects to the direct socket's private ipc:// path and copies bytes
both ways (rendezvous/pump.py). A refused or failed path never reaches the socket. No
port is opened, not even while punching: every connection here is outgoing.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Callable, Optional

from rendezvous import client, pair
from rendezvous.client import RendezvousError
from rendezvous.pump import Pump
from skyfn.protocol import direct_path as dp

log = logging.getLogger("skyfn.agent.direct")

MAX_PATHS = 256          # SDK paths served at once; more calls are refused busy
SETUP_TIMEOUT_S = 30.0   # a call's pairing and proof, at most
BACKOFF_MAX_S = 30.0


class RendezvousReach:
    def __init__(self, endpoint_id: str, ipc_path: str, session_key: str, ticket: Callable[[], Any],
                 punch_timeout: float = 3.0, ping_interval: float = 15.0):
        self.endpoint_id = endpoint_id
        self.ipc_path = ipc_path
        self._session_key = session_key  # a secret: never logged
        self._ticket = ticket
        self.punch_timeout = punch_timeout
        self.ping_interval = ping_interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._listener: Optional[client.Listener] = None
        self._pumps: set[Pump] = set()
        self._thread: Optional[threading.Thread] = None
        self.listening = False
        self.last_error: Optional[str] = None
        self.counts = {"calls": 0, "punched": 0, "relayed": 0, "refused": 0, "failed": 0}

    # -- life cycle -------------------------------------------------------------------
    def start(self) -> "RendezvousReach":
        self._thread = threading.Thread(target=self._run, name="skyfn-direct-listen", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        lst = self._listener
        if lst is not None:
            lst.close()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            pumps = list(self._pumps)
        for p in pumps:
            p.close()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            active = len(self._pumps)
        return dict(self.counts, listening=self.listening, paths=active, last_error=self.last_error)

    def drop_paths(self) -> int:
        """Close every path now (fault tests: the SDKs reconnect through new ones)."""
        with self._lock:
            pumps = list(self._pumps)
        for p in pumps:
            p.close()
        return len(pumps)

    # -- listening ----------------------------------------------------------------------
    def _run(self) -> None:
        delay = 0.5
        while not self._stop.is_set():
            try:
                t = self._ticket()
                lst = client.listen(t.address, t.name, t.token, timeout=30.0, ping_interval=self.ping_interval)
            except Exception as exc:  # noqa: BLE001 - the service or the server is away: again later
                self._failed_listen(exc)
                self._stop.wait(delay)
                delay = min(BACKOFF_MAX_S, delay * 2)
                continue
            self._listener, self.listening, self.last_error, delay = lst, True, None, 0.5
            log.info("direct sessions through the rendezvous server %s as %s", t.address, t.name)
            try:
                while not self._stop.is_set():
                    inc = lst.next_incoming(timeout=1.0)
                    if inc is not None:
                        self._incoming(t.address, inc)
            except (RendezvousError, OSError) as exc:
                if not self._stop.is_set():
                    self.last_error = f"the LISTEN connection ended: {exc}"
                    log.warning("direct sessions: %s; listening again", self.last_error)
            finally:
                self.listening = False
                self._listener = None
                lst.close()

    def _failed_listen(self, exc: Exception) -> None:
        why = f"cannot LISTEN at the rendezvous server: {exc}"
        if why != self.last_error:
            log.warning("direct sessions: %s; trying again", why)
        self.last_error = why

    def _incoming(self, address: str, inc: client.Incoming) -> None:
        self.counts["calls"] += 1
        with self._lock:
            busy = len(self._pumps) >= MAX_PATHS
        threading.Thread(target=self._serve, args=(address, inc, busy), name="skyfn-direct-path",
                         daemon=True).start()

    # -- one SDK's path -------------------------------------------------------------------
    def _serve(self, address: str, inc: client.Incoming, busy: bool) -> None:
        try:
            # accept=False: no listening socket, not even while punching (the SDK's side accepts)
            chan = pair.connect(address, inc.group, inc.token, 0, punch_timeout=self.punch_timeout,
                                timeout=SETUP_TIMEOUT_S, accept=False)
        except (RendezvousError, OSError) as exc:
            self.counts["failed"] += 1
            log.info("direct path for caller %s failed: %s", inc.caller or "(none)", exc)
            return
        sock = chan.sock
        try:
            sock.settimeout(SETUP_TIMEOUT_S)
            nonce, frame = dp.challenge()
            sock.sendall(frame)
            proof = pair.recv_exact(sock, dp.PROOF.size)
            bad = ((dp.REFUSE_BUSY, f"the agent serves {MAX_PATHS} paths already: try again later") if busy else
                   dp.check_proof(proof, nonce, self._session_key, self.endpoint_id, inc.caller, time.time()))
            if bad is not None:
                self.counts["refused"] += 1
                log.info("direct path for caller %s refused (%s): %s", inc.caller or "(none)", *bad)
                sock.sendall(dp.refusal(*bad))
                sock.close()
                return
            local = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            local.connect(self.ipc_path)
            sock.sendall(dp.ACCEPTED)
        except (OSError, ConnectionError) as exc:
            self.counts["failed"] += 1
            log.info("direct path for caller %s failed during its proof: %s", inc.caller, exc)
            sock.close()
            return
        self.counts[chan.mode] += 1
        log.info("direct path for caller %s %s (peer %s:%d)", inc.caller, chan.mode, *chan.peer)
        pump = Pump(sock, local, name="skyfn-direct-path", on_close=self._ended)
        with self._lock:
            self._pumps.add(pump)
            if pump.closed.is_set():
                self._pumps.discard(pump)

    def _ended(self, pump: Pump, why: str) -> None:
        with self._lock:
            self._pumps.discard(pump)
