"""The object server of the direct data path: an endpoint serves the objects it keeps to
consumers on other endpoints, peer to peer through NATs (skyfn/data/connectors/direct.py).

It holds a LISTEN connection to the rendezvous server under its name (PINGs keep it and the
NAT mapping alive; it reconnects when the server goes away). Each consumer's CALL gives
both a fresh 2-rank group; the server joins it as rank 0 on a thread of its own, so
several consumers are served at once, and answers the consumer's requests on that channel
until it is idle for `timeout` seconds: it checks the ref's capability with the store's
secret and that the asking user is its owner or a reader, then sends the object's bytes
as one zero-copy message (an mmap of the file) or an error naming the reason. Expired
objects are swept from the directory every `sweep_every` seconds.

The agent starts it when the endpoint's config has `data: direct: {rendezvous: ...}`
(`DirectData` below); standalone (tests, benchmarks, a host without an agent):

    SKYFN_RENDEZVOUS_SECRET=... SKYFN_DIRECT_STORE_SECRET=<hex> python -m endpoint_agent.data.object_server \\
        --rendezvous rdv.example.org:7300 --name objects.ep-1 --store results --directory /dev/shm/objects

Neither the rendezvous secret, tokens nor the store's secret are ever logged or put on a
command line (environment variables or files only).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from endpoint_agent.procutil import serve_until_signalled
from skyfn.data import capability
from skyfn.data.connectors.direct import default_directory, expiry_of, map_object, object_path, rendezvous_token
from skyfn.protocol.objects import PROTOCOL_VERSION, SECRET_ENV, TAG_DATA, TAG_REPLY, TAG_REQUEST, TOKEN_ENV

log = logging.getLogger("skyfn.objects")

STORE_SECRET_ENV = "SKYFN_DIRECT_STORE_SECRET"


# ---- the `data: direct:` section of an endpoint's config.yaml ---------------------------------

class DirectData(BaseModel):
    """`data: direct:` -- the endpoint serves its direct store's objects to other endpoints.

        data:
          direct:
            rendezvous: rdv.example.org:7300   # required: the rendezvous server both endpoints reach
            name: objects.<endpoint id>        # the listener name (default shown)
            directory: /dev/shm/skyfn-direct-objects.<endpoint id>   # where objects live (default: memory-backed)
            token_file: ~/.skyfn/direct.token  # or secret_file, or SKYFN_DIRECT_TOKEN / SKYFN_RENDEZVOUS_SECRET
            timeout: 120                       # seconds per transfer; an idle channel closes after it
            punch_timeout: 3
            max_channels: 64                   # consumers served at once (more are answered busy)
    """

    model_config = ConfigDict(extra="forbid")

    rendezvous: str = Field(pattern=r"^(\[[^\]]+\]|[^:\s\[\]]+):[0-9]{1,5}$")
    name: Optional[str] = Field(default=None, pattern=r"^[A-Za-z0-9._:@-]{1,110}$")
    directory: Optional[str] = None
    token_file: Optional[str] = None
    secret_file: Optional[str] = None
    token_env: str = TOKEN_ENV
    secret_env: str = SECRET_ENV
    timeout: float = Field(default=120.0, gt=0, le=86400)
    punch_timeout: float = Field(default=3.0, gt=0, le=60)
    max_channels: int = Field(default=64, ge=1, le=4096)

    @field_validator("rendezvous")
    @classmethod
    def _port(cls, value: str) -> str:
        port = int(value.rsplit(":", 1)[1])
        if not 0 < port < 65536:
            raise ValueError(f"port {port} is not a TCP port (1-65535)")
        return value

    def listener_name(self, endpoint_id: str) -> str:
        return self.name or f"objects.{endpoint_id}"[:110]

    def connector_config(self, endpoint_id: str) -> dict:
        """The DirectConnector config the endpoint's stores file (and every ref) carries."""
        name = self.listener_name(endpoint_id)
        cfg = {"kind": "direct", "rendezvous": self.rendezvous, "name": name,
               "directory": os.path.abspath(os.path.expanduser(self.directory or default_directory(name))),
               "endpoint_id": endpoint_id, "timeout": self.timeout, "punch_timeout": self.punch_timeout}
        for k in ("token_file", "secret_file"):
            if getattr(self, k):
                cfg[k] = os.path.expanduser(getattr(self, k))
        for k, default in (("token_env", TOKEN_ENV), ("secret_env", SECRET_ENV)):
            if getattr(self, k) != default:
                cfg[k] = getattr(self, k)
        return cfg


def parse_direct_config(section: Any) -> DirectData:
    """`data: direct:` validated; ValueError naming the key, the value and what is allowed."""
    from pydantic import ValidationError

    if not isinstance(section, dict):
        raise ValueError(f"data.direct must be a mapping with at least 'rendezvous: host:port', got {section!r}")
    try:
        return DirectData.model_validate(section)
    except ValidationError as exc:
        allowed = ", ".join(DirectData.model_fields)
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err.get("loc", ())) or "(section)"
            if err.get("type") == "extra_forbidden":
                problems.append(f"unknown key data.direct.{key}; allowed keys: {allowed}")
            elif err.get("type") == "missing":
                problems.append(f"data.direct.{key} is required (the rendezvous server as host:port)")
            else:
                problems.append(f"data.direct.{key}: {err.get('input')!r} is not allowed ({err.get('msg')})")
        raise ValueError("; ".join(problems)) from None


# ---- serving ------------------------------------------------------------------------------------

def _reply(code: str, reason: str) -> dict:
    return {"ok": False, "code": code, "reason": reason}


@dataclass
class ObjectServer:
    """Serves the objects in `directory` of the stores in `stores` (name -> secret) under the
    listener `name` at `rendezvous`. `token` gives the LISTEN token (asked at every connect)."""

    rendezvous: str
    name: str
    directory: str
    stores: dict[str, bytes]
    token: Callable[[], str]
    endpoint_id: Optional[str] = None
    timeout: float = 120.0
    punch_timeout: float = 3.0
    max_channels: int = 64
    ping_interval: float = 15.0
    sweep_every: float = 30.0
    stats: dict = field(default_factory=lambda: {"calls": 0, "served": 0, "bytes": 0, "refused": 0,
                                                 "failed_joins": 0})

    def __post_init__(self):
        self.directory = os.path.abspath(os.path.expanduser(self.directory))
        self.stores = {k: (bytes.fromhex(v) if isinstance(v, str) else v) for k, v in self.stores.items()}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._active = 0
        self._listener = None
        self._thread: Optional[threading.Thread] = None
        self._channels: set[threading.Thread] = set()

    def __repr__(self) -> str:
        return f"ObjectServer({self.name!r} at {self.rendezvous}, {self.directory})"

    @property
    def where(self) -> str:
        ep = f" of endpoint {self.endpoint_id}" if self.endpoint_id else ""
        return f"object server {self.name}{ep}"

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> "ObjectServer":
        """Create the directory, LISTEN once (a bad token or a taken name raise here), then serve
        on a background thread. An unreachable rendezvous server is retried in the background."""
        from rendezvous.client import RendezvousError

        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        try:
            self._listener = self._listen()
        except RendezvousError as exc:
            if exc.code in ("bad_token", "expired_token", "name_taken", "malformed"):
                raise RuntimeError(f"{self.where}: the rendezvous server {self.rendezvous} refused LISTEN: "
                                   f"{exc.code}: {exc.reason}") from None
            log.warning("%s: rendezvous server %s: %s; retrying in the background", self.where, self.rendezvous, exc)
        except OSError as exc:
            log.warning("%s: cannot reach the rendezvous server %s (%s); retrying in the background", self.where,
                        self.rendezvous, exc)
        self._thread = threading.Thread(target=self._run, name=f"objects-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop listening; channels being served end within `timeout` seconds or with the process."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        lst, self._listener = self._listener, None
        if lst is not None:
            lst.close()
        deadline = time.monotonic() + timeout
        for t in list(self._channels):
            t.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> "ObjectServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def listening(self) -> bool:
        return self._listener is not None

    def _listen(self):
        from rendezvous import client

        lst = client.listen(self.rendezvous, self.name, self.token(), timeout=30.0, ping_interval=self.ping_interval)
        log.info("%s listening at %s, objects in %s", self.where, self.rendezvous, self.directory)
        return lst

    def _run(self) -> None:
        from rendezvous.client import RendezvousError

        backoff = 0.5
        next_sweep = time.monotonic() + self.sweep_every
        while not self._stop.is_set():
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + self.sweep_every
                self.sweep()
            if self._listener is None:
                try:
                    self._listener = self._listen()
                    backoff = 0.5
                except (RendezvousError, OSError) as exc:
                    log.warning("%s: LISTEN at %s failed (%s); again in %.1f s", self.where, self.rendezvous,
                                getattr(exc, "code", exc), backoff)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 15.0)
                    continue
            try:
                call = self._listener.next_call(timeout=0.5)
            except (RendezvousError, OSError) as exc:
                log.warning("%s: lost the rendezvous server %s (%s); listening again", self.where, self.rendezvous,
                            getattr(exc, "reason", exc))
                self._listener.sock.close()
                self._listener = None
                continue
            if call is not None:
                t = threading.Thread(target=self._serve_call, args=call, name=f"objects-{call[0]}", daemon=True)
                with self._lock:
                    self._channels.add(t)
                t.start()

    def sweep(self) -> int:
        from skyfn.data.connectors.file import FileConnector

        try:
            n = FileConnector(self.directory).sweep()
        except OSError as exc:
            log.warning("%s: sweeping %s failed: %s", self.where, self.directory, exc)
            return 0
        if n:
            log.info("%s: %d expired objects removed", self.where, n)
        return n

    # ---- one consumer's channel -------------------------------------------------------------------

    def _serve_call(self, group: str, token: str) -> None:
        from comm import Communicator
        from comm.errors import CommError, TimeoutError as CommTimeout

        self.stats["calls"] += 1
        try:
            try:
                comm = Communicator.join(group, self.rendezvous, token, 2, rank=0, timeout=self.timeout,
                                         punch_timeout=self.punch_timeout)
            except CommError as exc:
                self.stats["failed_joins"] += 1
                log.warning("%s: call %s: no channel to the consumer: %s", self.where, group, exc)
                return
            with self._lock:
                self._active += 1
                busy = self._active > self.max_channels
            try:
                mode = comm.stats()[1]["mode"]
                log.info("%s: consumer channel %s (%s)", self.where, group, mode)
                while not self._stop.is_set():
                    try:
                        raw = comm.recv(1, TAG_REQUEST)
                    except CommTimeout:
                        break                      # idle for `timeout` seconds: the consumer calls again
                    except CommError:
                        break                      # the consumer closed or went away
                    if busy:
                        head, payload = _reply("busy", f"the {self.where} serves {self.max_channels} consumers "
                                                       "already; retry later"), None
                    else:
                        head, payload = self.handle(bytes(raw))
                    try:
                        if payload is not None:      # counted before the consumer can have it
                            self.stats["served"] += 1
                            self.stats["bytes"] += len(payload)
                        comm.send(json.dumps(head).encode(), 1, TAG_REPLY)
                        if payload is not None:
                            comm.send(payload, 1, TAG_DATA)
                    except CommError as exc:
                        log.info("%s: channel %s ended while sending: %s", self.where, group, exc)
                        break
                    finally:
                        if hasattr(payload, "close"):
                            payload.close()
                    if busy:
                        break                          # the consumer calls again later, on a fresh channel
            finally:
                with self._lock:
                    self._active -= 1
                comm.close()
        finally:
            with self._lock:
                self._channels.discard(threading.current_thread())

    # ---- one request ---------------------------------------------------------------------------------

    def handle(self, raw: bytes) -> tuple[dict, Any]:
        """(reply, bytes or None) for one request (see the channel protocol in direct.py)."""
        try:
            req = json.loads(raw)
            if not isinstance(req, dict) or req.get("op") not in ("get", "exists", "evict"):
                raise ValueError("op must be get, exists or evict")
            key = req.get("key")
            path = object_path(self.directory, key)
        except (ValueError, TypeError) as exc:
            return _reply("invalid", f"malformed request to the {self.where}: {exc}"), None
        if req.get("v") != PROTOCOL_VERSION:
            return _reply("invalid", f"the {self.where} speaks protocol {PROTOCOL_VERSION}, the consumer "
                                     f"{req.get('v')!r}: use the same skyfn version on both endpoints"), None
        if req["op"] == "exists":
            expires = expiry_of(path)
            alive = os.path.exists(path) and (expires is None or time.time() <= expires)
            return {"ok": True, "exists": alive}, None
        store, user = req.get("store"), req.get("user")
        secret = self.stores.get(store)
        if secret is None:
            return _reply("invalid", f"the {self.where} serves store {', '.join(sorted(self.stores))}, not "
                                     f"{store!r}: the ref names another store's connector"), None
        try:
            cap = capability.verify(secret, store, key, req.get("cap") or "")
        except ValueError as exc:
            self.stats["refused"] += 1
            code = "expired" if "expired" in str(exc) else "denied"
            log.info("%s: refused %s/%s: %s", self.where, store, key, exc)
            return _reply(code, f"{exc} (checked by the {self.where})"), None
        if req["op"] == "evict":
            if user is None or user != cap.owner:
                self.stats["refused"] += 1
                return _reply("denied", f"only its owner {cap.owner} may evict it, not {user or 'an unknown user'} "
                                        f"(refused by the {self.where})"), None
            existed = os.path.exists(path)
            self._unlink(path)
            log.info("%s: %s evicted %s/%s", self.where, user, store, key)
            return {"ok": True, "evicted": existed}, None
        if not cap.allows(user):
            self.stats["refused"] += 1
            log.info("%s: refused %s/%s to %s (owner %s)", self.where, store, key, user, cap.owner)
            return _reply("denied", f"it belongs to {cap.owner} and is not shared with {user or 'an unknown user'}: "
                                    "ask its owner to share it (store.ref(obj, share_with=[...])); refused by the "
                                    f"{self.where}"), None
        expires = expiry_of(path)
        if expires is not None and time.time() > expires:
            self._unlink(path)
            return _reply("missing", "its TTL passed at "
                                     f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(expires))}: the "
                                     f"{self.where} no longer keeps it"), None
        if req.get("evict") and cap.may_evict(user):  # a reader's copy marked evict: served, kept
            taken = f"{path}.taken.{uuid.uuid4().hex}"   # claim it: two consumers of a use-once ref race here
            try:
                os.rename(path, taken)
            except FileNotFoundError:
                taken = None
            data = map_object(taken) if taken else None
            if taken:
                self._unlink(taken)
                self._unlink(path)
        else:
            data = map_object(path)
        if data is None:
            return _reply("missing", f"no such object on the {self.where}: evicted by its owner, past its TTL, or "
                                     "already used (a ref made with evict=True resolves once)"), None
        return {"ok": True, "size": len(data)}, data

    @staticmethod
    def _unlink(path: str) -> None:
        for p in (path, path + ".ttl"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


# ---- a server process (the agent's, or standalone) -----------------------------------------------

def _store_secrets(store: str, stores_file: Optional[str], secret_file: Optional[str]) -> dict[str, bytes]:
    if stores_file:
        from skyfn.data.store import read_stores_file

        doc = read_stores_file(stores_file)
        spec = doc.get("stores", {}).get(store)
        if spec is None:
            raise ValueError(f"store {store!r} is not in {stores_file} (it has {', '.join(doc.get('stores', {}))})")
        return {store: bytes.fromhex(spec["secret"])}
    secret = os.environ.get(STORE_SECRET_ENV)
    if secret_file:
        with open(os.path.expanduser(secret_file)) as f:
            secret = f.read().strip()
    if not secret:
        raise ValueError(f"no secret for store {store!r}: set {STORE_SECRET_ENV} (hex), or pass --store-secret-file "
                         "or --stores-file (the endpoint's stores.json)")
    try:
        return {store: bytes.fromhex(secret)}
    except ValueError:
        raise ValueError(f"the secret of store {store!r} is not hex (Store.secret.hex())") from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m endpoint_agent.data.object_server",
                                description="Serve an endpoint's direct-store objects to consumers on other "
                                            "endpoints, peer to peer through NATs.")
    p.add_argument("--rendezvous", required=True, help="rendezvous server host:port")
    p.add_argument("--name", required=True, help="listener name (consumers' connector config names it)")
    p.add_argument("--store", required=True, help="the store whose refs are served (capabilities name it)")
    p.add_argument("--directory", default=None, help="where the objects are (default: under /dev/shm)")
    p.add_argument("--stores-file", default=None, help="the endpoint's stores.json (holds the store's secret)")
    p.add_argument("--store-secret-file", default=None, help=f"file with the store's hex secret (or ${STORE_SECRET_ENV})")
    p.add_argument("--token-file", default=None, help=f"file with the LISTEN token (or ${TOKEN_ENV})")
    p.add_argument("--secret-file", default=None, help=f"file with the rendezvous secret (or ${SECRET_ENV})")
    p.add_argument("--endpoint-id", default=None)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--punch-timeout", type=float, default=3.0)
    p.add_argument("--max-channels", type=int, default=64)
    p.add_argument("--ready-file", default=None, help="written (JSON) once listening")
    p.add_argument("--die-with-parent", action="store_true", help="exit when the parent (the agent) dies")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    if args.die_with_parent:
        from endpoint_agent.procutil import die_with_parent

        die_with_parent(signal.SIGTERM)
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        stores = _store_secrets(args.store, args.stores_file, args.store_secret_file)
        token = lambda: rendezvous_token(args.name, TOKEN_ENV, args.token_file, SECRET_ENV, args.secret_file)  # noqa: E731
        token()                                          # a missing token is a clear error now, not in a thread
        server = ObjectServer(args.rendezvous, args.name, args.directory or default_directory(args.name), stores,
                              token, endpoint_id=args.endpoint_id, timeout=args.timeout,
                              punch_timeout=args.punch_timeout, max_channels=args.max_channels).start()
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    serve_until_signalled({"listening": server.name, "directory": server.directory, "pid": os.getpid()},
                          args.ready_file)
    server.stop(timeout=2.0)
    return 0


class ServerProcess:
    """A `python -m endpoint_agent.data.object_server` child (the agent's, tests', benchmarks')."""

    def __init__(self, proc: subprocess.Popen, info: dict):
        self.proc, self.info = proc, info

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_process(args: list[str], env: Optional[dict] = None, ready_timeout: float = 30.0,
                  prefix: Optional[list[str]] = None, log_file: Optional[str] = None) -> ServerProcess:
    """Start the object server with `args` (see `parser()`; secrets by `env`), wait until it
    listens; `prefix` runs it under another command (e.g. `ip netns exec NS`)."""
    import tempfile

    from endpoint_agent.procutil import child_env

    ready = os.path.join(tempfile.mkdtemp(prefix="skyfn-objects-"), "ready.json")
    err = open(log_file, "ab") if log_file else subprocess.DEVNULL
    proc = subprocess.Popen([*(prefix or []), sys.executable, "-m", "endpoint_agent.data.object_server", *args,
                             "--ready-file", ready], env=child_env(env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=err)
    if log_file:
        err.close()
    deadline = time.monotonic() + ready_timeout
    while not os.path.exists(ready):
        if proc.poll() is not None:
            said = ""
            if log_file:
                with open(log_file, errors="replace") as f:
                    lines = [ln.strip() for ln in f if ln.strip()]
                said = f": {lines[-1]}" if lines else ""
            raise RuntimeError(f"the object server exited with code {proc.returncode} before listening{said}"
                               + (f" (log: {log_file})" if log_file else ""))
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait(5)
            raise RuntimeError(f"the object server did not listen within {ready_timeout:g} s")
        time.sleep(0.02)
    with open(ready) as f:
        info = json.load(f)
    os.unlink(ready)
    os.rmdir(os.path.dirname(ready))
    return ServerProcess(proc, info)


def start_for_endpoint(settings: DirectData, endpoint_id: str, store: str, store_secret_hex: str,
                       data_dir: str) -> tuple[ServerProcess, dict]:
    """The agent's object server for `data: direct:` (a child that dies with the agent; its
    log in `data_dir/object_server.log`) and the store's connector config. The store's secret
    reaches it by environment; the rendezvous token by the agent's environment or the
    section's token_file / secret_file."""
    cfg = settings.connector_config(endpoint_id)
    args = ["--rendezvous", cfg["rendezvous"], "--name", cfg["name"], "--store", store, "--directory",
            cfg["directory"], "--endpoint-id", endpoint_id, "--timeout", str(settings.timeout), "--punch-timeout",
            str(settings.punch_timeout), "--max-channels", str(settings.max_channels), "--die-with-parent"]
    if settings.token_file:
        args += ["--token-file", cfg["token_file"]]
    if settings.secret_file:
        args += ["--secret-file", cfg["secret_file"]]
    env = {STORE_SECRET_ENV: store_secret_hex}
    if settings.token_env != TOKEN_ENV and os.environ.get(settings.token_env):
        env[TOKEN_ENV] = os.environ[settings.token_env]
    if settings.secret_env != SECRET_ENV and os.environ.get(settings.secret_env):
        env[SECRET_ENV] = os.environ[settings.secret_env]
    proc = start_process(args, env=env, log_file=os.path.join(data_dir, "object_server.log"))
    log.info("object server %s (pid %d) serves store %s from %s", cfg["name"], proc.pid, store, cfg["directory"])
    return proc, cfg


if __name__ == "__main__":
    sys.exit(main())
