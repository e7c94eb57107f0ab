"""The user config template: from a user's variables (`Executor(user_config={...})`) to the
config of that user's agent.

The administrator writes `user_config_template.yaml.j2` (Jinja2) and `user_config_schema.json`
(a JSON schema, any draft jsonschema 4.x knows; 2020-12 when it names none). For one task:

1. the user's variables are checked against the schema; a failure is a `UserConfigRefused`
   (a `TaskRefused`) naming the variable and the rule, e.g.
   "user_config.nodes: 0 is less than the minimum of 1";
2. the template is rendered in `jinja2.sandbox.SandboxedEnvironment` with the variables at
   the top level (and the reserved names the caller adds, e.g. `account`): attributes such
   as `__class__` raise SecurityError, reported as an unsafe template; `undefined` is
   StrictUndefined, so a variable the user did not give and the template gives no
   `default(...)` is an error naming it, never an empty string;
3. every `{{ expression }}` is written as a quoted YAML scalar (the environment's `finalize`,
   `yaml_scalar`: a double-quoted string with all but printable ASCII escaped, which YAML
   reads back as the same string; numbers, booleans, null, flow lists and mappings): a string can never
   end a line or open a key, so "debug\\nmax_workers: 999" stays one string. Write
   `partition: {{ partition }}` (not `"{{ partition }}"`), and build strings in the
   expression: `worker_init: {{ "module load " ~ module }}`. Literal text of the template is
   the administrator's and is left as written;
4. the result is parsed as YAML and must be a mapping.

Errors while rendering end the task: `UserConfigRefused` (the user's variables) and
`TemplateFailed` (the template: an unsafe attribute such as `{{ ''.__class__.__mro__ }}`,
a result that is not a YAML mapping), both `TaskRefused`.

`UserConfigTemplate.from_files(template, schema)` loads both (errors name the file and the
fix: `ConfigError`); `.render(user, variables)` returns a `RenderedConfig`: the config (a
dict) and `digest`, a SHA-256 of the canonical JSON of (user, config) that keys user agents
(two tasks of one user with the same rendered config share an agent). Variables are data
and are never rendered as a template themselves.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import jinja2
import jsonschema
import yaml
from jinja2.sandbox import SandboxedEnvironment

from endpoint_agent import yaml_text
from endpoint_agent.errors import ConfigError
from endpoint_agent.multiuser.errors import TaskRefused

ROOT_NAME = "user_config"


class UserConfigRefused(TaskRefused):
    """The user's variables fail the schema, or cannot be rendered; the message says which and why."""


class TemplateFailed(TaskRefused):
    """The administrator's template failed while rendering for a task (an unsafe attribute the
    sandbox refused, an error of its own, a result that is not a YAML mapping): the task ends
    FAILED with this reason, and the administrator has a template to fix."""


@dataclass(frozen=True)
class RenderedConfig:
    user: str
    config: dict
    digest: str  # hex SHA-256 of the canonical JSON of {"user": ..., "config": ...}


def yaml_scalar(value: Any) -> str:
    """One value as a YAML flow node that reads back as the same value: a double-quoted string
    with everything outside printable ASCII escaped (\\uXXXX, \\UXXXXXXXX: YAML folds raw
    line breaks such as U+0085 and refuses some raw control characters), a number,
    true/false/null, or [...] / {...} of those."""
    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined (and the sandbox's unsafe attributes) raise here
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{value!r} cannot be written into the config")
        return repr(value)
    if isinstance(value, str):
        return _quoted(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_quoted(str(k))}: {yaml_scalar(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_scalar(v) for v in value) + "]"
    raise TypeError(f"a value of type {type(value).__name__} cannot be written into the config ({value!r})")


def _quoted(text: str) -> str:
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _environment() -> SandboxedEnvironment:
    env = SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False, finalize=yaml_scalar,
                               keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["yaml"] = yaml_scalar  # explicit spelling of what every {{ }} does anyway
    return env


def config_digest(user: str, config: Mapping[str, Any]) -> str:
    canonical = json.dumps({"user": user, "config": config}, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def variable_path(path: Any) -> str:
    out = ROOT_NAME
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


class UserConfigTemplate:
    """An administrator's template and schema, checked at load; `render` per task."""

    def __init__(self, template: str, schema: Optional[Mapping[str, Any]] = None, *,
                 source: str = "user config template", schema_source: str = "user config schema"):
        self.source = source
        self.schema_source = schema_source
        self._env = _environment()
        try:
            self._template = self._env.from_string(template)
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(f"{source} line {exc.lineno}: not a valid Jinja2 template: {exc.message}") from None
        self._validator = None
        if schema is not None:
            if not isinstance(schema, Mapping):
                raise ConfigError(f"{schema_source}: a JSON schema is an object, got {type(schema).__name__}")
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            try:
                cls.check_schema(schema)
            except jsonschema.SchemaError as exc:
                where = "/".join(str(p) for p in exc.path) or "(top)"
                raise ConfigError(f"{schema_source}: not a valid JSON schema at {where}: {exc.message}") from None
            self._validator = cls(schema, format_checker=cls.FORMAT_CHECKER)

    @classmethod
    def from_files(cls, template_path: Path, schema_path: Optional[Path]) -> "UserConfigTemplate":
        template_path = Path(template_path)
        try:
            text = template_path.read_text()
        except FileNotFoundError:
            raise ConfigError(f"user config template {template_path} does not exist: create it (`skyfn-endpoint "
                              "configure --multi-user NAME` writes an example) or change user_config_template") \
                from None
        schema = None
        if schema_path is not None:
            schema_path = Path(schema_path)
            try:
                schema = json.loads(schema_path.read_text())
            except FileNotFoundError:
                raise ConfigError(f"user config schema {schema_path} does not exist: create it (`skyfn-endpoint "
                                  "configure --multi-user NAME` writes an example) or change "
                                  "user_config_schema") from None
            except json.JSONDecodeError as exc:
                raise ConfigError(f"user config schema {schema_path} line {exc.lineno}, column {exc.colno}: not "
                                  f"valid JSON: {exc.msg}") from None
        return cls(text, schema, source=str(template_path), schema_source=str(schema_path))

    def validate(self, variables: Any) -> None:
        """UserConfigRefused naming each failing variable and rule (the first few)."""
        if not isinstance(variables, Mapping) or not all(isinstance(k, str) for k in variables):
            raise UserConfigRefused(f"{ROOT_NAME} must be a mapping of variable names to values, got "
                                    f"{type(variables).__name__}")
        if self._validator is None:
            return
        errors = sorted(self._validator.iter_errors(dict(variables)),
                        key=lambda e: (list(map(str, e.absolute_path)), e.validator))
        if errors:
            shown = [f"{variable_path(e.absolute_path)}: {e.message}" for e in errors[:5]]
            more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
            raise UserConfigRefused("; ".join(shown) + more)

    def render(self, user: str, variables: Optional[Mapping[str, Any]] = None,
               reserved: Optional[Mapping[str, Any]] = None) -> RenderedConfig:
        """The config of `user`'s agent for these variables. `reserved`: names the template may read
        that a user variable may not take (e.g. {"account": {"name": ..., "home": ...}})."""
        variables = {} if variables is None else variables
        if isinstance(variables, Mapping):
            taken = sorted(set(variables) & set(reserved or {}))
            if taken:
                raise UserConfigRefused(f"{variable_path([taken[0]])}: the name {taken[0]!r} is reserved by the "
                                        "endpoint")
        self.validate(variables)
        variables = dict(variables)
        try:
            json.dumps(variables, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise UserConfigRefused(f"{ROOT_NAME}: values must be JSON data (strings, numbers, booleans, null, "
                                    f"lists, mappings): {exc}") from None
        context = {**variables, **(reserved or {})}
        try:
            text = self._template.render(context)
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateFailed(f"{self.source}: unsafe template, refused by the sandbox: {exc}") from None
        except jinja2.UndefinedError as exc:
            raise UserConfigRefused(f"{self.source} needs a variable the task did not give: {exc.message} (give it "
                                    f"in {ROOT_NAME}, or the template gives it a default(...))") from None
        except jinja2.TemplateError as exc:
            raise TemplateFailed(f"{self.source}: the template failed: {exc}") from None
        except (TypeError, ValueError) as exc:
            raise UserConfigRefused(f"{self.source}: {exc}") from None
        try:
            config = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise TemplateFailed(f"{self.source}: the rendered config is not valid YAML"
                                 f"{yaml_text.where(exc, ' (rendered line {line})')}: {yaml_text.problem(exc)}; "
                                 "values are written as quoted scalars, so write `key: {{ var }}`, not "
                                 "`key: \"{{ var }}\"`") from None
        if not isinstance(config, dict):
            raise TemplateFailed(f"{self.source}: the rendered config must be a mapping of keys to values, got "
                              f"{type(config).__name__}")
        return RenderedConfig(user=user, config=config, digest=config_digest(user, config))
