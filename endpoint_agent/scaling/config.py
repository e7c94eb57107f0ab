"""Scaling settings: `ScalingConfig` (the `blocks:` section of the endpoint config,
validated; errors name the key, the bad value and what is allowed) and the provider and
launcher a config builds (endpoint_agent.providers, endpoint_agent.launchers).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from endpoint_agent.launchers import Launcher, make_launcher
from endpoint_agent.providers import Provider, make_provider
from endpoint_agent.providers.base import parse_walltime

SCALING_ALLOWED: dict[str, str] = {
    "provider": "one of: local, slurm, pbs",
    "launcher": "one of: single, srun, mpiexec (default: single for 1-node blocks, srun on Slurm, mpiexec on PBS)",
    "launcher_options": "a string of extra launcher options, e.g. '--cpu-bind=none'",
    "nodes_per_block": "an integer from 1 to 100000",
    "min_blocks": "an integer from 0 to 10000, at most max_blocks",
    "max_blocks": "an integer from 0 to 10000",
    "init_blocks": "an integer from 0 to 10000, between min_blocks and max_blocks",
    "workers_per_node": "an integer from 1 to 4096 (default: the endpoint's workers)",
    "parallelism": "a number from 0 to 1 (fraction of the excess work covered by new blocks)",
    "max_idletime": "a number of seconds from 0 to 604800",
    "strategy_period": "a number of seconds from 0.1 to 3600",
    "walltime": "HH:MM:SS, D-HH:MM:SS or a number of seconds",
    "partition": "a Slurm partition name",
    "queue": "a PBS queue name (on Slurm: the partition)",
    "account": "an account / project name to charge",
    "qos": "a Slurm QOS name",
    "constraint": "a Slurm node constraint (--constraint)",
    "exclusive": "true or false (Slurm --exclusive)",
    "cores_per_node": "an integer from 1 to 100000 (Slurm --cpus-per-task, PBS select ncpus)",
    "mem_per_node": "a Slurm memory size such as 64G",
    "select_options": "extra PBS select resources, e.g. 'ngpus=4:mem=64gb'",
    "scheduler_options": "extra lines for the batch script, e.g. '#SBATCH --gres=gpu:4'",
    "worker_init": "shell lines run on the node before the managers start, e.g. 'module load python'",
    "cmd_timeout": "a number of seconds from 1 to 600",
    "submit_backoff_max": "a number of seconds from 1 to 86400",
}


class ScalingConfig(BaseModel):
    """Providers, launchers and elasticity. YAML keys are these field names; `aggressiveness`
    is accepted for `parallelism`."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    provider: Literal["local", "slurm", "pbs"] = "local"
    launcher: Optional[Literal["single", "srun", "mpiexec"]] = None
    launcher_options: str = ""
    nodes_per_block: int = Field(default=1, ge=1, le=100_000)
    min_blocks: int = Field(default=0, ge=0, le=10_000)
    max_blocks: int = Field(default=1, ge=0, le=10_000)
    init_blocks: int = Field(default=0, ge=0, le=10_000)
    workers_per_node: Optional[int] = Field(default=None, ge=1, le=4096)
    parallelism: float = Field(default=1.0, ge=0.0, le=1.0, alias="aggressiveness")
    max_idletime: float = Field(default=120.0, ge=0, le=604_800)
    strategy_period: float = Field(default=5.0, ge=0.1, le=3600)
    walltime: float = Field(default=3600.0, description="seconds; HH:MM:SS accepted")
    # scheduler options (Parsl's names)
    partition: Optional[str] = Field(default=None, min_length=1)
    queue: Optional[str] = Field(default=None, min_length=1)
    account: Optional[str] = Field(default=None, min_length=1)
    qos: Optional[str] = Field(default=None, min_length=1)
    constraint: Optional[str] = Field(default=None, min_length=1)
    exclusive: bool = True
    cores_per_node: Optional[int] = Field(default=None, ge=1, le=100_000)
    mem_per_node: Optional[str] = Field(default=None, pattern=r"^\d+[KMGT]?$")
    select_options: str = ""
    scheduler_options: str = ""
    worker_init: str = ""
    cmd_timeout: float = Field(default=30.0, ge=1, le=600)
    submit_backoff_max: float = Field(default=300.0, ge=1, le=86_400)

    @field_validator("walltime", mode="before")
    @classmethod
    def _walltime(cls, v: Any) -> float:
        return parse_walltime(v)

    @model_validator(mode="after")
    def _consistent(self) -> "ScalingConfig":
        if self.min_blocks > self.max_blocks:
            raise ValueError(f"key 'min_blocks': value {self.min_blocks} is greater than max_blocks "
                             f"({self.max_blocks}); allowed: an integer from 0 to max_blocks")
        if self.init_blocks > self.max_blocks:
            raise ValueError(f"key 'init_blocks': value {self.init_blocks} is greater than max_blocks "
                             f"({self.max_blocks}); allowed: an integer from min_blocks to max_blocks")
        launcher = self.launcher_name
        if self.nodes_per_block > 1 and launcher == "single":
            raise ValueError(f"key 'launcher': value 'single' starts one manager but nodes_per_block is "
                             f"{self.nodes_per_block}; allowed: srun (Slurm) or mpiexec")
        if launcher == "srun" and self.provider != "slurm":
            raise ValueError(f"key 'launcher': value 'srun' needs provider slurm (provider is {self.provider!r}); "
                             "allowed: single, mpiexec")
        if self.provider == "local" and self.nodes_per_block > 1:
            raise ValueError(f"key 'nodes_per_block': value {self.nodes_per_block} with provider 'local' "
                             "(blocks run on this machine); allowed: 1")
        if self.provider == "slurm" and self.partition and self.queue and self.partition != self.queue:
            raise ValueError(f"key 'queue': value {self.queue!r} disagrees with partition {self.partition!r}; "
                             "allowed: give one of them")
        return self

    @property
    def launcher_name(self) -> str:
        if self.launcher:
            return self.launcher
        if self.nodes_per_block == 1:
            return "single"
        return "srun" if self.provider == "slurm" else "mpiexec"

    def effective_init_blocks(self) -> int:
        return max(self.min_blocks, min(self.init_blocks, self.max_blocks))


def format_scaling_error(exc: ValidationError, source: str, prefix: str = "") -> str:
    lines = [f"invalid scaling configuration in {source}:"]
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        key = prefix + (".".join(loc) if loc else "")
        top = loc[0] if loc else ""
        if top == "aggressiveness":
            top = "parallelism"
        if err.get("type") == "extra_forbidden":
            lines.append(f"  unknown key '{key}' (value {err.get('input')!r}); allowed keys: "
                         f"{', '.join(SCALING_ALLOWED)}")
        elif not loc:
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            lines.append(f"  {msg}")
        else:
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            lines.append(f"  key '{key}': value {err.get('input')!r} is not allowed ({msg}); "
                         f"allowed: {SCALING_ALLOWED.get(top, '?')}")
    return "\n".join(lines)


class ScalingConfigError(ValueError):
    pass


def parse_scaling_config(data: Any, source: str = "config", prefix: str = "") -> ScalingConfig:
    """Validate a mapping (YAML) into a ScalingConfig; ScalingConfigError names key, value, allowed."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ScalingConfigError(f"invalid scaling configuration in {source}: expected a mapping, "
                                 f"got {type(data).__name__}")
    try:
        return ScalingConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise ScalingConfigError(format_scaling_error(exc, source, prefix)) from None


def build_provider(cfg: ScalingConfig, script_dir: Optional[Path] = None, env: Optional[Mapping[str, str]] = None
                   ) -> Provider:
    common: dict[str, Any] = {"script_dir": script_dir, "worker_init": cfg.worker_init, "env": env}
    if cfg.provider == "local":
        return make_provider("local", **common)
    common.update(scheduler_options=cfg.scheduler_options, cmd_timeout=cfg.cmd_timeout, account=cfg.account)
    if cfg.provider == "slurm":
        return make_provider("slurm", partition=cfg.partition or cfg.queue, qos=cfg.qos, constraint=cfg.constraint,
                             exclusive=cfg.exclusive, cores_per_node=cfg.cores_per_node,
                             mem_per_node=cfg.mem_per_node, **common)
    return make_provider("pbs", queue=cfg.queue or cfg.partition, cpus_per_node=cfg.cores_per_node,
                         select_options=cfg.select_options, **common)


def build_launcher(cfg: ScalingConfig) -> Launcher:
    return make_launcher(cfg.launcher_name, cfg.launcher_options)
