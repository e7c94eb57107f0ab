"""The endpoint configuration: `$SKYFN_HOME/endpoints/<name>/config.yaml`, validated.

Every key is optional; defaults suit a laptop or a login node. Invalid files are refused
with an error that names the key, the bad value and what is allowed. The service URL
and token come from config.yaml when set there, else from the environment
(SKYFN_SERVICE_URL, SKYFN_TOKEN), else from the client config `$SKYFN_HOME/config.json`.

Giving `task_queue` and `results_queue` (and optionally `endpoint_id`) runs the agent
without the service: no registration, no heartbeats (tests, air-gapped set-ups).
"""
from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from endpoint_agent import allowlist, yaml_text
from endpoint_agent.data.config import DataConfig
from endpoint_agent.errors import ConfigError
from endpoint_agent.paths import EndpointPaths, skyfn_home
from skyfn.private_file import write_private
from skyfn.protocol.allowlist import AllowedFunction
from skyfn.protocol.api import QueueDescriptor
from skyfn.protocol.messages import PACK_MAX_TASKS

log = logging.getLogger("skyfn.agent.config")

# key -> why it no longer does anything
OBSOLETE_KEYS = {
    "result_flush_ms": "results leave by group commit since issue 37: at once when nothing is in flight, "
                       "together when a send is; result_batch bounds a pack",
}


def _cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# What each key accepts, for error messages (kept next to the model so they agree).
ALLOWED: dict[str, str] = {
    "service_url": "an http:// or https:// URL",
    "token": "a non-empty string (the JWT of `skyfn login` / `skyfn local up`)",
    "provider": "one of: local, slurm, pbs",
    "blocks": "a mapping of block settings (endpoint_agent.scaling.ScalingConfig: nodes_per_block, min_blocks, "
              "max_blocks, init_blocks, workers_per_node, parallelism, max_idletime, walltime, partition, ...)",
    "containers": "a mapping (endpoint_agent.containers: runtime, idle_timeout, types, ...)",
    "workers": "an integer from 1 to 4096",
    "prefetch": "an integer from 0 to 1000000",
    "heartbeat_period": "a number of seconds from 0.1 to 3600",
    "lease_seconds": "a number of seconds from 1 to 43200",
    "receive_batch": "an integer from 1 to 1000",
    "receive_wait": "a number of seconds from 0 to 20",
    "result_batch": "an integer from 1 to 10000",
    "local_results_mb": "a number of MiB from 0 to 65536 (0: dependents always go through the service)",
    "grace_period": "a number of seconds from 0 to 86400",
    "max_task_retries": "an integer from 0 to 100",
    "log_level": "one of: DEBUG, INFO, WARNING, ERROR",
    "endpoint_id": "a string",
    "task_queue": "a queue descriptor {kind: redis|sqs, name: ..., url: ...}",
    "results_queue": "a queue descriptor {kind: redis|sqs, name: ..., url: ...}",
    "control_queue": "a queue descriptor {kind: redis|sqs, name: ..., url: ...}",
    "interchange_address": "an IP address or host name to bind (127.0.0.1: this machine only; 0.0.0.0: all)",
    "interchange_port": "an integer from 0 (any free port) to 65535",
    "interchange_advertise": "the host name or address managers on other nodes connect to",
    "encryption": "one of: auto (CurveZMQ unless the address is loopback), on, off",
    "manager_heartbeat_period": "a number of seconds from 0.05 to 600",
    "managers": "an integer from 0 to 256 (local managers the agent starts itself)",
    "manager_prefetch": "an integer from 0 to 100000",
    "max_output_bytes": "an integer from 0 to 16777216",
    "cores": "an integer from 1 to 65536",
    "accelerators": "a list of accelerator ids such as ['0', '1'], or 'auto' (CUDA_VISIBLE_DEVICES)",
    "placement_policy": "an aAPP policy (YAML text) choosing managers by function tag; see docs/placement.md",
    "data": "a mapping (endpoint_agent.data.config: default, redis, stores, globus, direct): the endpoint's "
            "data stores",
    "allowed_functions": "a list of function ids (UUIDs) and {owner, name} mappings: the only functions that may "
                         "run here (endpoint_agent/allowlist.py)",
    "engine": "a mapping {type: interchange (managers and worker processes, the default) or inline (tasks run in "
              "the agent's own process, by a thread pool shared by every agent of the process), threads: 1 to 1024 "
              "(inline: the pool's size)}; see endpoint_agent/README.md, \"The light agent\"",
    "direct": "a mapping {listen: the host to bind (127.0.0.1: this machine only; 0.0.0.0: all), port: 0 (any "
              "free port) to 65535, advertise: the host SDKs connect to, reach: address (SDKs connect to that "
              "port), rendezvous (no port: SDKs come through the service's rendezvous server, punched or "
              "relayed) or auto (both), punch_timeout: seconds}, or true for the defaults; absent: off",
}

LOOPBACK = ("127.0.0.1", "localhost", "::1", "ip6-localhost")


def is_loopback(address: str) -> bool:
    return address in LOOPBACK or address.startswith("127.")


class DirectConfig(BaseModel):
    """`direct:`: the socket SDKs send direct-session task packs to (endpoint_agent/direct/server.py)."""

    model_config = ConfigDict(extra="forbid")

    listen: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=0, ge=0, le=65535)
    advertise: Optional[str] = Field(default=None, min_length=1)
    # address: a TCP port SDKs connect to; rendezvous: no port at all, SDKs reach the agent
    # through the service's rendezvous server (skyfn.protocol.direct_path); auto: both
    reach: Literal["address", "rendezvous", "auto"] = "address"
    punch_timeout: float = Field(default=3.0, gt=0, le=60)

    @property
    def by_address(self) -> bool:
        return self.reach in ("address", "auto")

    @property
    def by_rendezvous(self) -> bool:
        return self.reach in ("rendezvous", "auto")

    @field_validator("listen", "advertise")
    @classmethod
    def _host(cls, value: Optional[str]) -> Optional[str]:
        """A host alone: the port has its own key."""
        if value is None:
            return value
        if "://" in value or any(c.isspace() for c in value):
            raise ValueError("give the host alone, e.g. 127.0.0.1 (no tcp://, no spaces; the port goes in direct.port)")
        if value.count(":") == 1:
            raise ValueError("give the host alone, without ':port' (the port goes in direct.port)")
        return value

    def advertised_host(self) -> str:
        """The host SDKs connect to (as interchange_advertise defaults)."""
        if self.advertise:
            return self.advertise
        return self.listen if self.listen not in ("0.0.0.0", "*") else socket.getfqdn()


class EngineConfig(BaseModel):
    """`engine:`: how the agent runs its tasks. `interchange` (the default): an interchange
    with managers and worker processes. `inline`: the light agent (endpoint_agent/light/),
    which runs them in its own process, on a thread pool shared by every agent of that
    process (`threads` its size) -- no interchange, manager or worker process."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["interchange", "inline"] = "interchange"
    threads: int = Field(default=4, ge=1, le=1024)

    @property
    def inline(self) -> bool:
        return self.type == "inline"


# what the inline engine cannot do: key -> why (EndpointConfig._inline_engine)
INLINE_REFUSES = {
    "blocks": "it starts no blocks of nodes",
    "containers": "it runs tasks in its own process, in no container",
    "placement_policy": "it has no managers to place tasks on",
    "direct": "direct sessions go to an interchange",
}


class EndpointConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _obsolete_keys(cls, data: Any) -> Any:
        """Keys of older versions that no longer do anything are dropped with a warning,
        so a config written for them still starts."""
        if isinstance(data, dict) and any(k in data for k in OBSOLETE_KEYS):
            data = dict(data)
            for key, why in OBSOLETE_KEYS.items():
                if key in data:
                    data.pop(key)
                    log.warning("config: %s is obsolete and ignored (%s); remove it", key, why)
        return data

    service_url: Optional[str] = Field(default=None, pattern=r"^https?://\S+$")
    token: Optional[str] = Field(default=None, min_length=1)
    provider: Literal["local", "slurm", "pbs"] = "local"
    blocks: Optional[dict[str, Any]] = None
    containers: Optional[dict[str, Any]] = None
    workers: int = Field(default_factory=_cpu_count, ge=1, le=4096)
    # Tasks taken from the queue beyond the free workers. A pack holds up to 512 tasks;
    # a few hundred keeps the next pack in memory before the current one runs dry, so
    # the workers never wait on a queue round trip.
    prefetch: Optional[int] = Field(default=None, ge=0, le=1_000_000)
    heartbeat_period: float = Field(default=10.0, ge=0.1, le=3600)
    lease_seconds: float = Field(default=60.0, ge=1, le=43200)
    receive_batch: int = Field(default=10, ge=1, le=1000)
    # SQS's longest long poll: an idle endpoint asks its queues 3 times a minute, not 60 (the
    # idle fleet's bill, docs/deploy.md); a task still comes at once, and a stop does not wait
    # for the poll (endpoint_agent/service/poller.py)
    receive_wait: float = Field(default=20.0, ge=0, le=20)
    result_batch: int = Field(default=500, ge=1, le=10000)
    # Results of this agent's tasks kept for dependents sent ahead of their inputs
    # (interchange/parked.py); a result over an eighth of this goes through the service.
    local_results_mb: float = Field(default=64.0, ge=0, le=65536)
    grace_period: float = Field(default=30.0, ge=0, le=86400)
    max_task_retries: int = Field(default=1, ge=0, le=100)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    endpoint_id: Optional[str] = None
    task_queue: Optional[QueueDescriptor] = None
    results_queue: Optional[QueueDescriptor] = None
    control_queue: Optional[QueueDescriptor] = None

    # --- interchange <-> managers --------------------------------------------------
    interchange_address: str = Field(default="127.0.0.1", min_length=1)
    interchange_port: int = Field(default=0, ge=0, le=65535)
    interchange_advertise: Optional[str] = None
    encryption: Literal["auto", "on", "off"] = "auto"
    manager_heartbeat_period: float = Field(default=2.0, ge=0.05, le=600)
    managers: int = Field(default=1, ge=0, le=256)
    manager_prefetch: Optional[int] = Field(default=None, ge=0, le=100_000)
    max_output_bytes: int = Field(default=64 * 1024, ge=0, le=16 * 1024 * 1024)
    cores: Optional[int] = Field(default=None, ge=1, le=65536)
    accelerators: Union[Literal["auto"], list[str]] = "auto"
    # aAPP policy text: the interchange places tasks on managers with it (endpoint_agent/interchange/placement.py)
    placement_policy: Optional[str] = Field(default=None, min_length=1, max_length=256 << 10)
    # the endpoint's data stores (skyfn.data): its Redis, named stores, Globus, direct
    data: Optional[DataConfig] = None
    # the only functions that may run here (None: any); checked by the service and by the agent
    allowed_functions: Optional[list[AllowedFunction]] = None
    # direct sessions: SDKs send task packs straight to the interchange (None: off)
    direct: Optional[DirectConfig] = None
    # how tasks run: an interchange with managers and workers, or inline (the light agent)
    engine: EngineConfig = Field(default_factory=EngineConfig)

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_type(cls, value: Any) -> Any:
        # `engine: inline` is short for `engine: {type: inline}`
        if isinstance(value, str):
            return {"type": value}
        return {} if value is None else value

    @field_validator("direct", mode="before")
    @classmethod
    def _direct_switch(cls, value: Any) -> Any:
        # `direct: true` turns it on with the defaults; `direct: false` is off
        if value is True:
            return {}
        if value is False:
            return None
        return value

    @field_validator("allowed_functions", mode="before")
    @classmethod
    def _allowlist(cls, value: Any) -> Any:
        try:
            return allowlist.parse_entries(value)
        except allowlist.AllowlistError as exc:
            where = f"entry {exc.index + 1}: " if exc.index is not None else ""
            raise ValueError(where + exc.reason) from None

    @property
    def encrypted(self) -> bool:
        """CurveZMQ between interchange and managers: on by default off loopback."""
        if self.encryption == "auto":
            return not is_loopback(self.interchange_address)
        return self.encryption == "on"

    @property
    def manager_prefetch_value(self) -> int:
        return self.manager_prefetch if self.manager_prefetch is not None else max(256, 64 * self.workers)

    @property
    def scaling(self):
        """colleague C's ScalingConfig when blocks come from a provider, else None (the agent
        then starts `managers` local managers itself)."""
        if self.blocks is None and self.provider == "local":
            return None
        from endpoint_agent.scaling import parse_scaling_config

        return parse_scaling_config({"provider": self.provider, **(self.blocks or {})}, "config", prefix="blocks.")

    @model_validator(mode="after")
    def _sections(self) -> "EndpointConfig":
        if self.blocks is not None or self.provider != "local":
            try:
                self.scaling
            except ImportError:  # pragma: no cover
                raise ValueError("provider blocks need endpoint_agent.scaling") from None
            except ValueError as exc:
                raise ValueError(f"blocks: {exc}") from None
        if self.containers is not None:
            try:
                from endpoint_agent.containers import parse_container_config

                parse_container_config(self.containers, "config")
            except ImportError:  # pragma: no cover
                raise ValueError("containers need endpoint_agent.containers") from None
            except ValueError as exc:
                raise ValueError(f"containers: {exc}") from None
        return self

    @model_validator(mode="after")
    def _inline_engine(self) -> "EndpointConfig":
        if self.engine.inline:
            given = [key for key in INLINE_REFUSES if getattr(self, key) is not None]
            if self.provider != "local":
                given.insert(0, "provider")
            if given:
                why = "; ".join(f"{k}: {INLINE_REFUSES.get(k, 'it runs tasks on this machine only')}" for k in given)
                raise ValueError(f"engine type inline (the light agent) cannot be combined with {', '.join(given)} "
                                 f"({why}); remove {'them' if len(given) > 1 else 'it'} or use engine type interchange")
        return self

    @model_validator(mode="after")
    def _placement(self) -> "EndpointConfig":
        if self.placement_policy is not None:
            from skyfn.placement import PolicyError, load_policy

            try:
                load_policy(self.placement_policy, source="placement_policy")
            except PolicyError as exc:
                raise ValueError("placement_policy rejected: " + "; ".join(str(p) for p in exc.problems)
                                 + " (lines count from the first line of the policy text)") from None
        return self

    @model_validator(mode="after")
    def _defaults(self) -> "EndpointConfig":
        if self.prefetch is None:
            object.__setattr__(self, "prefetch", max(PACK_MAX_TASKS // 2, 64 * self.workers))
        if (self.task_queue is None) != (self.results_queue is None):
            raise ValueError("task_queue and results_queue must be given together (or neither)")
        return self

    @property
    def capacity(self) -> int:
        """Tasks the agent holds at most: one per local worker plus the prefetch."""
        return max(1, self.workers * max(1, self.managers)) + int(self.prefetch or 0)

    @property
    def static_queues(self) -> bool:
        return self.task_queue is not None


def _keys_at(loc: list[str]) -> list[str]:
    """The keys allowed in the mapping at `loc` (a nested section's own keys, not the top level's)."""
    model: Any = EndpointConfig
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        inner = getattr(field, "annotation", None) if field else None
        for candidate in getattr(inner, "__args__", (inner,)):
            if hasattr(candidate, "model_fields"):
                model = candidate
                break
        else:
            return list(ALLOWED)
    return list(model.model_fields) if model is not EndpointConfig else list(ALLOWED)


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"invalid endpoint configuration in {source}:"]
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        key = ".".join(loc) or "(file)"
        top = loc[0] if loc else ""
        if err.get("type") == "extra_forbidden":
            lines.append(f"  unknown key '{key}' (value {err.get('input')!r}); allowed keys: "
                         f"{', '.join(_keys_at(loc[:-1]))}")
            continue
        allowed = ALLOWED.get(top, "see the template written by `skyfn-endpoint configure`")
        if not loc:
            lines.append(f"  {err.get('msg')}")
            continue
        lines.append(f"  key '{key}': value {err.get('input')!r} is not allowed ({err.get('msg')}); allowed: {allowed}")
    return "\n".join(lines)


def parse_config(data: Any, source: str = "config", text: Optional[str] = None) -> EndpointConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"invalid endpoint configuration in {source}: expected a mapping of keys to values, "
                          f"got {type(data).__name__}")
    if data.get(allowlist.KEY) is not None:  # first, so a bad entry is reported with its line
        try:
            data = {**data, allowlist.KEY: allowlist.parse_entries(data[allowlist.KEY])}
        except allowlist.AllowlistError as exc:
            raise ConfigError(allowlist.describe_error(exc, source, text)) from None
    try:
        return EndpointConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


def load_config(path: Path) -> EndpointConfig:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"no configuration at {path}: run `skyfn-endpoint configure NAME` first") from None
    return parse_config(yaml_text.load(text, str(path)), str(path), text)


def template(name: str) -> str:
    """The commented config.yaml written by `skyfn-endpoint configure`."""
    return f"""\
# skyfn endpoint "{name}"
# Every key is optional; the values shown commented out are the defaults.

# --- Service --------------------------------------------------------------
# Default: $SKYFN_HOME/config.json (written by `skyfn local up` / `skyfn login`),
# overridden by the environment variables SKYFN_SERVICE_URL and SKYFN_TOKEN.
# service_url: http://127.0.0.1:8080
# token: <jwt>

# --- Execution -------------------------------------------------------------
provider: local            # allowed: local, slurm, pbs
# blocks:                  # nodes from a batch scheduler (endpoint_agent.scaling); without it and with
#                          # provider local, the agent runs `managers` managers on this machine
#   nodes_per_block: 1
#   min_blocks: 0
#   max_blocks: 1
#   init_blocks: 0
#   workers_per_node: 4
#   parallelism: 1.0       # aggressiveness of scale-out
#   max_idletime: 120      # seconds a block may idle before it is drained and cancelled
#   walltime: "01:00:00"
#   partition: debug       # slurm; queue: for pbs; account, qos, constraint, scheduler_options, worker_init
# containers:              # workers in containers (endpoint_agent.containers)
#   runtime: podman        # none | docker | podman | apptainer | singularity | bubblewrap
#   idle_timeout: 300      # seconds an idle warm container is kept
#   types:
#     sci: {{image: /srv/rootfs/sci}}
# workers: {_cpu_count()}               # worker processes (default: CPU count)
# prefetch: 256            # tasks taken beyond free workers (default: max(256, 64 * workers))
# grace_period: 30         # seconds in-flight tasks may finish after SIGTERM
# max_task_retries: 1      # re-runs of a task whose worker process died under it
# engine:                  # how tasks run; the default: an interchange with managers and workers
#   type: inline           # the light agent: tasks run in this process on a shared thread pool
#   threads: 4             # (no managers, workers, containers, blocks or direct sessions)

# --- Queue and results -------------------------------------------------------
# lease_seconds: 60        # visibility timeout of task messages, extended every lease_seconds/3
# receive_batch: 10        # messages (task packs) per receive
# receive_wait: 20         # long-poll wait, seconds (a task comes at once; a stop does not wait for it)
# result_batch: 500        # results per result message at most
# local_results_mb: 64     # results kept here for dependents released on this endpoint
# heartbeat_period: 10     # seconds between heartbeats to the service

# --- Interchange and managers ----------------------------------------------------
# Managers on other nodes (provider blocks) connect to the interchange over TCP:
#   python -m endpoint_agent.manager --interchange tcp://HOST:PORT --block ID --workers N --server-key KEY
# interchange_address: 127.0.0.1   # bind address; 0.0.0.0 to accept managers from other nodes
# interchange_port: 0              # 0: any free port (written to status.json)
# interchange_advertise: <host>    # the address managers connect to (default: this host's name)
# encryption: auto                 # auto: CurveZMQ unless the address is loopback; on; off
#                                  # (the server key pair lives in this endpoint's directory, curve/)
# managers: 1                      # local managers the agent starts itself (each with `workers` workers)
# manager_heartbeat_period: 2      # a manager silent for 2 periods is lost; its tasks re-run
# manager_prefetch: 256            # tasks a manager holds beyond its workers (default max(256, 64 * workers));
#                                  # lower it (0-4) for long tasks spread over many nodes

# --- Tasks -------------------------------------------------------------------------
# max_output_bytes: 65536          # captured stdout / stderr per task and stream, then truncated
# cores: <CPU count>               # cores of this node shared out by tasks' resources (cores: n)
# accelerators: auto               # GPU ids, e.g. ["0", "1"]; auto: from CUDA_VISIBLE_DEVICES

# --- Direct sessions (SDKs send tasks straight to this agent; the service still authorizes) --
# direct:                          # absent: off. The socket is always CurveZMQ (key pair in curve/)
#   listen: 127.0.0.1              # bind address; 0.0.0.0 to take sessions from other machines
#   port: 0                        # 0: any free port (published with each heartbeat)
#   advertise: <host>              # the host SDKs connect to (default: listen, or this host's name)
#   reach: address                 # address: SDKs connect to that port; rendezvous: no port at all, SDKs
#                                  # come through the service's rendezvous server (punched, else relayed;
#                                  # behind a NAT or a site firewall); auto: both
#   punch_timeout: 3               # seconds to punch before the rendezvous relays

# --- Which functions may run here ------------------------------------------------
# allowed_functions:               # absent: any function its users may submit; a list: only these
#   - 0f8fad5b-d9cb-469f-a165-70867728950e   # a function id (Client.register_function returns it)
#   - {{owner: alice, name: simulate}}         # any function alice registered under this name

# --- Data (skyfn.data: large arguments and results by reference) -------------------
# Set (not a default): this endpoint keeps data by reference in its own Redis.
data:
  default: redis                   # where the Executor puts large arguments of tasks sent here
  redis:
    start: auto                    # start redis-server beside the agent (auto: if installed); false: use
                                   # an existing one (host, port and password_file then required)
#   host: 127.0.0.1
#   port: 0                        # 0: any free port
#   password_file: <generated>     # a Redis store always has a password
#   maxmemory: 4gb
# stores:                          # more named stores: connector redis | file | s3 | globus | direct
#   scratch: {{connector: file, directory: /shared/scratch/skyfn}}
# globus:                          # GlobusFile arguments staged in / outputs out, batched (docs/data.md)
#   collection: <UUID>             # this endpoint's Globus collection
#   root: /path/of/that/collection # the local directory its "/" is
#   batch_size: 100                # items per Transfer task; max_concurrent_transfers: 5
#   token_file: <endpoint dir>/globus_tokens.json   # client_id (+ client_secret_file) to refresh

# log_level: INFO          # DEBUG, INFO, WARNING, ERROR
"""


def write_template(paths: EndpointPaths, force: bool = False) -> Path:
    paths.ensure()
    if paths.config.exists() and not force:
        raise FileExistsError(f"{paths.config} exists; use --force to overwrite it")
    return write_private(paths.config, template(paths.name))  # private: it may come to hold a token


def resolve_service(config: EndpointConfig) -> tuple[str, str]:
    """(service_url, token): config.yaml, else environment, else the client config."""
    client: dict[str, Any] = {}
    client_path = skyfn_home() / "config.json"
    if client_path.exists():
        try:
            client = json.loads(client_path.read_text()) or {}
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{client_path}: not valid JSON ({exc}); rewrite it or set SKYFN_SERVICE_URL/SKYFN_TOKEN") from None
    url = config.service_url or os.environ.get("SKYFN_SERVICE_URL") or client.get("service_url")
    token = config.token or os.environ.get("SKYFN_TOKEN") or client.get("token")
    if not url:
        raise ConfigError(
            "no service URL: set service_url in config.yaml, or SKYFN_SERVICE_URL, or start the embedded "
            f"service with `skyfn local up` (which writes {client_path})"
        )
    if not token:
        raise ConfigError(f"no token: set token in config.yaml, or SKYFN_TOKEN, or the token key of {client_path}")
    return url.rstrip("/"), token


def resolve_url(config: EndpointConfig) -> str:
    """The service URL alone (an agent holding its endpoint's credential needs no user token)."""
    client: dict[str, Any] = {}
    client_path = skyfn_home() / "config.json"
    try:
        client = json.loads(client_path.read_text()) or {}
    except (OSError, ValueError):
        client = {}
    url = config.service_url or os.environ.get("SKYFN_SERVICE_URL") or client.get("service_url")
    if not url:
        raise ConfigError("no service URL: set service_url in config.yaml, or SKYFN_SERVICE_URL")
    return url.rstrip("/")
