"""The peer-ref broker: a user agent serves the refs it shared to tasks of other accounts on
the same host (multi-user endpoints, DESIGN.md section 12; the wire contract is
skyfn/protocol/peer_refs.py, the consumer skyfn/data/peer.py).

On a multi-user endpoint every user agent runs as its own account with its own stores (its
own redis-server, the password in the account's 0600 file): no other account can read them.
When SKYFN_PEER_REFS_DIR is set (the multi-user endpoint sets it), the agent's data plane
runs this broker on threads of its own. For each store of the plane (the direct store has a
path of its own and is skipped) it binds `<dir>/<own account>/<sha256(store)[:24]>.sock`,
mode 0666 so that any account may connect (a stale socket file of a previous run is
replaced), and answers requests:

- the asking user is never taken from the request: it is the connecting process's uid, as
  the kernel reports it (SO_PEERCRED), mapped through SKYFN_PEER_IDENTITIES (root's file
  {"<uid>": ["<skyfn user id>", ...]}, re-read when it changes) to the skyfn users of that uid;
- the capability is verified with the store's secret (skyfn.data.capability.verify) and must
  name one of those users as owner or reader, and not be expired;
- a request's `evict` is honoured only when the capability grants it (Capability.may_evict:
  the owner, or a reader of a ref its owner made use-once): a reader's copy marked evict
  reads the object and removes nothing;
- then the object's bytes are read through the store's connector and sent; a refusal says
  why (not shared with you, expired, forged, no such object).

Connections are served concurrently up to `max_connections` (more are answered "busy"); a
connection idle for `idle_timeout` seconds is closed. Capabilities and secrets are never
logged. Stopping closes the sockets and removes their files (when they are still this
broker's). Standalone (tests, or a host without an agent):

    SKYFN_PEER_REFS_DIR=/run/skyfn-peer-refs SKYFN_PEER_IDENTITIES=/etc/skyfn/peer-identities.json \\
        python -m endpoint_agent.data.ref_broker --stores-file ~/.skyfn/endpoints/ep/data/stores.json
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pwd
import secrets
import selectors
import socket
import stat
import sys
import threading
from typing import Any, Optional

from endpoint_agent.procutil import serve_until_signalled
from skyfn.data import capability
from skyfn.data.connectors import from_config
from skyfn.data.peer import LineReader, identities, peer_uid
from skyfn.protocol.peer_refs import (OPS, PEER_IDENTITIES_ENV, PEER_REFS_DIR_ENV, PROTOCOL_VERSION, encode_line,
                                      refusal, socket_path)

log = logging.getLogger("skyfn.agent.peer_refs")

SKIPPED_KINDS = ("direct",)   # served by the object server of the direct path, which checks capabilities itself


class _Served:
    """One store the broker serves: its connector, its secret, its listening socket."""

    def __init__(self, name: str, connector, secret: bytes, path: str):
        self.name, self.connector, self.secret, self.path = name, connector, secret, path
        self.sock: Optional[socket.socket] = None
        self.inode: Optional[int] = None


class RefBroker:
    """Serves the stores `stores` ({name: {"connector": config, "secret": hex}}, the stores
    file's shape) to other accounts of this host (see the module docstring)."""

    def __init__(self, stores: dict[str, dict], directory: str, identities_path: Optional[str], *,
                 account: Optional[str] = None, max_connections: int = 64, idle_timeout: float = 60.0):
        if not directory:
            raise ValueError(f"the peer-ref broker needs a directory ({PEER_REFS_DIR_ENV})")
        if not identities_path:
            raise ValueError(f"the peer-ref broker needs {PEER_IDENTITIES_ENV}: the file that maps uids to skyfn "
                             "users (the multi-user endpoint keeps it)")
        self.directory = os.path.abspath(directory)
        self.identities = identities(identities_path)
        self.account = account or pwd.getpwuid(os.geteuid()).pw_name
        self.account_dir = os.path.join(self.directory, self.account)
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.stores_spec = stores
        self.served: dict[str, _Served] = {}
        self.stats = {"connections": 0, "served": 0, "bytes": 0, "refused": 0, "busy": 0}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._accept: Optional[threading.Thread] = None

    @property
    def where(self) -> str:
        return f"peer-ref broker of account {self.account}"

    @property
    def sockets(self) -> list[str]:
        return [s.path for s in self.served.values()]

    # ---- lifecycle ------------------------------------------------------------------------------

    def start(self) -> "RefBroker":
        """Bind a socket per store and serve on a background thread; RuntimeError naming the
        problem when the account directory is missing or not the account's."""
        self._check_account_dir()
        try:
            for name, spec in self.stores_spec.items():
                conn_cfg = spec["connector"]
                if conn_cfg.get("kind") in SKIPPED_KINDS:
                    continue
                served = _Served(name, from_config(conn_cfg), bytes.fromhex(spec["secret"]),
                                 socket_path(self.directory, self.account, name))
                self.served[name] = served
                self._bind(served)
        except BaseException:
            self.stop()
            raise
        self._accept = threading.Thread(target=self._run, name="peer-refs-accept", daemon=True)
        self._accept.start()
        log.info("%s serves %s in %s", self.where, ", ".join(self.served) or "no store", self.account_dir)
        return self

    def _check_account_dir(self) -> None:
        try:
            st = os.lstat(self.account_dir)
        except FileNotFoundError:
            raise RuntimeError(f"the {self.where}: {self.account_dir} does not exist; the multi-user endpoint creates "
                               f"it (owned by {self.account}, mode 0755) before starting the user agent") from None
        if not stat.S_ISDIR(st.st_mode):
            raise RuntimeError(f"the {self.where}: {self.account_dir} is not a directory (a symlink or a file); "
                               "remove it and let the multi-user endpoint create it")
        if st.st_uid != os.geteuid():
            raise RuntimeError(f"the {self.where}: {self.account_dir} belongs to uid {st.st_uid}, not to this "
                               f"account (uid {os.geteuid()}): consumers would not trust its sockets; chown it to "
                               f"{self.account}")

    def _bind(self, served: _Served) -> None:
        """Bind under a temporary name, open it to every account (0666), then rename it over the
        store's socket path: a stale socket of a previous run is replaced in one step."""
        if os.path.lexists(served.path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.settimeout(1.0)
            try:
                probe.connect(served.path)
                log.warning("%s: another broker of this account served store %s at %s; this one replaces it",
                            self.where, served.name, served.path)
            except OSError:
                pass                                     # a stale socket file of a previous run
            finally:
                probe.close()
        tmp = os.path.join(self.account_dir, f".{secrets.token_hex(6)}.tmp")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(tmp)
            os.chmod(tmp, 0o666)
            sock.listen(128)
            os.replace(tmp, served.path)
        except BaseException:
            sock.close()
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        sock.setblocking(False)
        served.sock = sock
        served.inode = os.stat(served.path).st_ino

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving: close the sockets, remove their files (if still this broker's), end the
        connections being served."""
        self._stop.set()
        if self._accept is not None:
            self._accept.join(timeout)
        for served in self.served.values():
            if served.sock is not None:
                served.sock.close()
                served.sock = None
            try:
                if served.inode is not None and os.stat(served.path).st_ino == served.inode:
                    os.unlink(served.path)
            except FileNotFoundError:
                pass
            served.inode = None
            try:
                served.connector.close()
            except Exception as exc:  # a connector that fails to close must not keep the sockets
                log.debug("%s: closing the connector of %s: %s", self.where, served.name, exc)
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in threads:
            t.join(timeout)

    def __enter__(self) -> "RefBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- connections --------------------------------------------------------------------------------

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        for served in self.served.values():
            sel.register(served.sock, selectors.EVENT_READ, served)
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(0.5):
                    try:
                        conn, _ = key.fileobj.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError as exc:
                        if self._stop.is_set():
                            return
                        log.warning("%s: accept on %s failed: %s", self.where, key.data.path, exc)
                        continue
                    self._admit(conn)
        finally:
            sel.close()

    def _admit(self, conn: socket.socket) -> None:
        conn.setblocking(True)
        with self._lock:
            self.stats["connections"] += 1
            busy = len(self._conns) >= self.max_connections
            if busy:
                self.stats["busy"] += 1
            else:
                self._conns.add(conn)
        if busy:
            conn.settimeout(1.0)
            try:
                conn.sendall(encode_line(refusal("busy", f"the {self.where} serves {self.max_connections} "
                                                         "connections already; retry later")))
            except OSError:
                pass
            conn.close()
            return
        t = threading.Thread(target=self._serve, args=(conn,), name="peer-refs-conn", daemon=True)
        with self._lock:
            self._threads.add(t)
        t.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(self.idle_timeout)
            uid = peer_uid(conn)
            reader = LineReader(conn)
            while not self._stop.is_set():
                try:
                    raw = reader.line()
                except ValueError as exc:              # a header line too long: the stream is not ours
                    conn.sendall(encode_line(refusal("invalid", f"malformed request to the {self.where}: {exc}")))
                    break
                if raw is None:
                    break
                head, payload = self.handle(raw, uid)
                try:
                    conn.sendall(encode_line(head))
                    if payload is not None:
                        with memoryview(payload) as view:
                            conn.sendall(view)
                finally:
                    if payload is not None and hasattr(payload, "close") and not isinstance(payload, memoryview):
                        payload.close()
        except (OSError, ConnectionError):   # idle past the timeout, the consumer went away, or stop()
            pass
        finally:
            conn.close()
            with self._lock:
                self._conns.discard(conn)
                self._threads.discard(threading.current_thread())

    # ---- one request ----------------------------------------------------------------------------------

    def handle(self, raw: bytes, uid: int) -> tuple[dict, Any]:
        """(reply, bytes or None) for one request line from a process running as `uid`."""
        try:
            req = json.loads(raw)
            if not isinstance(req, dict) or req.get("op") not in OPS:
                raise ValueError(f"op must be one of {', '.join(OPS)}")
            for field in ("store", "key", "cap"):
                if not isinstance(req.get(field), str) or not req[field]:
                    raise ValueError(f"{field} must be a non-empty string")
        except ValueError as exc:
            return refusal("invalid", f"malformed request to the {self.where}: {exc}"), None
        if req.get("v") != PROTOCOL_VERSION:
            return refusal("invalid", f"the {self.where} speaks protocol {PROTOCOL_VERSION}, the consumer "
                                      f"{req.get('v')!r}: use the same skyfn version in both user agents"), None
        store, key = req["store"], req["key"]
        served = self.served.get(store)
        if served is None:
            return refusal("invalid", f"the {self.where} does not serve store {store!r}"), None
        try:
            users = self.identities.users_of(uid)
        except ValueError as exc:
            log.error("%s: %s", self.where, exc)
            return self._refuse(store, key, uid, f"the {self.where} cannot tell who uid {uid} is: {exc}")
        try:
            cap = capability.verify(served.secret, store, key, req["cap"])
        except ValueError as exc:   # forged, altered, for another store or key, or expired: the message says which
            return self._refuse(store, key, uid, f"{exc} (checked by the {self.where})")
        if not any(cap.allows(u) for u in users):
            who = f"{', '.join(users)} (uid {uid})" if users else f"uid {uid}, which runs no skyfn user on this host"
            return self._refuse(store, key, uid, f"it belongs to {cap.owner} and is not shared with {who}: ask its "
                                                 f"owner to share it (store.ref(obj, share_with=[...])); refused by "
                                                 f"the {self.where}")
        try:
            if req["op"] == "exists":
                return {"ok": True, "exists": bool(served.connector.exists(key))}, None
            data = served.connector.get(key)
            evict = bool(req.get("evict")) and any(cap.may_evict(u) for u in users)
            if data is not None and evict:
                served.connector.evict(key)
            elif data is not None and req.get("evict"):
                log.info("%s: uid %d asked to evict %s/%s, which its capability does not allow: served, kept",
                         self.where, uid, store, key)
        except Exception as exc:  # the store's backend (its Redis down, a disk error): the consumer gets the reason
            log.warning("%s: reading %s/%s failed: %s: %s", self.where, store, key, type(exc).__name__, exc)
            return refusal("failed", f"the {self.where} could not read store {store}: {type(exc).__name__}: "
                                     f"{exc}"), None
        if data is None:
            return refusal("missing", f"no such object in store {store}: evicted by its owner, past its TTL, or "
                                      f"already used (a ref made with evict=True resolves once); told by the "
                                      f"{self.where}"), None
        size = memoryview(data).nbytes
        with self._lock:
            self.stats["served"] += 1
            self.stats["bytes"] += size
        log.info("%s: served %s/%s (%d bytes) to uid %d", self.where, store, key, size, uid)
        return {"ok": True, "size": size}, data

    def _refuse(self, store: str, key: str, uid: int, reason: str) -> tuple[dict, None]:
        with self._lock:
            self.stats["refused"] += 1
        log.info("%s: refused %s/%s to uid %d: %s", self.where, store, key, uid, reason)
        return refusal("denied", reason), None


def start_if_configured(stores: dict[str, dict]) -> Optional[RefBroker]:
    """The data plane's broker when SKYFN_PEER_REFS_DIR is set (a multi-user endpoint's user
    agent), else None."""
    directory = os.environ.get(PEER_REFS_DIR_ENV)
    if not directory:
        return None
    return RefBroker(stores, directory, os.environ.get(PEER_IDENTITIES_ENV)).start()


# ---- standalone -------------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m endpoint_agent.data.ref_broker",
                                description="Serve this account's shared refs to other accounts of this host "
                                            "(a multi-user endpoint's peer-ref broker).")
    p.add_argument("--stores-file", required=True, help="the endpoint's stores.json (holds the stores' secrets)")
    p.add_argument("--dir", default=None, help=f"the peer-refs directory (default: ${PEER_REFS_DIR_ENV})")
    p.add_argument("--identities", default=None, help=f"the uid -> skyfn users file (default: ${PEER_IDENTITIES_ENV})")
    p.add_argument("--max-connections", type=int, default=64)
    p.add_argument("--idle-timeout", type=float, default=60.0)
    p.add_argument("--ready-file", default=None, help="written (JSON) once serving")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from skyfn.data.store import read_stores_file

    try:
        stores = read_stores_file(args.stores_file).get("stores", {})
        broker = RefBroker(stores, args.dir or os.environ.get(PEER_REFS_DIR_ENV, ""),
                           args.identities or os.environ.get(PEER_IDENTITIES_ENV),
                           max_connections=args.max_connections, idle_timeout=args.idle_timeout).start()
    except (ValueError, OSError, RuntimeError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    serve_until_signalled({"sockets": broker.sockets, "pid": os.getpid()}, args.ready_file)
    broker.stop(timeout=2.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
