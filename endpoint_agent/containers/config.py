"""`containers:` section of the endpoint configuration: which runtime wraps the workers,
which container *types* exist (type name -> image and options), and the warm-pool policy.

    containers:
      runtime: podman          # none | docker | podman | apptainer | singularity | bubblewrap
      idle_timeout: 300        # seconds an idle warm worker is kept before it is stopped
      max_per_type: null       # at most this many workers of one type (null: all slots)
      demand_half_life: 60     # seconds; task counts per type decay with this half-life
      prewarm: false           # start idle slots for the types in demand (proportional sizing)
      default_type: null       # type of tasks that name none (null: plain worker, no container)
      extra_args: []           # added to every `<runtime> run` command
      routing: warm            # warm: warming-aware placement in the manager; random: funcX's baseline
      routing_seed: null       # seed of random routing (null: a fresh one); for tests and benchmarks
      types:
        numpy:
          image: docker.io/library/python:3.11   # podman/docker: registry image, or a rootfs directory (podman)
          python: host                           # host: bind the host interpreter + code; or a path inside the image
          mounts: ["/data:/data:ro"]
          env: {OMP_NUM_THREADS: "1"}
          options: ["--memory=2g"]

Errors name the key, the bad value and the allowed values (see `parse_container_config`).
"""
from __future__ import annotations

import re
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

RUNTIMES = ("none", "docker", "podman", "apptainer", "singularity", "bubblewrap")
TYPE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")

ALLOWED: dict[str, str] = {
    "runtime": "one of: " + ", ".join(RUNTIMES),
    "executable": "a path to the runtime's binary (default: found on PATH)",
    "idle_timeout": "a number of seconds from 0 to 604800",
    "max_per_type": "an integer from 1 to 100000, or null",
    "demand_half_life": "a number of seconds from 0.1 to 86400",
    "prewarm": "true or false",
    "default_type": "null or the name of a type under `types`",
    "extra_args": "a list of strings",
    "routing": "one of: warm, random",
    "routing_seed": "an integer, or null",
    "types": "a mapping of type names (letters, digits, _ . : / -) to {image, python, mounts, env, options}",
    "image": "podman/docker: an image name or (podman) an absolute rootfs directory; apptainer: a .sif file, "
             "a sandbox directory or docker://...; bubblewrap: an absolute root filesystem directory; "
             "all but docker/apptainer: `host` (the host's /usr and /etc, read-only)",
    "python": "`host` (bind the host interpreter, virtualenv and skyfn code read-only) or an absolute path "
              "to a Python inside the image that has skyfn installed",
    "mounts": "a list of `host_path[:container_path[:ro|rw]]` with absolute paths",
    "env": "a mapping of variable names to strings",
    "options": "a list of strings added to the run command of this type",
}


class ContainerConfigError(ValueError):
    """A `containers:` section that cannot be used; the message says what to change."""


class ContainerType(BaseModel):
    model_config = ConfigDict(extra="forbid")

    image: str = Field(min_length=1, max_length=4096)
    python: str = "host"
    mounts: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    options: list[str] = Field(default_factory=list)

    @field_validator("python")
    @classmethod
    def _python(cls, v: str) -> str:
        if v != "host" and not v.startswith("/"):
            raise ValueError("must be `host` or an absolute path")
        return v

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for m in v:
            parse_mount(m)
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
                raise ValueError(f"environment variable name {k!r} is not valid")
        return v


def parse_mount(spec: str) -> tuple[str, str, bool]:
    """`src[:dst[:ro|rw]]` -> (src, dst, read_only). Read-only unless `:rw`."""
    parts = spec.split(":")
    if not 1 <= len(parts) <= 3 or not parts[0].startswith("/"):
        raise ValueError(f"mount {spec!r}: expected host_path[:container_path[:ro|rw]] with absolute paths")
    src = parts[0]
    dst = parts[1] if len(parts) > 1 and parts[1] else src
    mode = parts[2] if len(parts) > 2 else "ro"
    if not dst.startswith("/") or mode not in ("ro", "rw"):
        raise ValueError(f"mount {spec!r}: expected host_path[:container_path[:ro|rw]] with absolute paths")
    return src, dst, mode == "ro"


class ContainerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    runtime: Literal["none", "docker", "podman", "apptainer", "singularity", "bubblewrap"] = "none"
    executable: Optional[str] = Field(default=None, min_length=1)
    idle_timeout: float = Field(default=300.0, ge=0, le=604800)
    max_per_type: Optional[int] = Field(default=None, ge=1, le=100000)
    demand_half_life: float = Field(default=60.0, ge=0.1, le=86400)
    prewarm: bool = False
    default_type: Optional[str] = None
    extra_args: list[str] = Field(default_factory=list)
    routing: Literal["warm", "random"] = "warm"
    routing_seed: Optional[int] = None
    types: dict[str, ContainerType] = Field(default_factory=dict)

    @field_validator("types")
    @classmethod
    def _type_names(cls, v: dict[str, ContainerType]) -> dict[str, ContainerType]:
        for name in v:
            if not TYPE_NAME.match(name):
                raise ValueError(f"type name {name!r} is not allowed")
        return v

    @model_validator(mode="after")
    def _cross(self) -> "ContainerConfig":
        if self.default_type is not None and self.default_type not in self.types:
            raise ValueError(_keyed("default_type", self.default_type,
                                    "null or one of the types: " + (", ".join(self.types) or "(none defined)")))
        for name, t in self.types.items():
            key = f"types.{name}.image"
            img = t.image
            if self.runtime == "docker" and (img.startswith("/") or img == "host"):
                raise ValueError(_keyed(key, img, "a registry image name (docker cannot run a root filesystem directory)"))
            if self.runtime == "bubblewrap" and not (img == "host" or img.startswith("/")):
                raise ValueError(_keyed(key, img, "`host` or an absolute root filesystem directory (bubblewrap pulls no images)"))
            if self.runtime in ("apptainer", "singularity") and img == "host":
                raise ValueError(_keyed(key, img, "a .sif file, a sandbox directory or docker://..."))
        return self


def _keyed(key: str, value: Any, allowed: str) -> str:
    return f"@@{key}@@{value!r}@@{allowed}"


def format_container_error(exc: ValidationError, source: str = "config", prefix: str = "containers") -> str:
    lines = [f"invalid `{prefix}` section in {source}:"]
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        msg = str(err.get("msg", ""))
        if "@@" in msg:  # cross-field check: key, value and allowed values are in the message
            _, key, value, allowed = msg.split("@@", 3)
            lines.append(f"  key '{prefix}.{key}': value {value} is not allowed; allowed: {allowed}")
            continue
        key = ".".join([prefix, *loc])
        leaf = next((p for p in reversed(loc) if p in ALLOWED), loc[0] if loc else "")
        if err.get("type") == "extra_forbidden":
            scope = "type" if len(loc) >= 3 and loc[0] == "types" else "section"
            keys = ", ".join(ContainerType.model_fields) if scope == "type" else ", ".join(ContainerConfig.model_fields)
            lines.append(f"  unknown key '{key}' (value {err.get('input')!r}); allowed keys: {keys}")
            continue
        allowed = ALLOWED.get(leaf, "see the `containers` section of the endpoint config template")
        lines.append(f"  key '{key}': value {err.get('input')!r} is not allowed ({msg}); allowed: {allowed}")
    return "\n".join(lines)


def parse_container_config(data: Any, source: str = "config") -> ContainerConfig:
    """Validate a `containers:` mapping; raises ContainerConfigError naming key, value, allowed."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ContainerConfigError(f"invalid `containers` section in {source}: expected a mapping, got {type(data).__name__}")
    try:
        return ContainerConfig.model_validate(data)
    except ValidationError as exc:
        raise ContainerConfigError(format_container_error(exc, source)) from None


TEMPLATE = """\
# --- Containers (funcX-style warm containers) -----------------------------------
# containers:
#   runtime: none            # none | docker | podman | apptainer | singularity | bubblewrap
#   idle_timeout: 300        # seconds an idle warm container is kept
#   max_per_type: null       # cap per container type (null: any number of slots)
#   demand_half_life: 60     # seconds; per-type demand counts decay with this half-life
#   prewarm: false           # start empty slots for types in demand, in proportion to it
#   default_type: null       # type for tasks that name none (null: a plain worker)
#   routing: warm            # warm (warming-aware placement) | random (funcX's baseline, benchmarks)
#   types:
#     mytype:
#       image: host          # podman/bubblewrap: host /usr read-only; or a rootfs dir / image name
#       python: host         # bind the host interpreter + skyfn read-only, or a path in the image
"""
