"""The endpoint's data stores at run time: start its Redis, publish its stores to workers.

When the config has a `data:` section (endpoint_agent.data.config) the agent, once it
knows its endpoint id:
- starts a redis-server beside itself (`redis: start: true`, or `auto` when the binary is
  installed) with a generated password in a 0600 config file -- never on a command line --
  or uses the Redis the config names;
- writes the stores file (`<endpoint dir>/data/stores.json`, 0600: it holds the stores'
  secret) and points SKYFN_DATA_STORES at it, so managers and workers (which inherit the
  agent's environment) know the endpoint's stores: `skyfn.data.get_redis_client()`,
  `default_store()` and refs of these stores resolve there;
- on a multi-user endpoint (SKYFN_PEER_REFS_DIR set by its root process), runs the peer-ref
  broker (endpoint_agent.data.ref_broker): tasks of other accounts on this host resolve the
  refs this account shared with them through it, never with this account's credentials;
- stops the broker and the Redis it started when the agent stops.

Store names are qualified with the endpoint id (`redis@<endpoint id>`): refs made on two
endpoints never name each other's store.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

from endpoint_agent.data.config import DataConfig
from endpoint_agent.data.redis_process import (end_recorded_redis, end_redis, free_port, is_redis, launch,
                                                  port_free, secret_file)
from skyfn.data import context
from skyfn.data.store import write_stores_file

log = logging.getLogger("skyfn.agent.data")

REDIS_START_TIMEOUT_S = 15.0


def qualified(name: str, endpoint_id: str) -> str:
    return f"{name}@{endpoint_id}"


def end_leftover_redis(endpoint_dir: Path) -> Optional[int]:
    """End the data redis-server an agent of this endpoint started and left running (it was
    killed hard, and no agent came back to keep it); returns its pid, or None."""
    return end_recorded_redis(Path(endpoint_dir) / "data" / "redis.json")


class EndpointData:
    """The running data plane of one endpoint (see the module docstring)."""

    def __init__(self, config: DataConfig, endpoint_dir: Path, endpoint_id: str):
        self.config = config
        self.dir = Path(endpoint_dir) / "data"
        self.endpoint_id = endpoint_id
        self.redis_proc: Optional[subprocess.Popen] = None
        self.adopted_pid: Optional[int] = None  # a redis-server a previous agent of this endpoint started
        self.redis_port: Optional[int] = None
        self.stores_file = self.dir / "stores.json"
        self.objects = None   # the direct path's object server (endpoint_agent.data.object_server.ServerProcess)
        self.broker = None    # a multi-user endpoint's peer-ref broker (endpoint_agent.data.ref_broker.RefBroker)

    def start(self) -> "EndpointData":
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        secret = secret_file(self.dir / "secret")
        stores: dict[str, dict] = {}
        rcfg = self.config.redis
        if rcfg is not None:
            connector = self._redis(rcfg)
            if connector is not None:
                stores[qualified("redis", self.endpoint_id)] = {"connector": connector, "secret": secret}
        for name, spec in self.config.stores.items():
            conn = {k: v for k, v in spec.items() if k != "connector"}
            stores[qualified(name, self.endpoint_id)] = {"connector": {"kind": spec["connector"], **conn},
                                                         "secret": secret}
        if self.config.direct is not None:
            from endpoint_agent.data.object_server import start_for_endpoint

            name = qualified("direct", self.endpoint_id)
            self.objects, connector = start_for_endpoint(self.config.direct, self.endpoint_id, name, secret,
                                                         str(self.dir))
            stores[name] = {"connector": connector, "secret": secret}
        default = self.config.default or ("redis" if qualified("redis", self.endpoint_id) in stores else None)
        write_stores_file(str(self.stores_file), stores,
                          qualified(default, self.endpoint_id) if default else None, self.endpoint_id)
        os.environ[context.STORES_ENV] = str(self.stores_file)
        os.environ[context.ENDPOINT_ENV] = self.endpoint_id
        log.info("data stores: %s (default %s)", ", ".join(stores) or "none", default or "none")
        self._start_broker(stores)
        return self

    def _start_broker(self, stores: dict[str, dict]) -> None:
        """The peer-ref broker when SKYFN_PEER_REFS_DIR is set. A broker that cannot start does not
        stop the agent (its own user's tasks still run): the error says what to fix."""
        from endpoint_agent.data.ref_broker import start_if_configured

        try:
            self.broker = start_if_configured(stores)
        except (RuntimeError, ValueError, OSError) as exc:
            log.error("the peer-ref broker did not start, so refs this account shares do not resolve in other "
                      "accounts' tasks: %s", exc)

    def _redis(self, rcfg) -> Optional[dict]:
        start = rcfg.start
        binary = shutil.which("redis-server")
        if start == "auto":
            start = binary is not None
            if not start:
                log.info("data.redis: redis-server is not installed here, so no Redis store (install it, or set "
                         "data.redis.start: false with the host, port and password_file of an existing Redis)")
                return None
        password_file = os.path.expanduser(rcfg.password_file) if rcfg.password_file else None
        if start:
            if binary is None:
                raise RuntimeError("data.redis.start is true but redis-server is not on PATH: install it "
                                   "(apt-get install redis-server) or point data.redis at an existing Redis")
            if password_file is None:
                password_file = str(self.dir / "redis.password")
                secret_file(Path(password_file), 24)
            self._start_redis(binary, rcfg, password_file)
            port = self.redis_port
        else:
            port = rcfg.port
        from skyfn.data.connectors.redis import RedisConnector

        connector = RedisConnector(rcfg.host, port, password_file=password_file, username=rcfg.username, db=rcfg.db,
                                   ssl=rcfg.tls, ssl_ca_certs=rcfg.tls_ca_certs, chunk_bytes=rcfg.chunk_bytes)
        try:
            return connector.config()  # what workers rebuild it from: no secret, the password's file
        finally:
            connector.close()

    def _start_redis(self, binary: str, rcfg, password_file: str) -> None:
        """Start the endpoint's redis-server -- or keep the one a previous agent of this endpoint
        started, when it still runs (an agent killed hard leaves it up): refs made before the
        restart then still resolve, and no second server is started beside it."""
        import redis

        with open(password_file) as f:
            password = f.read().strip()
        record = self._redis_record()
        if record and record.get("host") == rcfg.host and is_redis(record.get("pid")):
            client = redis.Redis(host=rcfg.host, port=record["port"], password=password, socket_timeout=2)
            try:
                client.ping()
                self.redis_port, self.adopted_pid = record["port"], record["pid"]
                log.info("kept the endpoint's redis-server of the previous run on %s:%d (pid %d): refs made before "
                         "the restart still resolve", rcfg.host, record["port"], record["pid"])
                return
            except redis.RedisError:
                pass
            finally:
                client.close()
        port = rcfg.port or (record or {}).get("port") or 0
        if not port or not port_free(rcfg.host, port):
            port = rcfg.port or free_port(rcfg.host)
        lines = [f"port {port}", f"bind {rcfg.host}", f"requirepass {password}", 'save ""', "appendonly no",
                 f"dir {self.dir}", "protected-mode yes", f"logfile {self.dir / 'redis.log'}",
                 "maxmemory-policy noeviction"]
        if rcfg.maxmemory:
            lines.append(f"maxmemory {rcfg.maxmemory}")
        try:
            self.redis_proc = launch(binary, self.dir / "redis.conf", lines, host=rcfg.host, port=port,
                                     password=password, log_path=self.dir / "redis.log",
                                     timeout=REDIS_START_TIMEOUT_S)
        except RuntimeError:
            self.stop()
            raise RuntimeError(f"the endpoint's redis-server did not start on {rcfg.host}:{port} "
                               f"(see {self.dir / 'redis.log'})") from None
        self.redis_port = port
        (self.dir / "redis.json").write_text(json.dumps({"pid": self.redis_proc.pid, "port": port,
                                                         "host": rcfg.host}))
        log.info("started redis-server for the endpoint's data on %s:%d (pid %d)", rcfg.host, port,
                 self.redis_proc.pid)

    def _redis_record(self) -> Optional[dict]:
        try:
            return json.loads((self.dir / "redis.json").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def stop(self) -> None:
        broker, self.broker = self.broker, None
        if broker is not None:
            broker.stop()
        objects, self.objects = self.objects, None
        if objects is not None:
            objects.stop()
        proc, self.redis_proc = self.redis_proc, None
        adopted, self.adopted_pid = self.adopted_pid, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        elif adopted is not None and is_redis(adopted):  # started by this endpoint's previous agent
            end_redis(adopted)
        try:
            (self.dir / "redis.json").unlink()
        except FileNotFoundError:
            pass
