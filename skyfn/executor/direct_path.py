"""The SDK's way to an agent through the rendezvous server (skyfn.protocol.direct_path).

The direct channel's DEALER (skyfn/executor/direct.py) connects to a private ipc:// path
of this process instead of the agent's address; `PathBridge` accepts that connection,
CALLs the agent's listener name with the session's ticket, joins the call's group as
rank 1 (rendezvous/pair.py: punched within `punch_timeout`, else relayed), answers the
agent's CHALLENGE with the ticket's PROOF and, once accepted, copies bytes both ways
(rendezvous/pump.py). The DEALER's CurveZMQ session runs end to end over it, exactly as
over TCP: the relay only ever carries ciphertext.

When the path breaks (the relay's connection killed, a NAT mapping gone, a byte altered
on the way: CurveZMQ drops the connection) the pump closes the local connection; ZeroMQ
reconnects to the ipc path at once and the bridge makes a new path -- punching again, or
relaying -- for the same session, under the same routing identity, so the agent's
replies find the SDK again (and the agent replays those lost meanwhile). A path that
cannot be made is retried with backoff; `failing_since` tells the channel how long
there has been none, and a refusal by the agent (`refused`: the ticket is not for this
agent run) ends the session.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from typing import Callable, Optional

from rendezvous import client, pair
from rendezvous.client import RendezvousError
from rendezvous.pump import Pump
from skyfn.protocol import direct_path as dp

log = logging.getLogger("skyfn.executor.direct")

SETUP_TIMEOUT_S = 30.0
BACKOFF_START_S = 0.2
BACKOFF_MAX_S = 5.0


VIAS = ("auto", "address", "rendezvous")
PROBE_S = 1.5  # auto: how long a TCP connect to the advertised address may take before the rendezvous is used


def route(opened: dict, via: str) -> tuple[str, object]:
    """Where the session's DEALER connects: ("tcp", address) or ("rendezvous", ticket).
    `via`: address (the advertised address only), rendezvous (always through the rendezvous
    server), auto (the address when a TCP connection to it can be made within PROBE_S,
    else the rendezvous server). ValueError naming what is missing when neither is possible."""
    address, ticket = opened.get("address"), opened.get("rendezvous")
    if via == "address" or (via == "auto" and ticket is None):
        if not address:
            raise ValueError("the agent opens no port (its direct.reach is rendezvous): use direct_via='auto' or "
                             "'rendezvous'" if via == "address" else
                             "the agent opens no port and the service gave no rendezvous ticket (no rendezvous "
                             "server configured: SKYFN_RENDEZVOUS_ADDRESS / _SECRET)")
        return "tcp", address
    if ticket is None:
        raise ValueError("the session has no rendezvous ticket: the agent does not listen at a rendezvous server "
                         "(direct.reach: rendezvous or auto in its config.yaml) or the service has none configured")
    if via == "auto" and address and _reachable(address):
        return "tcp", address
    return "rendezvous", ticket


def _reachable(address: str) -> bool:
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_S).close()
        return True
    except (OSError, ValueError):
        return False


class PathBridge:
    def __init__(self, ticket: dict, punch_timeout: float = 3.0, on_change: Optional[Callable[[], None]] = None,
                 allow_direct: bool = True):
        self.ticket = dict(ticket)      # holds path_key, a secret: never logged
        self.punch_timeout = punch_timeout
        self.allow_direct = allow_direct
        self._on_change = on_change or (lambda: None)
        self._dir = tempfile.mkdtemp(prefix="skyfn-path-")
        self.ipc_path = os.path.join(self._dir, "s")
        self.address = f"ipc://{self.ipc_path}"
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.ipc_path)
        self._server.listen(4)
        self._closed = False
        self._lock = threading.Lock()
        self._pump: Optional[Pump] = None
        self.mode: Optional[str] = None          # the current path: "punched" | "relayed" | None
        self.failing_since: Optional[float] = None
        self.last_error: Optional[str] = None
        self.refused: Optional[tuple[str, str]] = None
        self.setup_s: Optional[float] = None     # how long the last path took to make
        self.counts = {"paths": 0, "punched": 0, "relayed": 0, "path_failures": 0, "path_breaks": 0}
        self.bytes_sent = 0
        self.bytes_received = 0
        self._backoff = 0.0
        self._thread = threading.Thread(target=self._accept, name="skyfn-direct-path", daemon=True)
        self._thread.start()

    def update(self, ticket: dict) -> None:
        """A renewed session's ticket: the next path uses it."""
        self.ticket = dict(ticket)

    def close(self) -> None:
        self._closed = True
        try:
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()
        pump = self._pump
        if pump is not None:
            pump.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def drop_path(self) -> bool:
        """Break the current path (fault tests): the session comes back through a new one."""
        pump = self._pump
        if pump is None:
            return False
        pump.close()
        return True

    # -- the accept loop: one local connection (and path) at a time --------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                local, _ = self._server.accept()
            except OSError:
                return
            if self._backoff:
                time.sleep(self._backoff)
            try:
                self._carry(local)
            except Exception as exc:  # noqa: BLE001 - a path that cannot be made: the DEALER retries
                local.close()
                self._failed(exc)

    def _carry(self, local: socket.socket) -> None:
        t = self.ticket
        t0 = time.monotonic()
        group, gtoken = client.call(t["address"], t["name"], t["token"], timeout=SETUP_TIMEOUT_S, caller=t["caller"])
        chan = pair.connect(t["address"], group, gtoken, 1, punch_timeout=self.punch_timeout,
                            timeout=SETUP_TIMEOUT_S, allow_direct=self.allow_direct)
        sock = chan.sock
        try:
            sock.settimeout(SETUP_TIMEOUT_S)
            nonce = dp.read_challenge(pair.recv_exact(sock, dp.CHALLENGE.size))
            sock.sendall(dp.proof(t["path_key"], nonce, t["expires"]))
            answer = pair.recv_exact(sock, 1)
            if answer != dp.ACCEPTED:
                size = int.from_bytes(pair.recv_exact(sock, 2), "little")
                body = json.loads(pair.recv_exact(sock, size))
                self.refused = (body.get("code", "refused"), body.get("reason", ""))
                raise ConnectionError(f"the agent refused the path ({self.refused[0]}): {self.refused[1]}")
        except BaseException:
            sock.close()
            raise
        self.setup_s = time.monotonic() - t0
        self.mode = chan.mode
        self.counts["paths"] += 1
        self.counts[chan.mode] += 1
        self.failing_since, self.last_error, self._backoff = None, None, 0.0
        log.info("direct session path %s to the agent (%.3f s)", chan.mode, self.setup_s)
        self._pump = Pump(local, sock, name="skyfn-direct-path", on_close=self._ended)
        self._on_change()

    def _ended(self, pump: Pump, why: str) -> None:
        self.bytes_sent += pump.sent
        self.bytes_received += pump.received
        if self._pump is pump:
            self._pump = None
            self.mode = None
        if not self._closed:
            self.counts["path_breaks"] += 1
            log.info("direct session path broke (%s); making a new one", why)
            self._on_change()

    def _failed(self, exc: Exception) -> None:
        self.counts["path_failures"] += 1
        self.last_error = str(exc) if isinstance(exc, (RendezvousError, ConnectionError)) else repr(exc)
        if self.failing_since is None:
            self.failing_since = time.monotonic()
            log.warning("no direct path to the agent through the rendezvous server: %s; retrying", self.last_error)
        self._backoff = min(BACKOFF_MAX_S, max(BACKOFF_START_S, self._backoff * 2))
        self._on_change()

    def traffic(self) -> tuple[int, int]:
        """Bytes (sent, received) over every path so far, the current one included."""
        pump = self._pump
        extra = (pump.sent, pump.received) if pump is not None else (0, 0)
        return self.bytes_sent + extra[0], self.bytes_received + extra[1]
