"""Mapping the identity that submitted a task to a local POSIX account.

The service carries the submitting identity with each task: `id`, `username`, `email`,
`identity_provider` (the fields Globus Auth identities have and the mapping rules read).
The rules are the `globus-identity-mapping` library's (PyPI 0.6.0), the ones Globus Connect
Server and Globus Compute's multi-user endpoints use, in a document of the administrator's
(JSON, or YAML so that it may carry comments): a list of mapper documents, tried in order,
the first account found wins::

    - DATA_TYPE: expression_identity_mapping#1.0.0
      mappings:
        - {source: "{email}", match: "(.*)@example\\.org", output: "{0}"}
    - DATA_TYPE: external_identity_mapping#1.0.0
      command: [/usr/local/sbin/skyfn-map-identity, --site, example]

An expression rule interpolates identity fields into `source`, matches it whole against
`match` (the library's reduced regex: . ? * | ( ) and backslash escapes; `ignore_case`,
`literal`), and gives `output` with `{0}`, `{1}` ... for the groups. Each rule is its own
`ExpressionIdentityMapping` here, so that a rule naming a field this identity does not carry
(no email) is skipped rather than ending the whole list, which is what one mapper of many
rules does in the library. An external mapper is the library's `ExternalIdentityMapping`:
the admin's program gets `-c skyfn-endpoint -s <endpoint name>` and a JSON document of
the identity on stdin (DATA_TYPE identity_mapping_input#1.0.0) and answers on stdout
(identity_mapping_output#1.0.0, results with the identity's id and the account); it runs
as the endpoint (root) with its environment, for at most 5 s (the library's limit). The
library parses the answer's `id` as a UUID, so external mappers need identities with UUID
ids (Globus identities have them); other ids get a reason saying so.

`IdentityMapper.from_file(path, endpoint)` loads and checks the document (errors name the
file, the document and rule, what is wrong and the fix: a `ConfigError`); unknown DATA_TYPEs
are an error here (the library's loader only logs and skips them). `mapper.map(identity)`
gives a `MappingOutcome`: the account name, or the reason there is none naming the identity
and the endpoint; `outcome.account_or_raise()` raises `IdentityNotMapped` (a `TaskRefused`).
The outcome is a name only: `accounts.lookup_account` decides whether it may be used.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from globus_identity_mapping import ExpressionIdentityMapping, ExternalIdentityMapping
from globus_identity_mapping.errors import IdentityMappingError, InvalidMappingError

from endpoint_agent import yaml_text
from endpoint_agent.errors import ConfigError
from endpoint_agent.multiuser.accounts import check_account_name, check_admin_file
from endpoint_agent.multiuser.errors import TaskRefused

CONNECTOR = "skyfn-endpoint"  # the connector id mappers are given (`-c` of an external program)
FIELDS = ("id", "username", "email", "identity_provider")
EXPRESSION = ExpressionIdentityMapping.DATA_TYPE  # expression_identity_mapping#1.0.0
EXTERNAL = ExternalIdentityMapping.DATA_TYPE  # external_identity_mapping#1.0.0
RULE_KEYS = ("source", "match", "output", "ignore_case", "literal")
_REF_RE = re.compile(r"(?<!\\)(?:\\\\)*\{([^}]*)\}")  # the library's interpolation syntax


class IdentityNotMapped(TaskRefused):
    """The submitting identity maps to no account on this endpoint; the message says which and why."""


def identity_claims(identity: Mapping[str, Any]) -> dict[str, str]:
    """The identity's fields the rules may read (strings only; absent or empty ones left out)."""
    if not isinstance(identity, Mapping):
        raise IdentityNotMapped(f"the submitting identity is not a mapping of claims: {identity!r}")
    if not isinstance(identity.get("id"), str) or not identity["id"]:
        raise IdentityNotMapped(f"the submitting identity has no id: {dict(identity)!r}")
    return {k: identity[k] for k in FIELDS if isinstance(identity.get(k), str) and identity[k]}


def describe_identity(identity: Mapping[str, Any]) -> str:
    name = identity.get("username") or identity.get("email")
    return f"{name} (id {identity.get('id')})" if name else f"id {identity.get('id')}"


@dataclass(frozen=True)
class MappingOutcome:
    """The account of an identity, or why there is none."""

    identity: Mapping[str, Any]
    endpoint: str
    account: Optional[str] = None
    reason: Optional[str] = None
    rule: Optional[str] = None  # which rule gave the account ("document 1 rule 2", "document 2 (external)")
    notes: tuple[str, ...] = field(default=())  # rules that could not apply, and why

    @property
    def ok(self) -> bool:
        return self.account is not None

    def account_or_raise(self) -> str:
        if self.account is None:
            raise IdentityNotMapped(self.reason or "not mapped")
        return self.account


@dataclass
class _Rule:
    label: str
    mapper: Any  # ExpressionIdentityMapping | ExternalIdentityMapping
    fields: tuple[str, ...]  # identity fields an expression rule reads (source and output)
    external: bool = False


class IdentityMapper:
    """The administrator's mapping rules for one endpoint, loaded and checked."""

    def __init__(self, documents: Any, endpoint: str, source: str = "identity mapping"):
        self.endpoint = endpoint
        self.source = source
        self.rules = _build_rules(documents, endpoint, source)

    @classmethod
    def from_file(cls, path: Path, endpoint: str) -> "IdentityMapper":
        return cls(load_mapping_document(path), endpoint, source=str(path))

    def map(self, identity: Mapping[str, Any]) -> MappingOutcome:
        """The first account a rule gives for `identity`, or the reason there is none."""
        who = describe_identity(identity) if isinstance(identity, Mapping) else repr(identity)
        try:
            claims = identity_claims(identity)
        except IdentityNotMapped as exc:
            return MappingOutcome(identity=identity if isinstance(identity, Mapping) else {}, endpoint=self.endpoint,
                                  reason=f"{exc} (endpoint {self.endpoint})")
        notes: list[str] = []
        for rule in self.rules:
            missing = [f for f in rule.fields if f not in claims]
            if missing:
                notes.append(f"{rule.label} reads {', '.join(missing)}, which this identity does not carry")
                continue
            if rule.external and not _is_canonical_uuid(claims["id"]):
                notes.append(f"{rule.label} (an external program) needs a UUID identity id, not {claims['id']!r}")
                continue
            try:
                account = rule.mapper.map_identity(claims)
            except (IdentityMappingError, InvalidMappingError, subprocess.TimeoutExpired, OSError) as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                notes.append(f"{rule.label} failed: {first}")
                continue
            if not account:
                continue
            problem = check_account_name(account)
            if problem:
                return MappingOutcome(identity=identity, endpoint=self.endpoint, rule=rule.label, notes=tuple(notes),
                                      reason=f"identity {who} maps to no usable account on endpoint {self.endpoint}: "
                                             f"{rule.label} of {self.source} gave {problem}")
            return MappingOutcome(identity=identity, endpoint=self.endpoint, account=account, rule=rule.label,
                                  notes=tuple(notes))
        reason = f"identity {who} maps to no local account on endpoint {self.endpoint}: no rule of {self.source} " \
                 "matched"
        if notes:
            reason += " (" + "; ".join(notes) + ")"
        return MappingOutcome(identity=identity, endpoint=self.endpoint, reason=reason, notes=tuple(notes))


def _is_canonical_uuid(value: str) -> bool:
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


# --- the document ---------------------------------------------------------------------

def load_mapping_document(path: Path) -> list[dict]:
    """The mapper documents of a file (.json: JSON; otherwise YAML), as a list."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"identity mapping file {path} does not exist: create it (`skyfn-endpoint configure "
                          "--multi-user NAME` writes an example) or change identity_mapping_file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"identity mapping file {path} cannot be read: {exc}") from None
    check_admin_file(path, "identity mapping file")
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"identity mapping file {path} line {exc.lineno}, column {exc.colno}: not valid "
                              f"JSON: {exc.msg}") from None
    else:
        data = yaml_text.load(text, f"identity mapping file {path}")
    return _as_documents(data, str(path))


def _as_documents(data: Any, source: str) -> list[dict]:
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not data:
        raise ConfigError(f"identity mapping file {source}: expected a list of mapping documents (each with a "
                          f"DATA_TYPE of {EXPRESSION} or {EXTERNAL}), got {_kind(data)}")
    return data


def _kind(value: Any) -> str:
    if value is None or value == [] or value == {}:
        return "nothing"
    return type(value).__name__


def _build_rules(documents: Any, endpoint: str, source: str) -> list[_Rule]:
    documents = _as_documents(documents, source)
    rules: list[_Rule] = []
    for d_index, doc in enumerate(documents, start=1):
        where = f"identity mapping file {source}, document {d_index}"
        if not isinstance(doc, dict):
            raise ConfigError(f"{where}: expected a mapping with DATA_TYPE, got {_kind(doc)}")
        data_type = doc.get("DATA_TYPE")
        if data_type == EXPRESSION:
            rules.extend(_expression_rules(doc, d_index, where, endpoint))
        elif data_type == EXTERNAL:
            rules.append(_external_rule(doc, d_index, where, endpoint))
        else:
            raise ConfigError(f"{where}: DATA_TYPE {data_type!r} is not one this endpoint knows; use "
                              f"{EXPRESSION} (rules over {', '.join(FIELDS)}) or {EXTERNAL} (an admin's program)")
    return rules


def _expression_rules(doc: dict, d_index: int, where: str, endpoint: str) -> list[_Rule]:
    unknown = sorted(set(doc) - {"DATA_TYPE", "mappings"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; an expression document has DATA_TYPE "
                          "and mappings")
    mappings = doc.get("mappings")
    if not isinstance(mappings, list) or not mappings:
        raise ConfigError(f"{where}: `mappings` must be a non-empty list of rules "
                          "({source: \"{email}\", match: \"(.*)@example\\\\.org\", output: \"{0}\"})")
    out = []
    for r_index, rule in enumerate(mappings, start=1):
        at = f"{where}, rule {r_index}"
        if not isinstance(rule, dict):
            raise ConfigError(f"{at}: expected a mapping with source, match and output, got {_kind(rule)}")
        unknown = sorted(set(rule) - set(RULE_KEYS))
        if unknown:
            raise ConfigError(f"{at}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(RULE_KEYS)}")
        for key in ("source", "match", "output"):
            if not isinstance(rule.get(key), str) or not rule[key]:
                raise ConfigError(f"{at}: `{key}` must be a non-empty string, got {rule.get(key)!r}")
        for key in ("ignore_case", "literal"):
            if key in rule and not isinstance(rule[key], bool):
                raise ConfigError(f"{at}: `{key}` must be true or false, got {rule[key]!r}")
        fields = []
        for key in ("source", "output"):
            for ref in _REF_RE.findall(rule[key]):
                if key == "output" and ref.isdigit():
                    continue
                if ref not in FIELDS:
                    raise ConfigError(f"{at}: `{key}` {rule[key]!r} names {{{ref}}}; the identity's fields are "
                                      f"{', '.join(FIELDS)}" + (" (and {0}, {1}... for match groups)"
                                                                 if key == "output" else ""))
                fields.append(ref)
        try:
            mapper = ExpressionIdentityMapping.from_mapping_document(
                {"DATA_TYPE": EXPRESSION, "mappings": [rule]}, connector=CONNECTOR, storage_gateway=endpoint)
        except (InvalidMappingError, ValueError) as exc:
            raise ConfigError(f"{at}: `match` {rule['match']!r} is not a valid expression: {_msg(exc)} (the "
                              "language: . ? * | ( ) and backslash escapes; no leading * or ?)") from None
        out.append(_Rule(label=f"document {d_index} rule {r_index}", mapper=mapper,
                         fields=tuple(dict.fromkeys(fields))))
    return out


def _external_rule(doc: dict, d_index: int, where: str, endpoint: str) -> _Rule:
    unknown = sorted(set(doc) - {"DATA_TYPE", "command"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; an external document has DATA_TYPE and "
                          "command")
    command = doc.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(a, (str, int, float)) for a in command):
        raise ConfigError(f"{where}: `command` must be a non-empty list: the program's absolute path, then its "
                          f"arguments (got {command!r})")
    program = Path(str(command[0]))
    if not program.is_absolute():
        raise ConfigError(f"{where}: the program {program} must be an absolute path (it runs as root, with no "
                          "PATH search)")
    if not program.is_file() or not _executable(program):
        raise ConfigError(f"{where}: the program {program} does not exist or is not executable: chmod 755 it")
    check_admin_file(program, f"{where}: the mapping program")
    mapper = ExternalIdentityMapping.from_mapping_document(doc, connector=CONNECTOR, storage_gateway=endpoint)
    return _Rule(label=f"document {d_index} (external program {program})", mapper=mapper, fields=("id",),
                 external=True)


def _executable(path: Path) -> bool:
    return os.access(path, os.X_OK)


def _msg(exc: Exception) -> str:
    # InvalidMappingError("Invalid mapping {}: {}", match, error) keeps its arguments unformatted
    if len(exc.args) == 3 and isinstance(exc.args[0], str) and "{}" in exc.args[0]:
        return exc.args[0].format(*exc.args[1:])
    return str(exc)
