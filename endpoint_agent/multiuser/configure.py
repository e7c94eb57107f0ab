"""`skyfn-endpoint configure --multi-user NAME`: the administrator's settings of a multi-user
endpoint (`MultiUserConfig`) and the commented example files it starts from.

Written into the endpoint's directory ($SKYFN_HOME/endpoints/NAME/, endpoint_agent/paths.py),
refusing to overwrite any of them without --force (checked for all before any is written):

    config.yaml                    the settings below, with `multi_user: true` (0600)
    identity_mapping.yaml          globus-identity-mapping documents: an expression rule over
                                   email, the external program shown in comments (0600)
    user_config_template.yaml.j2   the user agent's config, sandboxed Jinja2 (0644)
    user_config_schema.json        the JSON schema of the users' variables (0644)
    user_environment               the environment of user processes, KEY=VALUE (0600)

`load_multi_user_config(path)` reads config.yaml into a `MultiUserConfig` with relative
paths resolved against its directory; errors name the file, the key, the value and what is
allowed (`ConfigError`). A single-user agent refuses this config.yaml (`multi_user` is not
one of its keys), so `skyfn-endpoint start NAME` never runs it as an ordinary agent as root.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from endpoint_agent import yaml_text
from endpoint_agent.errors import ConfigError
from endpoint_agent.paths import EndpointPaths

PATH_KEYS = ("identity_mapping_file", "user_config_template", "user_config_schema", "user_environment_file",
             "audit_log")
FILES = {  # file name -> mode
    "config.yaml": 0o600,
    "identity_mapping.yaml": 0o600,
    "user_config_template.yaml.j2": 0o644,
    "user_config_schema.json": 0o644,
    "user_environment": 0o600,
}


class MultiUserConfig(BaseModel):
    """config.yaml of a multi-user endpoint."""

    model_config = ConfigDict(extra="forbid")

    multi_user: Literal[True]
    identity_mapping_file: str = Field(default="identity_mapping.yaml", min_length=1)
    user_config_template: str = Field(default="user_config_template.yaml.j2", min_length=1)
    user_config_schema: Optional[str] = Field(default="user_config_schema.json", min_length=1)
    user_environment_file: str = Field(default="user_environment", min_length=1)
    working_directory: str = Field(default="{home}/.skyfn/work", min_length=1)
    deny_accounts: list[str] = Field(default_factory=lambda: ["root", "nobody"])
    min_uid: int = Field(default=1000, ge=1, le=2**31)
    idle_timeout: float = Field(default=600.0, gt=0, le=7 * 86400)
    # a user agent's lane is unbound at the service once the agent has been idle this long (it has
    # stopped after idle_timeout): its users' next task comes through the router, which binds again
    lane_idle_timeout: float = Field(default=3600.0, gt=0, le=30 * 86400)
    # the service sends a mapped user's tasks to their user agent's lane directly (skyfn.protocol.lanes);
    # false: every task goes through the router, as where the service's queues are SQS
    lanes: bool = True
    audit_log: str = Field(default="audit.log", min_length=1)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # the interpreter user agents run with: every account must be able to run it and import skyfn
    user_agent_python: str = Field(default_factory=lambda: sys.executable, min_length=1)
    # sockets and files every account reads (the peer-ref brokers): not under root's home
    runtime_directory: str = Field(default="/run/skyfn/{name}", min_length=1)
    # a gid no group and no account has: user agents get it as an extra group, and the uid -> skyfn
    # identities file (identities.json in the runtime directory) is root's, 0640, of this group, so
    # only the user agents (whose peer-ref brokers need it) read it, not every account of the host
    peer_gid: int = Field(default=3_900_000_000, ge=1000, le=4_294_967_294)
    # the service link, as in an ordinary endpoint's config.yaml
    service_url: Optional[str] = Field(default=None, pattern=r"^https?://\S+$")
    token: Optional[str] = Field(default=None, min_length=1)
    heartbeat_period: float = Field(default=10.0, ge=0.1, le=3600)
    lease_seconds: float = Field(default=60.0, ge=1, le=43200)
    receive_batch: int = Field(default=10, ge=1, le=1000)
    receive_wait: float = Field(default=20.0, ge=0, le=20)  # an idle long poll: the agent's default
    max_routed_packs: int = Field(default=10_000, ge=1, le=1_000_000)

    @field_validator("user_agent_python")
    @classmethod
    def _python(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("give the absolute path of an interpreter every account may run, e.g. "
                             "/opt/skyfn/venv/bin/python")
        return value

    @field_validator("runtime_directory")
    @classmethod
    def _runtime_dir(cls, value: str) -> str:
        try:
            sample = value.format(name="site")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"only {{name}} may be used ({type(exc).__name__}: {exc})") from None
        if not sample.startswith("/") or "/../" in sample + "/":
            raise ValueError("it must give an absolute path without '..', e.g. /run/skyfn/{name}")
        return value

    @field_validator("lane_idle_timeout")
    @classmethod
    def _lane_idle(cls, value: float, info: ValidationInfo) -> float:
        idle = info.data.get("idle_timeout")
        if idle is not None and value < idle:
            raise ValueError(f"it is shorter than idle_timeout ({idle:g}): a lane is unbound only once its user agent "
                             f"has stopped idle; set lane_idle_timeout to at least {idle:g}, or lower idle_timeout")
        return value

    def endpoint_settings(self) -> dict[str, Any]:
        """The keys of an ordinary endpoint config the privileged process runs its service link with."""
        return {"service_url": self.service_url, "token": self.token, "heartbeat_period": self.heartbeat_period,
                "lease_seconds": self.lease_seconds, "receive_batch": self.receive_batch,
                "receive_wait": self.receive_wait, "log_level": self.log_level, "workers": 1, "managers": 0}

    @field_validator("working_directory")
    @classmethod
    def _workdir(cls, value: str) -> str:
        try:
            sample = value.format(home="/home/alice", user="alice")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"only {{home}} and {{user}} may be used ({type(exc).__name__}: {exc})") from None
        if not sample.startswith("/") or "/../" in sample + "/":
            raise ValueError("it must give an absolute path without '..', e.g. {home}/.skyfn/work or "
                             "/scratch/skyfn/{user}")
        return value

    @field_validator("deny_accounts")
    @classmethod
    def _deny(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if not v or any(c.isspace() or c in ":/" for c in v)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an account or group name")
        return value

    def path(self, key: str) -> Optional[Path]:
        value = getattr(self, key)
        return Path(value) if value is not None else None


def format_errors(exc: ValidationError, source: str) -> str:
    allowed = ", ".join(MultiUserConfig.model_fields)
    lines = [f"invalid multi-user endpoint configuration in {source}:"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err.get("loc", ())) or "(file)"
        if err.get("type") == "extra_forbidden":
            lines.append(f"  unknown key '{key}' (value {err.get('input')!r}); allowed keys: {allowed}")
        elif err.get("type") == "missing":
            lines.append(f"  key '{key}' is missing" + ("; a multi-user endpoint's config.yaml says "
                                                          "`multi_user: true`" if key == "multi_user" else ""))
        else:
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            lines.append(f"  key '{key}': value {err.get('input')!r} is not allowed ({msg})")
    return "\n".join(lines)


def parse_multi_user_config(data: Any, source: str, base: Optional[Path] = None) -> MultiUserConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"invalid multi-user endpoint configuration in {source}: expected a mapping of keys to "
                          f"values, got {type(data).__name__}")
    try:
        config = MultiUserConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, source)) from None
    if base is not None:
        update = {k: str(base / getattr(config, k)) for k in PATH_KEYS
                  if getattr(config, k) is not None and not Path(getattr(config, k)).is_absolute()}
        config = config.model_copy(update=update)
    return config


def load_multi_user_config(path: Path) -> MultiUserConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"no configuration at {path}: run `skyfn-endpoint configure --multi-user NAME` "
                          "first") from None
    return parse_multi_user_config(yaml_text.load(text, str(path)), str(path), base=path.parent)


def is_multi_user(path: Path) -> bool:
    """Whether config.yaml at `path` is a multi-user endpoint's (says `multi_user: true`)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and data.get("multi_user") is True


# --- the files ------------------------------------------------------------------------

def write_multi_user_files(paths: EndpointPaths, force: bool = False) -> list[Path]:
    """Write the five files of a multi-user endpoint; FileExistsError naming the existing ones."""
    paths.ensure()
    targets = [paths.dir / name for name in FILES]
    existing = [p for p in targets if p.exists()]
    if existing and not force:
        raise FileExistsError(f"{', '.join(str(p) for p in existing)} exist{'s' if len(existing) == 1 else ''}; "
                              "use --force to overwrite")
    texts = {
        "config.yaml": config_text(paths.name),
        "identity_mapping.yaml": mapping_text(paths.name),
        "user_config_template.yaml.j2": template_text(paths.name),
        "user_config_schema.json": schema_text(paths.name),
        "user_environment": environment_text(paths.name),
    }
    for target in targets:
        tmp = target.with_name(target.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILES[target.name])
        with os.fdopen(fd, "w") as f:
            f.write(texts[target.name])
        os.chmod(tmp, FILES[target.name])  # whatever the umask
        os.replace(tmp, target)
    return targets


def config_text(name: str) -> str:
    return f"""\
# skyfn multi-user endpoint "{name}" (DESIGN.md section 12)
# Run by the administrator as root. The identity that submitted each task is mapped to a
# local account (identity_mapping_file), and that user's tasks run in a *user agent*: an
# ordinary skyfn agent started as the account (groups, gid, uid dropped in that order), with
# the config rendered from user_config_template for the user's variables and the environment
# of user_environment_file only. Relative paths are in this directory.
# Start it with `skyfn-endpoint start {name}` (as root); docs/multi-user.md is the guide.
multi_user: true

# --- Who runs as whom ------------------------------------------------------------
identity_mapping_file: identity_mapping.yaml   # globus-identity-mapping documents (JSON if it ends .json)
deny_accounts: [root, nobody]   # accounts (or groups: every member) that never run user agents;
                           # root, uid 0 and group 0 are refused whatever this says
min_uid: 1000              # accounts below this uid (system accounts) are refused

# --- User agents ---------------------------------------------------------------------
user_config_template: user_config_template.yaml.j2   # sandboxed Jinja2; values are quoted YAML scalars
user_config_schema: user_config_schema.json          # JSON schema of Executor(user_config={{...}})
user_environment_file: user_environment              # KEY=VALUE; nothing of root's environment is passed
working_directory: "{{home}}/.skyfn/work"             # {{home}}, {{user}}; created 0700 for the account if missing
idle_timeout: 600          # seconds an idle user agent lives; the next task starts it again
lane_idle_timeout: 3600    # seconds idle after which a user agent's lane is unbound at the service
                           # (at least idle_timeout); the next task binds it again, through this process
lanes: true                # the service sends a mapped user's tasks straight to their user agent
                           # (its own queue at the service); false: all through this process

user_agent_python: {sys.executable}   # every account must be able to run it and import skyfn
runtime_directory: /run/skyfn/{{name}}   # the peer-ref sockets every account reaches ({{name}}: this endpoint)

# --- Audit -------------------------------------------------------------------------
audit_log: audit.log       # JSON lines: identity, account, uid, function, task, start, end, outcome (0600)
# log_level: INFO

# --- The service (as in an ordinary endpoint's config.yaml; else SKYFN_SERVICE_URL / SKYFN_TOKEN) ---
# service_url: https://skyfn.example.org
# heartbeat_period: 10
# lease_seconds: 60
"""


def mapping_text(name: str) -> str:
    return f"""\
# Identity mapping of multi-user endpoint "{name}": globus-identity-mapping documents, tried in
# order; the first account found wins. Each task carries its submitting identity's id, username,
# email and identity_provider. The account must exist here, not be root or denied (config.yaml).
#
# An expression rule: `source` with {{field}} interpolated is matched whole against `match`
# (a reduced regex: . ? * | ( ) and backslash escapes; no leading * or ?), and the account is
# `output`, where {{0}}, {{1}}... are match's groups. Options: ignore_case, literal.
- DATA_TYPE: expression_identity_mapping#1.0.0
  mappings:
    - source: "{{email}}"                 # alice@example.org -> alice
      match: "(.*)@example\\\\.org"
      output: "{{0}}"
#   - source: "{{username}}"              # a fixed identity to a fixed account
#     match: "operator@example.org"    # literal: the text as it is, no regex escapes
#     output: "ops"
#     literal: true
#
# An external program instead (or after): it is run as root with `-c skyfn-endpoint -s {name}`,
# reads {{"DATA_TYPE": "identity_mapping_input#1.0.0", "identities": [{{"id": ..., "username": ...}}]}}
# on stdin and prints {{"DATA_TYPE": "identity_mapping_output#1.0.0", "result": [{{"id": <the same
# id>, "output": "<account>"}}]}} (an empty result: not mapped), within 5 s. Identity ids must be UUIDs.
# - DATA_TYPE: external_identity_mapping#1.0.0
#   command: [/usr/local/sbin/skyfn-map-identity, --site, example]
"""


def template_text(name: str) -> str:
    return f"""\
{{# The config of each user's agent on multi-user endpoint "{name}": an ordinary endpoint
   config.yaml (skyfn-endpoint configure NAME shows every key), rendered for each task from the
   user's variables (Executor(user_config={{"partition": "debug", "nodes": 2}})) after they pass
   user_config_schema.json. Sandboxed Jinja2 with strict undefined: a variable the user may omit
   needs `| default(...)`. Every {{{{ value }}}} is written as a quoted YAML scalar, so a value
   cannot add keys: write `key: {{{{ var }}}}`, never `key: "{{{{ var }}}}"`, and build strings in the
   expression: {{{{ "module load " ~ module }}}}. `account` (name, home, uid) is the mapped account. #}}
{{% if partition is defined %}}
provider: slurm
blocks:
  partition: {{{{ partition }}}}
  nodes_per_block: {{{{ nodes | default(1) }}}}
  workers_per_node: {{{{ workers | default(4) }}}}
  walltime: {{{{ walltime | default("01:00:00") }}}}
  min_blocks: 0
  max_blocks: 1
{{% else %}}
provider: local
workers: {{{{ workers | default(2) }}}}
{{% endif %}}
log_level: INFO
data:                      # the user's own Redis (started as the account, its password 0600): refs,
  default: redis           # get_redis_client(), and refs shared with other users of this endpoint
  redis:
    start: true
"""


def schema_text(name: str) -> str:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"user_config of multi-user endpoint {name}",
        "$comment": "The variables a user may set (Executor(user_config={...})); anything else is refused. "
                    "Strings are restricted by patterns: they are also what a scheduler will see.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "workers": {"type": "integer", "minimum": 1, "maximum": 64,
                        "description": "worker processes (per node on a scheduler)"},
            "partition": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$",
                          "description": "a Slurm partition: the user agent then runs its workers in Slurm jobs"},
            "nodes": {"type": "integer", "minimum": 1, "maximum": 16, "description": "nodes per Slurm job"},
            "walltime": {"type": "string", "pattern": "^[0-9]{1,3}:[0-5][0-9]:[0-5][0-9]$",
                         "description": "HH:MM:SS of each Slurm job"},
        },
    }
    return json.dumps(schema, indent=2) + "\n"


def environment_text(name: str) -> str:
    return f"""\
# The environment of every user agent process of multi-user endpoint "{name}".
# KEY=VALUE lines (a value may be quoted; nothing is expanded), # comments. Nothing of root's
# environment reaches user processes: HOME, USER, LOGNAME and PATH are set for each account
# (PATH may be set here, HOME, USER and LOGNAME may not), the rest comes only from this file.
LANG=C.UTF-8
# PATH=/opt/site/bin:/usr/local/bin:/usr/bin:/bin
# http_proxy=http://proxy.example.org:3128
"""
